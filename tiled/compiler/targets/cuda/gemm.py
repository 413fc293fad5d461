"""T.gemm on the CUDA lowering's generic path (sm_80 instructions; sm_90a's generic path too).

C is a fragment in the layout inference chose (passes/layout.py): `MmaLayout` when A and B are
16-bit and C float32 (mma.sync m16n8k16 through tiled_cuda.h), else the cyclic layout of the
SIMT gemm. The operands:

- shared tiles are read in place (`gemm_ss`: ldmatrix);
- a fragment A in mma.sync's A-operand layout (`layouts.a_operand_layout`: C's warps,
  one warp column; the layout of the cast copy of a previous accumulator with the same
  warps, FlashAttention's P) is read from registers (`gemm_rs`), no shared memory touched;
- any other fragment operand is staged: its threads write it to the shared scratch area
  (row-major, rows padded like a gemm tile), a barrier, and the gemm reads it from there;
- float8 shared tiles (both operands float8, C float32) are converted to half into the
  scratch area (exact), then read by the half mma.sync gemm: the generic path's float8 gemm,
  until issue 12's wgmma one.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import ReplicatedLayout, unravel
from tiled.compiler.passes.resources import align_up
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.layouts import MmaLayout, a_operand_layout
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def a_in_registers(low, g: pb.Gemm) -> bool:
    """Whether A is a fragment that gemm_rs reads from registers as it lies."""
    a, b = low.buffers[g.a], low.buffers[g.b]
    lay = a_operand_layout(g, low.buffers, low.layouts.get(g.c))
    return lay is not None and low.layouts.get(g.a) == lay and b.scope == pb.SHARED and \
        a.dtype == b.dtype


def staged_operands(low, g: pb.Gemm) -> list[str]:
    """The roles ("a", "b") of the fragment operands that go through shared memory."""
    return [role for role in ("a", "b")
            if low.buffers[getattr(g, role)].scope == pb.FRAGMENT
            and not (role == "a" and a_in_registers(low, g))]


def stage_stride(buf: pb.Buffer) -> int:
    cols = buf.shape[-1].size
    return cols + 8 if dtypes.nbytes(buf.dtype) == 2 else cols  # as the pool pads gemm tiles


def converted(low, g: pb.Gemm) -> list[str]:
    """The roles of the float8 shared operands an mma.sync gemm reads converted to half (in
    the scratch area); none for the SIMT gemm."""
    if not isinstance(low.layouts.get(g.c), MmaLayout):
        return []
    return [role for role in ("a", "b")
            if dtypes.canonical_name(low.buffers[getattr(g, role)].dtype).startswith("float8")]


def _converted_shape(buf: pb.Buffer) -> tuple[int, int]:
    """(rows, padded half stride) of a float8 operand's tile (its last two dims)."""
    cols = buf.shape[-1].size
    return buf.shape[-2].size, cols + 8


def stage_bytes(low, g: pb.Gemm) -> int:
    """Shared scratch bytes the gemm's staged and converted operands take (0 when none)."""
    total = 0
    for role in staged_operands(low, g):
        b = low.buffers[getattr(g, role)]
        total = align_up(total) + b.shape[0].size * stage_stride(b) * dtypes.nbytes(b.dtype)
    for role in converted(low, g):
        rows, stride = _converted_shape(low.buffers[getattr(g, role)])
        total = align_up(total) + rows * stride * 2
    return total


def _convert(low, g: pb.Gemm, roles: list[str]) -> dict:
    """Writes each float8 operand of `roles` as half into the scratch area; returns role ->
    (pointer, leading dimension) of the half tile."""
    low.sync.before(True, True)  # reads the float8 tiles (a copy's), writes the scratch area
    out, offset = {}, 0
    base = f", {low.tid_base}" if low.tid_base else ""
    for role in roles:
        bid = getattr(g, role)
        buf = low.buffers[bid]
        rows, stride = _converted_shape(buf)
        offset = align_up(offset)
        tile = low.scratch("float16", rows * stride, offset, shape=(rows, stride))
        index = [low.expr(i) for i in (g.a_index if role == "a" else g.b_index)]
        src = low.addr(bid, index + [tirx.const(0, "int32")] * 2)
        fp8 = CTYPE[dtypes.canonical_name(buf.dtype)]
        T.evaluate(T.call_extern(
            "void", f"tiled::fp8_tile_to_half<{fp8}, {rows}, {buf.shape[-1].size}, "
            f"{low.shared[bid].stride}, {stride}, {low.threads}{base}>",
            src, T.address_of(tile[0, 0])))
        out[role] = (T.address_of(tile[0, 0]), stride)
        offset += rows * stride * 2
    low.sync.before(True, False)  # the gemm reads the half tiles
    return out


