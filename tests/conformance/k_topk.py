"""Top-k gating the way TileLang's topk example writes it: a block of rows in a fragment,
k rounds of a row max, the column index where it occurs (an int32 fragment built with
`T.if_then_else` and reduced with T.reduce_max), the winner masked out; gates and indices
written per round."""

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[1, 2])
def topk_gating(M, N, topk, blk_m=64, threads=128):
    dtype = "float32"

    @T.prim_func
    def topk_kernel(logits: T.Tensor([M, N], dtype), gates: T.Tensor([M, topk], dtype),
                    indices: T.Tensor([M, topk], "int32")):
        with T.Kernel(T.ceildiv(M, blk_m), threads=threads) as bx:
            rows = T.alloc_fragment([blk_m, N], dtype=dtype)
            best = T.alloc_fragment([blk_m], dtype=dtype)
            where = T.alloc_fragment([blk_m, N], "int32")
            best_col = T.alloc_fragment([blk_m], "int32")
            T.copy(logits[bx * blk_m, 0], rows)
            for k in T.serial(topk):
                T.fill(where, -1)
                T.reduce_max(rows, best, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    where[i, j] = T.if_then_else(best[i] == rows[i, j], j, where[i, j])
                T.reduce_max(where, best_col, dim=1, clear=True)
                for i, j in T.Parallel(blk_m, N):
                    rows[i, j] = T.if_then_else(best[i] == rows[i, j], -10000.0, rows[i, j])
                for i in T.Parallel(blk_m):
                    gates[bx * blk_m + i, k] = best[i]
                    indices[bx * blk_m + i, k] = best_col[i]

    return topk_kernel


def _topk_inputs(rng, s):
    return [(rng.random((s["M"], s["N"])), "float32")]  # distinct values: no ties


def _topk_ref(x, s):
    order = np.argsort(-x[0], axis=1, kind="stable")[:, :s["topk"]]
    return [np.take_along_axis(x[0], order, 1), order]


register(Case(
    "topk_gating", "topk", ("reduce", "if", "parallel", "copy_g2f", "prim_func", "jit"),
    factory=topk_gating, inputs=_topk_inputs, reference=_topk_ref, tol=0.0,
    cpu={"M": 100, "N": 64, "topk": 4},  # a ragged last block of rows
    gpu={"M": 32768, "N": 128, "topk": 6},
    work=lambda s: ("bytes", 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.topk(x[0], s["topk"], dim=1))))
