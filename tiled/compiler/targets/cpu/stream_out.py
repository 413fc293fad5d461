"""Streaming (non-temporal) stores for the outputs a cpu kernel only writes.

A plain store to a line that is not in the caches first reads the line (for ownership), so a
kernel that writes an output it never reads moves its bytes twice; a non-temporal store writes
whole lines without reading them and without evicting the caches' other data. For softmax
over 4096 x 4096 float32 that is a third of its memory traffic (on the 2-core AVX2 development
VM, benchmarks/results/cpu_softmax_forms.json: the same C at 0.83 of a plain copy with plain
stores, 1.11 with streaming ones).

Which stores: those into a global output that the kernel never reads, made by a copy-out fold
(forward.py) whose tile's rows are contiguous runs of at least MIN_RUN_BYTES and whose tile
holds at least MIN_TILE_BYTES, or by an element loop whose innermost variable indexes the
output's last dim, over at least MIN_RUN_BYTES, inside loops of at least MIN_TILE_BYTES (a few
cache lines gain nothing and would take the IR path's compile time); and only where the
values stored take light arithmetic (`_light`: a loop busy with exponentials or divisions
stores too slowly for streaming to pay). On x86-64 only, and only where clang
(native_bf16.clang) can compile TVM's IR.

How: the lowering (`lower_streamed`) emits such a top-level statement twice, under a test
the shim answers per call (tiled_stream_ok: the output 16-byte aligned and at least twice the
last-level cache, or TILED_CPU_STREAM_BYTES): one copy stores through an alias of the output
pointer (ALIAS, which TVM gives its own TBAA type), the other stores plainly. After the aliased
statement a fence (FENCE: sfence) orders the streamed lines before the block ends. TVM emits
its IR unoptimized; `define_helpers` defines ALIAS as the pointer itself with an assumption
that it is 16-byte aligned, clang optimizes the IR (vectorizing the loops), `mark` adds
`!nontemporal` to the vector stores of the alias's TBAA type that LLVM proved 16-byte aligned,
and clang compiles that (x86 stores a 16-byte aligned 32-byte vector as two 16-byte
streaming stores). Stores LLVM could not prove aligned stay plain, so a streaming store never
faults. LLVM's vectorizer keeps scalar `!nontemporal` stores scalar, hence marking after it.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cpu import forward
from tiled.compiler.targets.cpu.native_bf16 import run_clang
from tiled.compiler.tir import global_extent
from tiled.errors import ToolchainError
from tiled.ir import dtypes
from tiled.ir.walk import subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

ALIAS = "tiled_stream_alias"
FENCE = "tiled_stream_fence"
OK = "tiled_stream_ok"  # the shim's (shim.c)
ATTR = "tiled.stream_out"  # on the lowered module: the aliases' TBAA names, comma-separated
MIN_RUN_BYTES = 1024
MIN_TILE_BYTES = 8192
ALIGN = 16


def plan(program: pb.Program) -> dict[int, set[int]]:
    """Top-level statement position -> the outputs its stores may stream (see the module
    docstring): a copy-out fold's destination, and outputs stored directly from element
    loops along their last dim. Only outputs the kernel never reads."""
    body = program.kernel.body
    bufs = {b.id: b for b in program.buffers}
    write_only = {b.id for b in program.buffers
                  if b.scope == pb.GLOBAL and not forward.reads(body, b.id)}
    folds = forward.plan(program)
    out: dict[int, set[int]] = {}
    for pos, st in enumerate(forward.top_level(body)):
        if pos in folds.skip:
            continue
        found = _direct(st, bufs, ())
        if pos in folds.copy_out:
            tile_id, cp = folds.copy_out[pos]
            if _fold_streams(bufs[tile_id], bufs[cp.dst.buffer], cp):
                found.add(cp.dst.buffer)
        found &= write_only
        if found and _light(st):
            out[pos] = found
    return out


# Math that makes a loop's stores trickle out: a loop that spends many instructions per
# vector it stores (SiLU-and-mul's sigmoid, a division) fills a write-combining buffer
# slowly, and streaming its stores ran 0.74-0.99x as fast (float32 over 4096 x 4096,
# benchmarks/results/cpu_stream_stores_direct_run1.json); the loops that gained multiply.
_HEAVY = {pb.EXP, pb.EXP2, pb.LOG, pb.LOG2, pb.SQRT, pb.RSQRT, pb.TANH, pb.SIGMOID, pb.POW,
          pb.ERF, pb.SIN, pb.COS}


def _light(st: pb.Stmt) -> bool:
    """Whether the values `st` stores take no transcendental call and no float division."""
    for s in walk(st):
        if s.WhichOneof("kind") != "store":
            continue
        for x in subexprs(s.store.value):
            kind = x.WhichOneof("kind")
            if kind == "call" and x.call.op in _HEAVY:
                return False
            if kind == "binary" and x.binary.op == pb.DIV and dtypes.is_float(x.dtype):
                return False
    return True


def outputs(program: pb.Program) -> set[int]:
    """Every output some statement of the kernel may stream (plan)."""
    return set().union(*plan(program).values())


def _fold_streams(tile: pb.Buffer, dst: pb.Buffer, cp: pb.Copy) -> bool:
    shape = [d.size for d in tile.shape]
    item = dtypes.nbytes(dst.dtype)
    run = cp.dst.extents[-1] if cp.dst.extents else 1
    return run == shape[-1] and run * item >= MIN_RUN_BYTES and \
        math.prod(shape) * item >= MIN_TILE_BYTES


def _direct(st: pb.Stmt, bufs: dict, loops: tuple) -> set[int]:
    """Global buffers `st` stores directly along their last dim: the innermost loop's
    variable, plus terms without it, indexes that dim; the loop is at least MIN_RUN_BYTES of
    elements and the loops around the store at least MIN_TILE_BYTES."""
    kind = st.WhichOneof("kind")
    if kind == "for_":
        return _direct(st.for_.body, bufs, (*loops, st.for_))
    if kind == "seq":
        return set().union(*(_direct(s, bufs, loops) for s in st.seq.stmts))
    if kind == "if_then_else":
        node = st.if_then_else
        found = _direct(node.then_body, bufs, loops)
        return found | _direct(node.else_body, bufs, loops) if node.HasField("else_body") \
            else found
    if kind != "store" or not loops or not st.store.indices:
        return set()
    buf = bufs[st.store.buffer]
    extents = [f.extent.int_value if f.extent.WhichOneof("kind") == "int_value" else 0
               for f in loops]
    item = dtypes.nbytes(buf.dtype)
    if buf.scope != pb.GLOBAL or extents[-1] * item < MIN_RUN_BYTES or \
            math.prod(extents) * item < MIN_TILE_BYTES or \
            not _plus_var(st.store.indices[-1], loops[-1].var) or \
            any(_has_var(i, loops[-1].var) for i in st.store.indices[:-1]):
        return set()
    return {buf.id}


def _plus_var(e: pb.Expr, var: int) -> bool:
    """Whether `e` is `var`, or a sum with `var` as one term and no other mention of it."""
    kind = e.WhichOneof("kind")
    if kind == "var":
        return e.var == var
    if kind == "binary" and e.binary.op == pb.ADD:
        a, b = e.binary.a, e.binary.b
        return (_plus_var(a, var) and not _has_var(b, var)) or \
            (_plus_var(b, var) and not _has_var(a, var))
    return False


def _has_var(e: pb.Expr, var: int) -> bool:
    return any(x.WhichOneof("kind") == "var" and x.var == var for x in subexprs(e))


def check_outputs(lower, program: pb.Program, bids: set[int]) -> None:
    """Binds, before the block loop, each streamed output's per-call test (nonzero: stream)."""
    bufs = {b.id: b for b in program.buffers}
    for bid in sorted(bids):
        buf = bufs[bid]
        nbytes = tirx.const(dtypes.nbytes(buf.dtype), "int64")
        for d in range(len(buf.shape)):
            nbytes = nbytes * tirx.Cast("int64", global_extent(lower, buf, d))
        lower.stream_ok[bid] = T.bind(T.call_extern("int32", OK, lower.tir_buffers[bid].data,
                                                    nbytes))


