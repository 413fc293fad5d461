"""External tools the compiler drives: the C compiler that links CPU kernels (`cc`)."""

from tiled.compiler.toolchain.cc import cc_version, link_cpu_library, shim_digest

__all__ = ["cc_version", "link_cpu_library", "shim_digest"]
