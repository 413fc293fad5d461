"""Runs a Metal kernel on the CPU: `tiled.compile(k, target="metal").emulate(*arrays)`.

No Apple GPU is needed: the kernel's MSL (the artifact itself) is built as C++ over tiled's
CPU <metal_stdlib> (include/cpu/tiled_msl_cpu.h; toolchain/msl.cpu_text says the two
syntactic changes) and linked with the runtime (include/cpu/tiled_msl_runtime.cc: threads of
a threadgroup as fibers, barriers and simdgroup operations as the points they meet, poisoned
threadgroup memory, divergent and partial barriers reported), by TILED_CLANG. A small
launcher appended to the text binds the kernel's [[buffer(i)]] parameters and position
attributes. The program runs in a child process on a file holding the arguments
(tiled.compiler.emulation): a crash, a deadlock, a barrier error or a write outside a tensor
is an EmulationError. Tensors are written back in place, as a launch would.

Executables are cached under <cache_dir>/metal-emulator/ by the source, the headers and the
compiler's version; the runtime object is built once per runtime source. Emulation is slow
(every barrier and simdgroup operation switches every thread): use small shapes.
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
from tiled.errors import EmulationError, ToolchainError
from tiled.runtime.manifest import Manifest

FLAGS = ("-std=c++17", "-O1", "-fno-exceptions", "-w", "-ffp-contract=off")
RUNTIME = "tiled_msl_runtime.cc"
# The position attributes a kernel may take -> tiled_emu_position's `which`.
POSITIONS = {"thread_position_in_threadgroup": 0, "threadgroup_position_in_grid": 1,
             "threads_per_threadgroup": 2, "threadgroups_per_grid": 3,
             "thread_position_in_grid": 4}
_KERNEL = re.compile(r"^kernel void (\w+)\((.*?)\) \{", re.M | re.S)
_PARAM = re.compile(r"^\s*(.+?)\s*(\w+)\s*\[\[\s*(\w+)(?:\((\d+)\))?\s*\]\]$")


def launcher(source: str, symbol: str) -> str:
    """`tiled_emu_kernel(buffers)`, appended to the kernel's text: calls the kernel with each
    [[buffer(i)]] parameter from buffers[i] and each position from the runtime."""
    m = next((m for m in _KERNEL.finditer(source) if m.group(1) == symbol), None)
    if m is None:
        raise EmulationError(f"the MSL source has no kernel {symbol}")
    lines, args = [], []
    for i, decl in enumerate(p.strip() for p in m.group(2).split(",\n")):
        pm = _PARAM.match(decl)
        if pm is None:
            raise EmulationError(f"cannot read parameter {decl!r} of kernel {symbol}")
        ctype, attr, index = pm.group(1), pm.group(3), pm.group(4)
        if attr == "buffer":
            if ctype.endswith("&"):
                args.append(f"*({ctype[:-1].strip()}*)b[{index}]")
            else:
                args.append(f"({ctype})b[{index}]")
        elif attr in POSITIONS:
            lines.append(f"  unsigned p{i}[3];\n  tiled_emu_position({POSITIONS[attr]}, p{i});")
            lanes = ctype[-1] if ctype[-1] in "23" else ""
            args.append(f"({ctype})(p{i}[0])" if not lanes else
                        f"{ctype}({', '.join(f'p{i}[{d}]' for d in range(int(lanes)))})")
        else:
            raise EmulationError(f"kernel {symbol}: parameter attribute [[{attr}]] has no "
                                 "emulation")
    body = "\n".join(lines)
    return (f'\n\nextern "C" void tiled_emu_kernel(void** b) {{\n  (void)b;\n{body}\n'
            f"  {symbol}({', '.join(args)});\n}}\n")


def _build(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise ToolchainError(f"building {what} failed: {' '.join(argv)}\n"
                             f"{(proc.stdout + proc.stderr).strip()}")


def emulator(source: str, symbol: str) -> Path:
    """The path of the emulation executable of MSL `source` (built, or found in the cache)."""
    from tiled.compiler.toolchain import hip, msl

    clang = hip.tool("clang")
    version = hip.tool_version("clang")
    text = msl.cpu_text(source) + launcher(source, symbol)
    cache = Path(config.get("cache_dir")) / "metal-emulator"
    key = hashlib.sha256("\0".join([text, msl.headers_digest(), version, *FLAGS])
                         .encode()).hexdigest()
    exe = cache / key[:40]
    if exe.is_file():
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    runtime_src = msl.CPU_INCLUDE / RUNTIME
    rt_key = hashlib.sha256(runtime_src.read_bytes() + version.encode()).hexdigest()[:40]
    runtime = cache / f"runtime-{rt_key}.o"
    with tempfile.TemporaryDirectory(prefix="tiled-metal-emu-", dir=cache) as tmp:
        if not runtime.is_file():
            obj = Path(tmp, "runtime.o")
            _build([clang, "--driver-mode=g++", "-std=c++17", "-O2", "-c", str(runtime_src),
                    "-o", str(obj)], "the Metal emulation runtime")
            os.replace(obj, runtime)
        src, out = Path(tmp, "kernel.metal"), Path(tmp, "emulator")
        src.write_text(text)
        _build([clang, "--driver-mode=g++", "-x", "c++", *FLAGS, f"-I{msl.CPU_INCLUDE}",
                str(src), "-x", "none", str(runtime), "-lm", "-o", str(out)],
               f"the CPU emulation of {symbol}")
        os.replace(out, exe)  # atomic: a racing build publishes the same program
    return exe


def emulate(artifact: bytes, manifest: Manifest, args, source: str | None = None,
            timeout_s: float = 600.0) -> None:
    """Runs the kernel on numpy arrays (and Python scalars) on the CPU, writing the tensors
    back in place. Raises LaunchError for arguments the manifest refuses, EmulationError when
    the kernel deadlocks, reaches a barrier in part of a group, writes outside a tensor,
    crashes or runs past `timeout_s`, ToolchainError when the emulation cannot be built."""
    from tiled.runtime.metal_abi import pack_args

    arrays, bound, grid, block = bind_launch(manifest, "metal", args)
    if source is None:
        source = artifact.decode("utf-8")
    exe = emulator(source, manifest.symbol)
    rec = manifest.metal
    file, values = ArgumentFile(), []
    nbuf = max([b.get("buffer", -1) for b in rec["bindings"]] + [rec["args_buffer"] or -1]) + 1
    tokens = ["-"] * nbuf
    for ka, b in zip(manifest.kernel_args, rec["bindings"], strict=True):
        if ka.kind == "tensor":
            tokens[b["buffer"]] = file.tensor(arrays[ka.param])
            values.append(None)
        elif ka.kind == "scalar":
            dt = np_dtype(manifest.params[ka.param].dtype)
            values.append(np.array(bound.values[ka.param]).astype(dt).tobytes())
        else:
            values.append(np.array(bound.dims[ka.name], dtype=ka.dtype).tobytes())
    if rec["args_buffer"] is not None:
        tokens[rec["args_buffer"]] = file.value(pack_args(rec, manifest.kernel_args, values))
    file.run([str(exe)], [*map(str, grid), *map(str, block), str(REDZONE), *tokens],
             f"{manifest.name} on {manifest.target}", timeout_s)
