"""Which path lowers a program's loops on CUDA (lower.CudaLowering asks once, at its start).

On sm_90a with warp specialization (the default) four paths are tried, in this order:

1. the whole-kernel attention path (`sm90_attn.py`): the repo's own attention example;
2. the whole-kernel GEMM path (`sm90_gemm.py`): a loop of exactly "copy A, copy B, gemm". It
   keeps only the clusters the option `cluster=2` asks for, and loops the per-op path cannot
   feed from a TMA ring with wgmma. tiled.ops.linear's 16-row swaps (wgmma n16) take the
   per-op path: of its six such configs at three weights and 1 / 16 tokens, the fastest per
   size ran 0.997-1.08x the whole path's fastest (benchmarks/results/sixteen_paths_h200.json;
   config by config 0.875-1.21x, the slower ones never a size's best). 16-bit GEMMs take the
   per-op path: on every y = x W^T kernel of tiled.ops.linear it ran as fast or faster (96
   kernels, 0.96-1.49x, median 1.04x; the best of each size never slower,
   benchmarks/results/linear_h200_per_op_twins.json), on the seed's GEMM and the conformance
   suite's within 1-3% (seed_gemm_h200.json, conformance_h200_gemms_per_op.json); so do float8
   GEMMs: tiled.ops.fp8's per-tensor kernel at its four configs, 4096^3 and 8192^3, ran
   0.99-1.17x the whole path's speed (best per-op 1.10x / 1.06x torch._scaled_mm against the
   whole path's best 1.07x / 1.03x, benchmarks/results/fp8_paths_h200.json);
3. per op: each gemm that fits takes wgmma (`gemm_sm90.plan_wgmma`), and a T.Pipelined loop
   whose copies can run ahead is fed by a TMA producer warpgroup (`ws_plan.plan_ws_loop`);
4. otherwise sm_80's instructions (mma.sync, a cp.async pipeline).

Without sm_90a only the last applies (wgmma per gemm too on sm_90a without warp
specialization).
"""

from __future__ import annotations

from tiled.compiler.targets.cuda.gemm_sm90 import WgmmaOps, plan_wgmma
from tiled.compiler.targets.cuda.layouts import infer_layouts
from tiled.compiler.targets.cuda.sm90_attn import find_ws_attention
from tiled.compiler.targets.cuda.sm90_gemm import find_ws_gemm
from tiled.compiler.targets.cuda.ws_plan import PRODUCER_THREADS, plan_ws_loop


def choose_paths(low, hopper: bool, whole_kernel: bool, cluster: int) -> None:
    """Sets low.attn, low.ws (the whole-kernel plans or None), low.layouts, low.wgmma_ops,
    low.wsloop and low.launch_threads (the program's threads plus a producer warpgroup's)
    for `low`'s program. `hopper`: sm_90a with warp specialization; `whole_kernel`: the
    whole-kernel paths may match."""
    p = low.program
    whole = hopper and whole_kernel
    low.attn = find_ws_attention(p) if whole else None
    low.layouts = low.infer_layouts(p, low.attn.accumulators() if low.attn else None)
    ws = find_ws_gemm(p, low.layouts) if whole and not low.attn else None
    keep = ws is not None and cluster == 2
    mma_layouts = low.layouts
    low.ws = None
    low.wgmma_ops = WgmmaOps()
    per_op = low.attn is None and not low.explicit and not keep
    if low.arch == "sm_90a" and per_op:
        ops, layouts = plan_wgmma(p, infer_layouts)
        if ops:
            low.layouts, low.wgmma_ops = layouts, ops
    low.wsloop = plan_ws_loop(low) if hopper and per_op else None
    if ws is not None and (keep or low.wsloop is None or
                           ws.c not in low.wgmma_ops.accumulators):
        low.ws, low.layouts, low.wgmma_ops, low.wsloop = ws, mma_layouts, WgmmaOps(), None
    low.launch_threads = low.threads + (low.wsloop.producer_threads if low.wsloop else 0)
    if low.ws is not None:
        mma = low.layouts[low.ws.c]
        for bid, lay in low.layouts.items():  # fragments that followed the accumulator
            if lay == mma:
                low.layouts[bid] = low.ws.layout
            elif lay is not None and lay == mma.rows():
                low.layouts[bid] = low.ws.layout.rows()
    if low.ws is not None or low.attn is not None:
        low.launch_threads = low.threads + PRODUCER_THREADS
        low.ws_offset = 0