def stage_fragment(low, bid: int, offset: int):
    """Writes fragment `bid` row-major into the scratch area at `offset` bytes; returns the
    shared TIR buffer (rows x padded stride) it is in."""
    b = low.buffers[bid]
    rows, cols = (d.size for d in b.shape)
    stride = stage_stride(b)
    dt = dtypes.canonical_name(b.dtype)
    tile = low.scratch(dt, rows * stride, offset, shape=(rows, stride))
    lay, frag = low.layouts[bid], low.tir[bid]
    if isinstance(lay, ReplicatedLayout):  # every thread holds it all: they share the writes
        numel = rows * cols
        with low.loop(-(-numel // low.threads)) as it:
            flat = it * low.threads + low.tx
            with low.maybe_if(None if numel % low.threads == 0 else flat < numel):
                T.buffer_store(tile, frag[flat], unravel(flat, [rows, cols]))
        return tile
    with low.loop(lay.local_size) as idx:
        coords, valid = lay.coords(low.tx, idx)
        with low.maybe_if(valid):
            T.buffer_store(tile, frag[idx], coords)
    return tile


def lower_gemm(low, g: pb.Gemm, s: pb.Stmt) -> None:
    a, b, c = (low.buffers[x] for x in (g.a, g.b, g.c))
    staged = staged_operands(low, g)
    operand = {}  # role -> (pointer, leading dimension)
    if staged:
        low.sync.before(False, True)
        offset = 0
        for role in staged:
            bid = getattr(g, role)
            offset = align_up(offset)
            tile = stage_fragment(low, bid, offset)
            operand[role] = (T.address_of(tile[0, 0]), stage_stride(low.buffers[bid]))
            buf = low.buffers[bid]
            offset += buf.shape[0].size * stage_stride(buf) * dtypes.nbytes(buf.dtype)
        low.sync.before(True, False)  # the gemm reads the staged tiles (and B)
    else:
        low.uniform_stmt(s)
    halves = converted(low, g)
    if halves:
        operand.update(_convert(low, g, halves))
    lay = low.layouts[g.c]
    acc = low.tir[g.c]
    if g.clear_accum:
        with low.loop(lay.local_size) as idx:
            T.buffer_store(acc, tirx.const(0, acc.dtype), [idx])
    M, N = (d.size for d in c.shape)
    K = (a.shape[-2] if g.transpose_a else a.shape[-1]).size
    ta, tb = str(g.transpose_a).lower(), str(g.transpose_b).lower()
    for role, index in (("a", g.a_index), ("b", g.b_index)):
        bid = getattr(g, role)
        if role not in operand and low.buffers[bid].scope == pb.SHARED:
            # A staged operand (A_s[s, :, :]) starts at its leading indices.
            operand[role] = (low.addr(bid, [low.expr(i) for i in index]
                                      + [tirx.const(0, "int32")] * 2), low.shared[bid].stride)
    base = f", {low.tid_base}" if low.tid_base else ""
    pc = T.address_of(acc[0])
    if isinstance(lay, MmaLayout) and "a" not in operand:  # A in registers
        pb_, ldb = operand["b"]
        name = (f"tiled::gemm_rs<{CTYPE[dtypes.canonical_name(a.dtype)]}, {M}, {N}, {K}, "
                f"{lay.warp_m}, {tb}, {ldb}{base}>")
        T.evaluate(T.call_extern("void", name, T.address_of(low.tir[g.a][0]), pb_, pc))
        return
    (pa, lda), (pb_, ldb) = operand["a"], operand["b"]
    if isinstance(lay, MmaLayout):
        ct = "half" if halves else CTYPE[dtypes.canonical_name(a.dtype)]
        name = (f"tiled::gemm_ss<{ct}, {M}, {N}, {K}, "
                f"{lay.warp_m}, {lay.warp_n}, {ta}, {tb}, {lda}, {ldb}{base}>")
    else:
        ct = [CTYPE.get(dtypes.canonical_name(x.dtype)) for x in (a, b, c)]
        if None in ct:
            raise CompileError(f"T.gemm on cuda does not support dtypes "
                               f"{[dtypes.canonical_name(x.dtype) for x in (a, b, c)]}")
        # float8 operands: bytes on archs TVM gives no float8 type (gemm_ss_simt_bytes).
        simt = "gemm_ss_simt_bytes" if any(dtypes.canonical_name(x.dtype).startswith("float8")
                                           for x in (a, b)) else "gemm_ss_simt"
        name = (f"tiled::{simt}<{ct[0]}, {ct[1]}, {ct[2]}, {M}, {N}, {K}, "
                f"{low.threads}, {ta}, {tb}, {lda}, {ldb}{base}>")
    T.evaluate(T.call_extern("void", name, pa, pb_, pc))