def lower_streamed(lower, emit, bids: set[int]) -> None:
    """What `emit()` lowers (a top-level statement, or those skew.py runs together), twice:
    storing outputs `bids` through aliases when the shim's test passes for each, plainly
    otherwise. The lowering's state is the same after either."""
    saved = (set(lower.touched), set(lower.streamed), set(lower.prefetched))
    plain = {bid: lower.tir_buffers[bid] for bid in sorted(bids)}
    ok = None
    for bid in plain:
        ok = lower.stream_ok[bid] != 0 if ok is None else tirx.And(ok, lower.stream_ok[bid] != 0)
    with T.If(ok):
        with T.Then():
            for bid, buf in plain.items():
                alias = T.bind(T.call_extern("handle", ALIAS, buf.data))
                lower.stream_tags.append(hex(alias.__chandle__()))
                lower.tir_buffers[bid] = T.decl_buffer(buf.shape, buf.dtype, data=alias,
                                                       align=buf.data_alignment)
            try:
                emit()
            finally:
                lower.tir_buffers.update(plain)
            T.evaluate(T.call_extern("void", FENCE))
        lower.touched, lower.streamed, lower.prefetched = (set(s) for s in saved)
        with T.Else():
            emit()


def _declaration(name: str) -> re.Pattern:
    return re.compile(r"^declare\b[^\n]*@" + name + r"\([^\n]*$", re.MULTILINE)


