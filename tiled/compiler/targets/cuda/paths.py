"""Which path lowers a program's loops on CUDA (lower.CudaLowering asks once, at its start).

On sm_90a with warp specialization (the default) three paths are tried, in this order:

1. the whole-kernel attention path (`sm90_attn.py`): the repo's own attention example;
2. per op: each gemm that fits takes wgmma (`gemm_sm90.plan_wgmma`), and a T.Pipelined loop
   whose copies can run ahead is fed by a TMA producer warpgroup (`ws_plan.plan_ws_loop`);
3. otherwise sm_80's instructions (mma.sync, a cp.async pipeline).

A whole-kernel GEMM path (a loop of exactly "copy A, copy B, gemm", sm90_gemm.py) came
before the per-op one; the per-op path took its loops one kind at a time as it caught up,
each measured on the H200 in one process against it: 16-bit GEMMs (every y = x W^T kernel of
tiled.ops.linear, 96 kernels, 0.96-1.49x its speed, median 1.04x, the best of each size
never slower: linear_h200_per_op_twins.json; the seed's GEMM and the conformance suite's
within 1-3%: seed_gemm_h200.json, conformance_h200_gemms_per_op.json), float8 GEMMs
(tiled.ops.fp8's per-tensor kernel at its four configs, 0.99-1.17x: fp8_paths_h200.json) and
16-row x tiles (wgmma n16; the fastest per size 0.997-1.08x its fastest:
sixteen_paths_h200.json). What it had left, two-CTA clusters with multicast loads (the
option `cluster=2`), ran slower than no clusters (hopper_gemm_h200_cluster.json: 128 x 256
tiles 650 against 681 TFLOP/s at 4096^3), and went with it.

Without sm_90a only the last applies (wgmma per gemm too on sm_90a without warp
specialization).
"""

from __future__ import annotations

from tiled.compiler.targets.cuda.gemm_sm90 import WgmmaOps, plan_wgmma
from tiled.compiler.targets.cuda.layouts import infer_layouts
from tiled.compiler.targets.cuda.sm90_attn import find_ws_attention
from tiled.compiler.targets.cuda.ws_plan import PRODUCER_THREADS, plan_ws_loop


def choose_paths(low, hopper: bool, whole_kernel: bool) -> None:
    """Sets low.attn (the whole-kernel attention plan or None), low.layouts, low.wgmma_ops,
    low.wsloop and low.launch_threads (the program's threads plus a producer's) for `low`'s
    program. `hopper`: sm_90a with warp specialization; `whole_kernel`: the whole-kernel
    attention path may match."""
    p = low.program
    low.attn = find_ws_attention(p) if hopper and whole_kernel else None
    low.layouts = low.infer_layouts(p, low.attn.accumulators() if low.attn else None)
    low.wgmma_ops = WgmmaOps()
    per_op = low.attn is None and not low.explicit
    if low.arch == "sm_90a" and per_op:
        ops, layouts = plan_wgmma(p, infer_layouts)
        if ops:
            low.layouts, low.wgmma_ops = layouts, ops
    low.wsloop = plan_ws_loop(low) if hopper and per_op else None
    low.launch_threads = low.threads + (low.wsloop.producer_threads if low.wsloop else 0)
    if low.attn is not None:
        low.launch_threads = low.threads + PRODUCER_THREADS
        low.ws_offset = 0
