"""What each CUDA arch the backend targets allows a kernel (no TVM here: the backend's
target parsing and the lowering both read it)."""

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
# Dynamic shared memory a block may use, bytes.
MAX_SMEM = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90a": 227 * 1024}
