"""Streaming (non-temporal) stores for the outputs a cpu kernel only writes.

A plain store to a line that is not in the caches first reads the line (for ownership), so a
kernel that writes an output it never reads moves its bytes twice; a non-temporal store writes
whole lines without reading them and without evicting the caches' other data. For softmax
over 4096 x 4096 float32 on the 2-core Zen 4 that is a third of its memory traffic
(benchmarks/results/cpu_softmax_forms.json: the same C at 0.78 of a copy with plain stores,
0.90 with streaming ones).

Which stores: those a copy-out fold (forward.py) sends to a global output that the kernel never
reads, where the tile's rows are contiguous runs of at least MIN_RUN_BYTES and the tile holds
at least MIN_TILE_BYTES (tiles of a few cache lines gain nothing and would take the IR path's
compile time). On x86-64 only, and only where clang (native_bf16.clang) can compile TVM's IR.

How: the lowering (`lower_streamed`) emits the fold's loop twice, under a test the shim answers
per call (tiled_stream_ok: the output 16-byte aligned and at least twice the last-level cache,
or TILED_CPU_STREAM_BYTES): one loop stores through an alias of the output pointer
(ALIAS, which TVM gives its own TBAA type), the other stores plainly. After the aliased loop a
fence (FENCE: sfence) orders the streamed lines before the block ends. TVM emits its IR
unoptimized; `define_helpers` defines ALIAS as the pointer itself with an assumption that it
is 16-byte aligned, clang optimizes the IR (vectorizing the loops), `mark` adds
`!nontemporal` to the vector stores of the alias's TBAA type that LLVM proved 16-byte aligned,
and clang compiles that (x86 stores a 16-byte aligned 32-byte vector as two 16-byte
streaming stores). Stores LLVM could not prove aligned stay plain, so a streaming store never
faults. LLVM's vectorizer keeps scalar `!nontemporal` stores scalar, hence marking after it.
"""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from pathlib import Path

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.targets.cpu import forward
from tiled.compiler.tir import global_extent
from tiled.errors import ToolchainError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb

ALIAS = "tiled_stream_alias"
FENCE = "tiled_stream_fence"
OK = "tiled_stream_ok"  # the shim's (shim.c)
ATTR = "tiled.stream_out"  # on the lowered module: the aliases' TBAA names, comma-separated
MIN_RUN_BYTES = 1024
MIN_TILE_BYTES = 8192
ALIGN = 16


def outputs(program: pb.Program) -> set[int]:
    """The global buffers whose copy-out folds may stream (see the module docstring)."""
    body = program.kernel.body
    bufs = {b.id: b for b in program.buffers}
    out = set()
    for tile_id, cp in forward.plan(program).copy_out.values():
        tile, dst = bufs[tile_id], bufs[cp.dst.buffer]
        shape = [d.size for d in tile.shape]
        item = dtypes.nbytes(dst.dtype)
        run = cp.dst.extents[-1] if cp.dst.extents else 1
        if run != shape[-1] or run * item < MIN_RUN_BYTES or \
                math.prod(shape) * item < MIN_TILE_BYTES:
            continue
        if not forward.reads(body, dst.id):
            out.add(dst.id)
    return out


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


def lower_streamed(lower, st: pb.Stmt, bid: int) -> None:
    """The copy-out fold's loop `st` into output `bid`, twice: through the alias when the
    shim's test passes, plainly otherwise. The lowering's state is the same after either."""
    saved = (set(lower.touched), set(lower.streamed), set(lower.prefetched))
    plain = lower.tir_buffers[bid]
    with T.If(lower.stream_ok[bid] != 0):
        with T.Then():
            alias = T.bind(T.call_extern("handle", ALIAS, plain.data))
            lower.stream_tags.append(hex(alias.__chandle__()))
            lower.tir_buffers[bid] = T.decl_buffer(plain.shape, plain.dtype, data=alias,
                                                   align=plain.data_alignment)
            try:
                lower.stmt(st)
            finally:
                lower.tir_buffers[bid] = plain
            T.evaluate(T.call_extern("void", FENCE))
        lower.touched, lower.streamed, lower.prefetched = (set(s) for s in saved)
        with T.Else():
            lower.stmt(st)


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
_VECTOR_STORE = re.compile(r"^\s*store <\d+ x [^>]+> .*, align (\d+)(.*)$")
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
        if m is None or int(m.group(1)) < ALIGN:
            continue
        tbaa = _TBAA.search(m.group(2))
        if tbaa is not None and tbaa.group(1) in access:
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
        _clang([exe, "-x", "ir", "-S", "-emit-llvm", "-O3", "-fPIC", "-Wno-override-module",
                *flags, str(src), "-o", str(opt)])
        marked, count = mark(opt.read_text(), tags)
        opt.write_text(marked)
        _clang([exe, "-x", "ir", "-c", "-O3", "-Xclang", "-disable-llvm-passes", "-fPIC",
                "-Wno-override-module", *flags, str(opt), "-o", str(obj)])
    return count


def _clang(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolchainError(f"compiling the CPU kernel's IR failed (exit {proc.returncode}): "
                             f"{' '.join(argv)}\n{(proc.stdout + proc.stderr).strip()}")
