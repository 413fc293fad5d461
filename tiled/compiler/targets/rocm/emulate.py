"""Runs a ROCm kernel on the CPU: `tiled.compile(k, target="rocm:gfx942").emulate(*arrays)`.

No AMD GPU is needed: the kernel's HIP source (kept in its code object, toolchain/hip.py) is
built as host C++ with include/tiled_hip_cpu.h in place of the AMDGPU layer (fibers for the
threads of a block, real barriers, wave64 lane exchanges, an LDS arena poisoned per block,
reference MFMA over AMD's register layouts), plus a small driver, by TILED_CLANG in g++ mode.
The program runs in a child process on a file holding the arguments, each tensor between
red zones: a crash, a deadlock or a write outside a tensor is an EmulationError, never a
crash of the caller. Tensors are written back in place, as a launch would.

Executables are cached under <cache_dir>/rocm-emulator/, keyed by the source, the arch, the
headers and the compiler's version. Emulation is slow (every barrier and lane exchange is a
context switch): it is for checking numerics at small shapes.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from tiled import config
from tiled.compiler.emulation import REDZONE, ArgumentFile, bind_launch, np_dtype
from tiled.errors import EmulationError, LaunchError, ToolchainError
from tiled.runtime.manifest import Manifest

EMULATION_FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-fno-exceptions", "-w",
                   "-ffp-contract=fast", "-fexcess-precision=16")
_POOL = re.compile(r"TILED_LDS_POOL\(\w+, (\d+)\)")
_SIGNATURE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)'
                        r"\s*\{")


def launcher(source: str, symbol: str) -> str:
    """The driver appended to a kernel's HIP source: main() maps the argument file and calls
    the kernel with each parameter cast from its slot (tiled_hip_cpu.h, tiled::emu::main)."""
    m = next((m for m in _SIGNATURE.finditer(source) if m.group(1) == symbol), None)
    if m is None:
        raise EmulationError(f"the kernel source has no definition of {symbol}")
    params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    casts = []
    for i, decl in enumerate(params):
        ctype = " ".join(w for w in decl.split()[:-1] if w != "__restrict__")
        casts.append(f"({ctype})a[{i}]" if ctype.endswith("*") else f"*({ctype}*)a[{i}]")
    return (f"\nstatic void tiled_emu_launch(void** a) {{\n  (void)a;\n"
            f"  tiled_kernel::{symbol}({', '.join(casts)});\n}}\n\n"
            f"int main(int argc, char** argv) {{\n"
            f"  return ::tiled::emu::main(argc, argv, tiled_emu_launch, {len(params)});\n}}\n")


def emulator(source: str, symbol: str, arch: str) -> Path:
    """The path of the emulation executable of `source` (built, or found in the cache)."""
    from tiled.compiler.toolchain import hip

    clang = hip.tool("clang")
    text = source + launcher(source, symbol)
    key = hashlib.sha256("\0".join([text, arch, hip.headers_digest(), hip.tool_version("clang"),
                                    *EMULATION_FLAGS]).encode()).hexdigest()
    cache = Path(config.get("cache_dir")) / "rocm-emulator"
    exe = cache / key[:40]
    if exe.is_file():
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiled-emu-", dir=cache) as tmp:
        src, out = Path(tmp, "kernel.cc"), Path(tmp, "emulator")
        src.write_text(text)
        argv = [clang, "--driver-mode=g++", *EMULATION_FLAGS, f"-D__{arch}__",
                f"-I{hip.INCLUDE}", str(src), "-o", str(out)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise ToolchainError(f"building the CPU emulation of {symbol} failed: "
                                 f"{' '.join(argv)}\n{(proc.stdout + proc.stderr).strip()}")
        os.replace(out, exe)  # atomic: a racing build publishes the same program
    return exe


def _arguments(manifest: Manifest, bound, arrays: list) -> tuple[ArgumentFile, list[str]]:
    """The argument file and the driver's argument tokens, one per kernel argument."""
    args, tokens = ArgumentFile(), []
    for ka in manifest.kernel_args:
        if ka.kind == "tensor":
            tokens.append(args.tensor(arrays[ka.param]))
            continue
        if ka.kind == "scalar":
            p = manifest.params[ka.param]
            value = np.array(bound.values[ka.param]).astype(np_dtype(p.dtype)).tobytes()
        elif ka.kind == "dim":
            value = np.array(bound.dims[ka.name], dtype=ka.dtype).tobytes()
        else:
            raise LaunchError(f"{manifest.name}: a {ka.kind} argument has no emulation")
        tokens.append(args.value(value))
    return args, tokens


def emulate(artifact: bytes, manifest: Manifest, args, source: str | None = None,
            timeout_s: float = 600.0) -> None:
    """Runs the kernel on numpy arrays (and Python scalars) on the CPU, writing the tensors
    back in place. Raises LaunchError for arguments the manifest refuses, EmulationError when
    the kernel deadlocks, writes outside a tensor, crashes or runs past `timeout_s`,
    ToolchainError when the emulation cannot be built."""
    from tiled.compiler.targets.rocm.codeobject import read_code_object
    from tiled.compiler.toolchain.hip import SOURCE_SECTION

    arrays, bound, grid, block = bind_launch(manifest, "rocm", args)
    if source is None:
        source = read_code_object(artifact).section_text(SOURCE_SECTION)
    exe = emulator(source, manifest.symbol, manifest.arch)
    args, tokens = _arguments(manifest, bound, arrays)
    pool = _POOL.search(source)
    lds = int(pool.group(1)) if pool else 0
    args.run([str(exe)], [*map(str, grid), *map(str, block), str(lds), str(REDZONE), *tokens],
             f"{manifest.name} on {manifest.target}", timeout_s)