_DEFINITIONS = {
    ALIAS: f"""define internal ptr @{ALIAS}(ptr %p) alwaysinline {{
  call void @llvm.assume(i1 true) [ "align"(ptr %p, i64 {ALIGN}) ]
  ret ptr %p
}}""",
    FENCE: f"""define internal void @{FENCE}() alwaysinline {{
  call void @llvm.x86.sse.sfence()
  ret void
}}""",
}
_INTRINSICS = {"llvm.assume": "declare void @llvm.assume(i1 noundef)",
               "llvm.x86.sse.sfence": "declare void @llvm.x86.sse.sfence()"}


def define_helpers(ll: str) -> str:
    """TVM's IR with ALIAS and FENCE defined (and the intrinsics they call declared)."""
    for name, definition in _DEFINITIONS.items():
        ll, n = _declaration(name).subn(definition, ll, count=1)
        if n != 1:
            raise ToolchainError(f"streaming stores: @{name} is not declared as expected in "
                                 "TVM's LLVM IR")
    for name, declaration in _INTRINSICS.items():
        if not re.search(r"^declare\b[^\n]*@" + re.escape(name) + r"\(", ll, re.MULTILINE):
            ll += "\n" + declaration + "\n"
    return ll


_TYPE_NODE = re.compile(r'^(!\d+) = !\{!"(0x[0-9a-f]+)[^"]*"', re.MULTILINE)
_ACCESS_TAG = re.compile(r"^(!\d+) = !\{(!\d+), !\d+, i64 0\}", re.MULTILINE)
_VECTOR_STORE = re.compile(r"^(\s*)store <(\d+) x ([^>]+)> ([^,]+), (.*, align (\d+)(.*))$")
# x86's code generator has no streaming-store instruction for vectors of bfloat (clang-22,
# x86-64-v4 with avx512bf16, where they are a legal type): it stores them plainly, and sees
# through a bitcast to i16. So their bits are stored as i16 after an empty inline asm.
_SIXTEEN_BIT_FLOATS = ("bfloat", "half")
_TBAA = re.compile(r"!tbaa (!\d+)")


def mark(ll: str, tags: list[str]) -> tuple[str, int]:
    """Optimized IR `ll` with `!nontemporal` on each vector store through a pointer of the
    TBAA types named `tags` (the aliases') that LLVM proved ALIGN-byte aligned; and how many
    it marked."""
    types = {m.group(1) for m in _TYPE_NODE.finditer(ll) if m.group(2) in tags}
    access = {m.group(1) for m in _ACCESS_TAG.finditer(ll) if m.group(2) in types}
    ids = [int(m) for m in re.findall(r"^!(\d+) = ", ll, re.MULTILINE)]
    node = f"!{max(ids, default=0) + 1}"
    lines, count = ll.split("\n"), 0
    for k, line in enumerate(lines):
        m = _VECTOR_STORE.match(line)
        if m is None or int(m.group(6)) < ALIGN:
            continue
        tbaa = _TBAA.search(m.group(7))
        if tbaa is None or tbaa.group(1) not in access:
            continue
        indent, n, elem, value, rest = m.group(1, 2, 3, 4, 5)
        if elem in _SIXTEEN_BIT_FLOATS and value.startswith("%"):
            bits, vec = f"%tiled.nt.bits{count}", f"<{n} x i16>"
            line = (f"{indent}{bits}.0 = bitcast <{n} x {elem}> {value} to {vec}\n"
                    f'{indent}{bits} = call {vec} asm "", "=v,0"({vec} {bits}.0)\n'
                    f"{indent}store {vec} {bits}, {rest}")
        lines[k] = f"{line}, !nontemporal {node}"
        count += 1
    return "\n".join(lines) + f"\n{node} = !{{i32 1}}\n", count


def compile_ir(ll: str, obj: Path, flags: tuple[str, ...], exe: str,
               tags: list[str]) -> int:
    """TVM's IR (define_helpers applied) optimized by clang `exe`, marked, and compiled to the
    object `obj` without optimizing it again. Returns the number of streaming stores."""
    with tempfile.TemporaryDirectory(prefix="tiled-cpu-stream-") as tmp:
        src, opt = Path(tmp) / "kernel.ll", Path(tmp) / "kernel.opt.ll"
        src.write_text(ll)
        run_clang([exe, "-x", "ir", "-S", "-emit-llvm", "-O3", "-fPIC",
                   "-Wno-override-module", *flags, str(src), "-o", str(opt)])
        marked, count = mark(opt.read_text(), tags)
        opt.write_text(marked)
        run_clang([exe, "-x", "ir", "-c", "-O3", "-Xclang", "-disable-llvm-passes", "-fPIC",
                   "-Wno-override-module", *flags, str(opt), "-o", str(obj)])
    return count
