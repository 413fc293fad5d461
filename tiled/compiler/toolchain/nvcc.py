"""CUDA C++ -> cubin: nvcc (the default) or NVRTC (pip `nvidia-cuda-nvrtc` via cuda-bindings)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tiled import config
from tiled.errors import ToolchainError

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "targets" / "cuda" / "include"


def _gencode(arch: str) -> str:
    num = arch.removeprefix("sm_")
    return f"arch=compute_{num},code=sm_{num}"


def which_compiler(choice: str | None = None) -> str:
    choice = choice or config.get("cuda_compiler")
    if choice == "auto":
        return "nvcc" if shutil.which(config.get("nvcc")) else "nvrtc"
    if choice not in ("nvcc", "nvrtc"):
        raise ToolchainError(f"TILED_CUDA_COMPILER must be nvcc, nvrtc or auto, not {choice!r}")
    return choice


def compile_cubin(source: str, arch: str, choice: str | None = None) -> bytes:
    """Compiles one translation unit to a cubin for `arch`. Raises ToolchainError with the
    compiler's output on failure."""
    if which_compiler(choice) == "nvrtc":
        return _nvrtc(source, arch)
    nvcc = config.get("nvcc")
    # Under the caller's temp dir (a compile worker's job directory); nvcc's own tmpxft* files
    # go here too (TMPDIR), so they are removed with it even when nvcc is killed mid-way.
    with tempfile.TemporaryDirectory(prefix="tiled-nvcc-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source)
        cmd = [nvcc, "-cubin", "-O3", "-std=c++17", "-w", f"-gencode={_gencode(arch)}",
               "-I", str(INCLUDE_DIR), "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "TMPDIR": tmp})
        except FileNotFoundError:
            raise ToolchainError(f"nvcc not found ({nvcc}); install the CUDA toolkit or set "
                                 "TILED_CUDA_COMPILER=nvrtc") from None
        if proc.returncode != 0:
            if config.get("keep_sources"):
                keep = Path(config.get("cache_dir")) / "failed.cu"
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_text(source)
            raise ToolchainError(f"nvcc failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return out.read_bytes()


def _nvrtc(source: str, arch: str) -> bytes:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise ToolchainError("NVRTC needs cuda-bindings and nvidia-cuda-nvrtc (pip); or install "
                             "nvcc") from None
    num = arch.removeprefix("sm_")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    opts = [f"--gpu-architecture=sm_{num}".encode(), b"-std=c++17", b"-default-device",
            f"-I{INCLUDE_DIR}".encode()]
    # NVRTC has its own copy of the fp16 / bf16 headers but not libcu++ (CUDA 13 keeps it
    # under include/cccl): point it at a toolkit's headers when there is one.
    nvcc = shutil.which(config.get("nvcc"))
    homes = [Path(nvcc).resolve().parent.parent] if nvcc else []
    homes.append(Path("/usr/local/cuda"))
    for home in homes:
        for inc in (home / "include", home / "include" / "cccl"):
            if inc.is_dir():
                opts.append(f"-I{inc}".encode())
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise ToolchainError(f"NVRTC failed: {log.decode(errors='replace')[-4000:]}")
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    return bytes(cubin)


def nvcc_version() -> str:
    try:
        out = subprocess.run([config.get("nvcc"), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return "none"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"
