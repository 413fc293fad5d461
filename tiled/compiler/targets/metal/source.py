"""The MSL source of a Metal kernel, from what TVM's Metal codegen prints for its TIR, and its
binding table (what the manifest says about buffers and the scalar-argument struct).

TVM prints `#include <metal_stdlib>`, a union for scalar arguments that are not 32 or 64
bits, the kernel's argument struct and the kernel. tiled ships one source (a Metal library is
compiled from one string): a banner, include/tiled_metal.h, then TVM's text with two
repairs. TVM's `__TVMArgUnion` names only `v_int`, while its accesses name `v_<type>`
(v_half, v_bool, ...): the union gets those members. TVM's PointerValueTypeRewrite retypes
the shared pool (declared as uint8 bytes) to the type its accesses use but keeps the count:
`threadgroup float v[4224]` for a 4224-byte pool, 4x the memory; the count is put back to the
pool's bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program

INCLUDE = Path(__file__).resolve().parent / "include"
HEADER = "tiled_metal.h"
# Bytes of the MSL scalar and vector types TVM may give the pool.
MSL_BYTES = {"char": 1, "uchar": 1, "bool": 1, "short": 2, "ushort": 2, "half": 2,
             "bfloat": 2, "int": 4, "uint": 4, "float": 4, "long": 8, "ulong": 8}
_UNION = re.compile(r"union __TVMArgUnion \{\n int v_int\[2\];\n\};\n")
UNION = ("union __TVMArgUnion {\n  int v_int[2];\n  uint v_uint;\n  half v_half;\n"
         "  short v_short;\n  ushort v_ushort;\n  char v_char;\n  uchar v_uchar;\n"
         "  bool v_bool;\n};\n")
_TG_ARRAY = re.compile(r"^(\s*)threadgroup (\w+?)([234]?) (\w+)\[(\d+)\];$", re.M)
_KERNEL = re.compile(r"^kernel void (\w+)\(", re.M)
_BUFFER = re.compile(r"^\s*device (\w+)\* (\w+) \[\[ buffer\((\d+)\) \]\],$", re.M)
_ARGS = re.compile(r"^\s*constant (\w+)& \w+ \[\[ buffer\((\d+)\) \]\],$", re.M)
_FIELD = re.compile(r"^\s*(\w+) (\w+)(\[2\])?;$")


@dataclass(frozen=True)
class Bindings:
    """How a kernel takes its arguments: `kernel_args` (manifest entries, in order), and for
    each the Metal binding: {"buffer": i} for a tensor, {"offset": o, "size": s} for a
    scalar or dim in the argument struct at buffer index `args_buffer` (None without one)."""

    symbol: str
    kernel_args: list[dict]
    bindings: list[dict]
    args_buffer: int | None
    args_size: int


def fix_pool(text: str, pool_bytes: int) -> str:
    """TVM's kernel text with its threadgroup array (the pool) declared at `pool_bytes`
    bytes (module docstring). CompileError when the text has another threadgroup array, or
    one this cannot size."""
    found = _TG_ARRAY.findall(text)
    if len(found) > 1 or (found and not pool_bytes):
        raise CompileError(f"TVM's Metal source declares {len(found)} threadgroup arrays; "
                           "the Metal backend expects the one shared pool")
    if not found:
        return text
    _, base, lanes, name, count = found[0]
    size = MSL_BYTES.get(base, 0) * int(lanes or 1)
    count = int(count)
    if size and count * size == pool_bytes:
        return text
    if not size or count != pool_bytes or pool_bytes % size:
        raise CompileError(f"TVM declared the threadgroup pool as {base}{lanes} {name}[{count}] "
                           f"for a pool of {pool_bytes} bytes")
    return _TG_ARRAY.sub(lambda m: f"{m.group(1)}threadgroup {m.group(2)}{m.group(3)} "
                         f"{m.group(4)}[{pool_bytes // size}];", text)


def msl_source(tvm_source: str, pool_bytes: int, banner: str) -> str:
    """The shipped MSL for TVM's Metal source of one kernel (module docstring)."""
    m = _KERNEL.search(tvm_source)
    if m is None:
        raise CompileError("TVM's Metal codegen printed no kernel (kernel void ...)")
    text = tvm_source[tvm_source.index("#include <metal_stdlib>"):]
    text, n = _UNION.subn(UNION, text)
    if n != 1:
        raise CompileError("TVM's Metal source does not declare __TVMArgUnion as expected")
    text = fix_pool(text, pool_bytes)
    header = (INCLUDE / HEADER).read_text()
    return f"{banner}\n// ---- {HEADER} ----\n{header}\n// ---- the kernel ----\n{text.rstrip()}\n"


def bindings(source: str, program: Program) -> Bindings:
    """The kernel's symbol and argument bindings, read from its MSL signature and argument
    struct and mapped onto the program's parameters (tensors by `<name>_ptr`, scalars and
    symbolic dims by name). CompileError naming a parameter that matches nothing."""
    from tiled.compiler.manifest import dim_names

    m = _KERNEL.search(source)
    if m is None:
        raise CompileError("the Metal source has no kernel")
    symbol = m.group(1)
    signature = source[m.end():source.index(") {", m.end())]
    p = program.proto
    by_ptr = {f"{prm.name}_ptr": i for i, prm in enumerate(p.params)
              if prm.WhichOneof("kind") == "buffer"}
    by_scalar = {prm.name: i for i, prm in enumerate(p.params)
                 if prm.WhichOneof("kind") == "scalar"}
    dims = set(dim_names(p).values())
    args, binds = [], []
    for bm in _BUFFER.finditer(signature):
        if bm.group(2) not in by_ptr:
            raise CompileError(f"Metal kernel buffer {bm.group(2)!r} matches no program tensor")
        args.append({"kind": "tensor", "param": by_ptr[bm.group(2)]})
        binds.append({"buffer": int(bm.group(3))})
    am = _ARGS.search(signature)
    if am is None:
        return Bindings(symbol, args, binds, None, 0)
    struct = re.search(r"^struct " + re.escape(am.group(1)) + r" \{\n(.*?)^\};", source,
                       re.M | re.S)
    if struct is None:
        raise CompileError(f"the Metal source does not define {am.group(1)}")
    offset = 0
    for line in struct.group(1).splitlines():
        fm = _FIELD.match(line)
        if fm is None:
            raise CompileError(f"unexpected field in {am.group(1)}: {line.strip()!r}")
        ctype, name = fm.group(1), fm.group(2)
        if name in by_scalar:
            args.append({"kind": "scalar", "param": by_scalar[name]})
            scalar = p.params[by_scalar[name]].scalar
            size = dtypes.nbytes(next(v.dtype for v in p.vars if v.id == scalar))
        elif name in dims:
            wide = ctype in ("long", "ulong")
            args.append({"kind": "dim", "name": name, "dtype": "int64" if wide else "int32"})
            size = 8 if wide else 4
        else:
            raise CompileError(f"Metal kernel argument {name!r} matches no program parameter")
        # TVM gives every scalar an 8-byte slot (a 32-bit one as T x[2], a 64-bit one as T x,
        # a narrower one as the 8-byte union), its value at the slot's start.
        binds.append({"offset": offset, "size": size})
        offset += 8
    return Bindings(symbol, args, binds, int(am.group(2)), offset)
