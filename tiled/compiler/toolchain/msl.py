"""Checking MSL on Linux, where no Metal compiler exists: the shipped source, built by clang
(TILED_CLANG, default clang-22) as C++17 over tiled's CPU implementation of <metal_stdlib>
(targets/metal/include/cpu/), with Metal's address spaces as clang address spaces.

`type_check` runs `clang++ -fsyntax-only`: a pointer into one address space used as another,
`double`, a type or function MSL lacks, a wrong argument are errors. `cpu_text` is the text
both builds compile: the shipped source with each `threadgroup T name[N];` declared in a
kernel (which C++ cannot give an address space) as a reference into the emulated threadgroup
memory, and each vector cast `((half4)e)` (TVM's form) as the conversion MSL defines it to be
(a C-style cast of a clang vector would reinterpret the bits); nothing else changes, so line
numbers are the shipped source's. Thread-safe.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from pathlib import Path

from tiled.errors import CompileError, ToolchainError

INCLUDE = Path(__file__).resolve().parent.parent / "targets" / "metal" / "include"
CPU_INCLUDE = INCLUDE / "cpu"
FLAGS = ("-x", "c++", "-std=c++17", "-fno-exceptions", "-Wno-unknown-attributes",
         "-Wno-user-defined-literals", "-Wno-unused-variable", "-ferror-limit=8")
_TG_ARRAY = re.compile(r"^(\s*)threadgroup ([\w:]+) (\w+)\[(\d+)\];", re.M)
_VECTOR_CAST = re.compile(r"\(\(((?:u?(?:char|short|int|long)|half|float|bfloat|bool)[234])\)")


def _vector_casts(text: str) -> str:
    """`((V)e)` -> `(::tiled_cpu::make<V>(e))`: the cast's operand runs to the parenthesis
    that closes the one before `(V)`."""
    out, pos = [], 0
    for m in _VECTOR_CAST.finditer(text):
        if m.start() < pos:
            continue  # inside an operand already rewritten (nested casts are rewritten below)
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:
            return text  # unbalanced: leave it to the compiler's diagnostics
        operand = _vector_casts(text[m.end():i - 1])
        out.append(f"{text[pos:m.start()]}(::tiled_cpu::make<{m.group(1)}>({operand}))")
        pos = i
    out.append(text[pos:])
    return "".join(out)


def headers_digest() -> str:
    """sha256 over every file of the Metal include tree (tiled_metal.h and the CPU
    implementation of <metal_stdlib>): name, size, bytes, in path order."""
    h = hashlib.sha256()
    for p in sorted(x for x in INCLUDE.rglob("*") if x.is_file()):
        data = p.read_bytes()
        h.update(f"{p.relative_to(INCLUDE).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cpu_text(source: str) -> str:
    """The text the type check and the emulation compile (module docstring)."""
    return _vector_casts(_TG_ARRAY.sub(lambda m: f"{m.group(1)}TILED_THREADGROUP_ARRAY("
                                       f"{m.group(2)}, {m.group(3)}, {m.group(4)});", source))


def type_check(source: str, what: str) -> None:
    """Raises CompileError with clang's diagnostics when `source` is not MSL tiled's CPU
    <metal_stdlib> accepts; ToolchainError when clang is missing."""
    from tiled.compiler.toolchain import hip

    clang = hip.tool("clang")
    with tempfile.TemporaryDirectory(prefix="tiled-msl-") as tmp:
        src = Path(tmp, "kernel.metal")
        src.write_text(cpu_text(source))
        argv = [clang, "--driver-mode=g++", "-fsyntax-only", *FLAGS, f"-I{CPU_INCLUDE}",
                str(src)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                                  check=False)
        except OSError as e:
            raise ToolchainError(f"cannot run {clang!r}: {e}") from None
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip().replace(str(src), "kernel.metal")
            raise CompileError(f"the MSL of {what} fails tiled's type check (clang over "
                               f"tiled's CPU <metal_stdlib>; a tiled bug):\n{out}")
