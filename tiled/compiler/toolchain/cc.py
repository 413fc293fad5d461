"""The C compiler driver for CPU kernels: links a TVM LLVM object and the runtime shim
(tiled/compiler/targets/cpu/shim.c: runtime services; gemm.c: T.gemm's microkernel) into a
self-contained shared library that `tiled.runtime.cpu` loads without TVM.

The shim's objects are compiled once per (sources, compiler, flags, target level's flags) and
cached under `<cache_dir>/shim/` (a process that moves to another cache directory writes the
bytes it compiled there), published by an atomic rename, so concurrent processes may race
safely: each writes its own temporary file and the last rename wins with identical bytes.
All functions may raise ToolchainError carrying the tool's output. Thread-safe.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from tiled import config
from tiled.errors import ToolchainError

_CPU_DIR = Path(__file__).resolve().parent.parent / "targets" / "cpu"
SHIM_SOURCES = (_CPU_DIR / "shim.c", _CPU_DIR / "gemm.c")
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
    """sha256 over the shim sources, the compiler version and the flags: part of the toolchain
    digest, since it changes what a CPU artifact contains. (A target level's own flags come
    from tiled/compiler/targets/cpu/levels.py, which the source digest covers.)"""
    h = hashlib.sha256()
    for src in SHIM_SOURCES:
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    h.update(cc_version().encode() + b"\0" + " ".join(SHIM_FLAGS + LINK_FLAGS).encode())
    return h.hexdigest()


# Objects this process compiled, by file name (which holds the tag): a cache directory that
# lacks one gets these bytes instead of a second compile (a process may compile under several
# cache directories, as the test suite does, one per test).
_COMPILED: dict[str, bytes] = {}
_COMPILED_LOCK = threading.Lock()


def shim_objects(level_flags: tuple[str, ...] = ()) -> list[Path]:
    """Paths of the compiled shim objects for the configured compiler and a target level's
    flags (`-march=...`), compiling them on first use in this process."""
    cc = _cc()
    shim_dir = Path(config.get("cache_dir")) / "shim"
    tag = hashlib.sha256((shim_digest() + "\0" + " ".join(level_flags)).encode()).hexdigest()
    out = []
    for src in SHIM_SOURCES:
        path = shim_dir / f"cpu_{src.stem}-{tag[:32]}.o"
        out.append(path)
        if path.is_file():
            continue
        shim_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".cpu_{src.stem}-", suffix=".o", dir=shim_dir)
        os.close(fd)
        try:
            with _COMPILED_LOCK:
                data = _COMPILED.get(path.name)
            if data is None:
                _run([cc, *SHIM_FLAGS, *level_flags, "-c", str(src), "-o", tmp],
                     f"compiling the CPU shim ({src.name})")
                with _COMPILED_LOCK:
                    _COMPILED[path.name] = Path(tmp).read_bytes()
            else:
                Path(tmp).write_bytes(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


def link_cpu_library(object_path: str | os.PathLike, out_path: str | os.PathLike,
                     level_flags: tuple[str, ...] = ()) -> None:
    """Links the TVM object at `object_path` with the shim built with `level_flags` into the
    shared library `out_path` (written atomically: a reader never sees a half-written
    library)."""
    obj = Path(object_path)
    if not obj.is_file():
        raise ToolchainError(f"linking CPU kernel: object {obj} does not exist")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        _run([_cc(), *LINK_FLAGS, str(obj), *map(str, shim_objects(level_flags)), "-o", tmp],
             "linking the CPU kernel")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
