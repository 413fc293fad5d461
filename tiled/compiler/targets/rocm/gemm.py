"""T.gemm on ROCm: MFMA (tiled_hip.h's `tiled::gemm_mfma`) where layout inference gave the
accumulator the MFMA layout (layouts.MfmaLayout), else the CUDA lowering's SIMT gemm
(`tiled::gemm_ss_simt`, a cyclic accumulator), which tiled_hip.h implements too.

Operands are read from LDS: a shared tile where it lies (rows padded by 8 16-bit elements,
as the pool pads every gemm operand), a fragment operand staged into the LDS scratch area
first (cuda/gemm.py's staging: its threads write it out row-major, a barrier). Each wave
reads, per 16 x 16 output tile and K step, its lanes' A and B registers in AMD's documented
operand layouts and issues one MFMA: f16, bf16 (16x16x16), f32 (16x16x4), int8 (16x16x16
on gfx90a, 16x16x32 on gfx942) and, on gfx942, fp8 / bf8 (16x16x32; tiled's float8 are the
OCP formats, which gfx942's MFMA reads as its FNUZ formats: tiled_hip.h says how the
result is made exact).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.resources import align_up
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.gemm import (
    lower_gemm,
    stage_fragment,
    stage_stride,
    staged_operands,
)
from tiled.compiler.targets.rocm.layouts import MfmaLayout
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


def lower_mfma_gemm(low, g: pb.Gemm, s: pb.Stmt) -> None:
    lay = low.layouts[g.c]
    if not isinstance(lay, MfmaLayout):
        return lower_gemm(low, g, s)  # the SIMT gemm (cyclic accumulator)
    a, b, c = (low.buffers[x] for x in (g.a, g.b, g.c))
    operand = {}  # role -> (pointer, leading dimension)
    staged = staged_operands(low, g)
    if staged:
        low.sync.before(False, True)
        offset = 0
        for role in staged:
            bid = getattr(g, role)
            buf = low.buffers[bid]
            offset = align_up(offset)
            tile = stage_fragment(low, bid, offset)
            operand[role] = (T.address_of(tile[0, 0]), stage_stride(buf))
            offset += buf.shape[0].size * stage_stride(buf) * dtypes.nbytes(buf.dtype)
        low.sync.before(True, False)  # the gemm reads the staged tiles (and the shared ones)
    else:
        low.uniform_stmt(s)
    for role, index in (("a", g.a_index), ("b", g.b_index)):
        bid = getattr(g, role)
        if role not in operand:  # a shared tile, from its leading indices (A_s[stage, :, :])
            operand[role] = (low.addr(bid, [low.expr(i) for i in index]
                                      + [tirx.const(0, "int32")] * 2), low.shared[bid].stride)
    acc = low.tir[g.c]
    if g.clear_accum:
        with low.loop(lay.local_size) as idx:
            T.buffer_store(acc, tirx.const(0, acc.dtype), [idx])
    M, N = (d.size for d in c.shape)
    K = (a.shape[-2] if g.transpose_a else a.shape[-1]).size
    ct = [CTYPE[dtypes.canonical_name(x.dtype)] for x in (a, b, c)]
    (pa, lda), (pb_, ldb) = operand["a"], operand["b"]
    name = (f"tiled::gemm_mfma<{ct[0]}, {ct[1]}, {ct[2]}, {M}, {N}, {K}, {lay.warp_m}, "
            f"{lay.warp_n}, {str(g.transpose_a).lower()}, {str(g.transpose_b).lower()}, "
            f"{lda}, {ldb}>")
    T.evaluate(T.call_extern("void", name, pa, pb_, T.address_of(acc[0])))
