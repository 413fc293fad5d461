"""HIP C++ to an AMDGPU code object with LLVM 22 (no ROCm install): clang compiles the
kernel's HIP source for one gfx arch to LLVM bitcode (device only, without ROCm's headers or
device libraries), clang turns it into a relocatable object at code object version 5 (which
ROCm 5.x and 6.x load), and ld.lld links the HSACO with --no-undefined, so a call nothing
defines (a math function of ROCm's device library) fails here, not at load time on a GPU.
The kernel's source is kept in the HSACO as a non-allocated section (SOURCE_SECTION; GPU
loaders skip it), from which the CPU emulation rebuilds the kernel wherever the artifact is.

The tools are TILED_CLANG, TILED_LLD and TILED_LLVM_OBJCOPY (default the `-22` names Debian
installs: `apt-get install clang-22 lld-22 llvm-22`). All functions may raise ToolchainError
with the tool's output. Thread-safe (each call works in its own temporary directory).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

from tiled import config
from tiled.errors import ToolchainError

INCLUDE = Path(__file__).resolve().parent.parent / "targets" / "rocm" / "include"
CODE_OBJECT_VERSION = 5
SOURCE_SECTION = ".tiled.hip_source"  # zlib-compressed HIP source of the kernel
DEVICE_FLAGS = ("-x", "hip", "-nogpuinc", "-nogpulib", "--cuda-device-only", "-O3",
                "-std=c++17", f"-mcode-object-version={CODE_OBJECT_VERSION}",
                "-fno-exceptions", "-Wno-unused-command-line-argument")


def _run(argv: list[str], what: str, cwd: str | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd,
                              timeout=600)
    except OSError as e:
        raise ToolchainError(f"{what}: cannot run {argv[0]!r}: {e}") from None
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what}: {argv[0]} ran for more than 600 s") from None
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{out}")
    return out


def tool(setting: str) -> str:
    """The resolved path of the tool TILED_<SETTING> names; ToolchainError when missing."""
    name = config.get(setting)
    path = shutil.which(name)
    if path is None:
        raise ToolchainError(f"{name!r} not found on PATH (set TILED_{setting.upper()}; "
                             "Debian: apt-get install clang-22 lld-22 llvm-22)")
    return path


@functools.lru_cache(maxsize=16)
def _version_of(path: str, mtime_ns: int) -> str:
    del mtime_ns  # part of the cache key only: a replaced tool is asked again
    out = _run([path, "--version"], f"querying {path}'s version")
    return next((line.strip() for line in out.splitlines() if "version" in line.lower()),
                out.splitlines()[0] if out else "unknown")


def tool_version(setting: str) -> str:
    """The version line of the tool TILED_<SETTING> names."""
    path = tool(setting)
    return _version_of(path, os.stat(path).st_mtime_ns)


def optional_tool_version(setting: str) -> str | None:
    """tool_version, or None when the tool is not on PATH (a backend that does without it)."""
    return tool_version(setting) if shutil.which(config.get(setting)) else None


def headers_digest() -> str:
    """sha256 over tiled's ROCm device headers (name, size, bytes, in name order)."""
    h = hashlib.sha256()
    for p in sorted(INCLUDE.glob("*.h")):
        data = p.read_bytes()
        h.update(f"{p.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def compile_hsaco(source: str, arch: str) -> bytes:
    """The HSACO (code object v5) of HIP `source` for `arch` ("gfx942", "gfx90a"), with the
    source in SOURCE_SECTION."""
    clang, lld, objcopy = tool("clang"), tool("lld"), tool("llvm_objcopy")
    with tempfile.TemporaryDirectory(prefix="tiled-rocm-") as tmp:
        src, bc, obj = Path(tmp, "kernel.hip"), Path(tmp, "kernel.bc"), Path(tmp, "kernel.o")
        linked, final = Path(tmp, "linked.hsaco"), Path(tmp, "kernel.hsaco")
        blob = Path(tmp, "source.z")
        src.write_text(source)
        _run([clang, *DEVICE_FLAGS, f"--offload-arch={arch}", f"-I{INCLUDE}", "-emit-llvm",
              "-c", str(src), "-o", str(bc)], f"clang (HIP, {arch})")
        _run([clang, "--target=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-nogpulib", "-O3",
              f"-mcode-object-version={CODE_OBJECT_VERSION}", "-c", str(bc), "-o", str(obj)],
             f"clang (code object, {arch})")
        _run([lld, "-shared", "--no-undefined", str(obj), "-o", str(linked)], "ld.lld")
        blob.write_bytes(zlib.compress(source.encode(), 9))
        _run([objcopy, f"--add-section={SOURCE_SECTION}={blob}",
              f"--set-section-flags={SOURCE_SECTION}=readonly", str(linked), str(final)],
             "llvm-objcopy")
        return final.read_bytes()


def disassemble(hsaco: bytes, arch: str) -> str:
    """llvm-objdump's disassembly of the code object's text (TILED_LLVM_OBJDUMP)."""
    objdump = tool("llvm_objdump")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(hsaco)
        f.flush()
        return _run([objdump, "-d", f"--mcpu={arch}", f.name], "llvm-objdump")
