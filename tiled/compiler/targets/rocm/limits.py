"""What a ROCm workgroup may use (no TVM here: the backend, which the daemon imports to parse
targets, and the lowering both read it)."""

MAX_LDS = 64 * 1024  # bytes of LDS one workgroup may allocate on gfx90a and gfx942
