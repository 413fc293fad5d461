"""The C compiler driver for CPU kernels: links a TVM LLVM object and the runtime shim
(tiled/compiler/targets/cpu/shim.c) into a self-contained shared library that
`tiled.runtime.cpu` loads without TVM.

The shim object is compiled once per (shim source, compiler, flags) and cached under
`<cache_dir>/shim/`, published by an atomic rename, so concurrent processes may race safely:
each writes its own temporary file and the last rename wins with identical bytes.
All functions may raise ToolchainError carrying the tool's output. Thread-safe.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tiled import config
from tiled.errors import ToolchainError

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "targets" / "cpu" / "shim.c"
SHIM_FLAGS = ("-std=gnu11", "-O2", "-fPIC", "-pthread", "-fvisibility=hidden")
# -Bsymbolic: the kernel's references to its own exported symbols bind inside the library.
LINK_FLAGS = ("-shared", "-fPIC", "-O2", "-pthread", "-Wl,-Bsymbolic")


def _run(argv: list[str], what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as e:
        raise ToolchainError(f"{what}: cannot run {argv[0]!r}: {e}") from None
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{out}")
    return out


def _cc() -> str:
    cc = config.get("cc")
    path = shutil.which(cc)
    if path is None:
        raise ToolchainError(f"C compiler {cc!r} not found on PATH (set TILED_CC)")
    return path


@functools.lru_cache(maxsize=8)
def _version_of(cc_path: str, mtime_ns: int) -> str:
    del mtime_ns  # part of the cache key only: a replaced compiler is asked again
    return _run([cc_path, "--version"], "querying the C compiler version").splitlines()[0]


def cc_version() -> str:
    """The first line of `<cc> --version` for the configured C compiler (TILED_CC)."""
    cc = _cc()
    return _version_of(cc, os.stat(cc).st_mtime_ns)


def shim_digest() -> str:
    """sha256 over the shim source, the compiler version and the flags: part of the toolchain
    digest, since it changes what a CPU artifact contains."""
    h = hashlib.sha256(SHIM_SOURCE.read_bytes())
    h.update(b"\0" + cc_version().encode() + b"\0" + " ".join(SHIM_FLAGS + LINK_FLAGS).encode())
    return h.hexdigest()


def shim_object() -> Path:
    """Path of the compiled shim for the configured compiler, compiling it on first use."""
    cc = _cc()
    shim_dir = Path(config.get("cache_dir")) / "shim"
    path = shim_dir / f"cpu_shim-{shim_digest()[:32]}.o"
    if path.is_file():
        return path
    shim_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".cpu_shim-", suffix=".o", dir=shim_dir)
    os.close(fd)
    try:
        _run([cc, *SHIM_FLAGS, "-c", str(SHIM_SOURCE), "-o", tmp], "compiling the CPU shim")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def link_cpu_library(object_path: str | os.PathLike, out_path: str | os.PathLike) -> None:
    """Links the TVM object at `object_path` with the shim into the shared library `out_path`
    (written atomically: a reader never sees a half-written library)."""
    obj = Path(object_path)
    if not obj.is_file():
        raise ToolchainError(f"linking CPU kernel: object {obj} does not exist")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        _run([_cc(), *LINK_FLAGS, str(obj), str(shim_object()), "-o", tmp],
             "linking the CPU kernel")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
