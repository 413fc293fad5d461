"""Row-wise kernels: RMSNorm and LayerNorm (TileLang's norm examples' shape: a block of rows
sliced into shared memory, squared or centred in fragments, a row reduction, in-place
scaling) and a softmax with an infinity-initialised max."""

import math

import numpy as np

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register


@tiled.jit(out_idx=[-1])
def rms_norm(M, N, blk_m=4, eps=1e-6, dtype="float16", threads=128):
    Mdyn = T.dyn("M")

    @T.prim_func
    def main(X: T.Tensor([Mdyn, N], dtype), W: T.Buffer([N], dtype),
             Y: T.Tensor([Mdyn, N], dtype)):
        with T.Kernel(T.ceildiv(Mdyn, blk_m), threads=threads) as bx:
            x_shared = T.alloc_shared((blk_m, N), dtype)
            x_local = T.alloc_fragment((blk_m, N), "float32")
            sq = T.alloc_fragment((blk_m, N), "float32")
            rms = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m:(bx + 1) * blk_m, :], x_shared)
            T.copy(x_shared, x_local)
            for i, j in T.Parallel(blk_m, N):
                sq[i, j] = x_local[i, j] * x_local[i, j]
            T.reduce_sum(sq, rms, dim=1)
            for i in T.Parallel(blk_m):
                rms[i] = T.rsqrt(rms[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                x_local[i, j] *= rms[i] * W[j]
            T.copy(x_local, Y[bx * blk_m:(bx + 1) * blk_m, :])

    return main


def _rms_ref(x, s):
    v, w = x
    return v / np.sqrt((v * v).mean(axis=1, keepdims=True) + 1e-6) * w


register(Case(
    "rms_norm", "rms_norm",
    ("slice", "full_slice", "annotations", "copy_g2s", "copy_s2f", "copy_f2g", "reduce",
     "inplace", "symbolic", "jit", "prim_func"),
    factory=rms_norm,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float16"),
                           (rng.standard_normal(s["N"]), "float16")],
    reference=_rms_ref, tol=2e-3,
    cpu={"M": 9, "N": 256}, gpu={"M": 32768, "N": 4096, "blk_m": 1},
    work=lambda s: ("bytes", 2 * 2 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.nn.functional.rms_norm(
        x[0], (s["N"],), x[1], 1e-6))))


@tiled.jit(out_idx=[-1])
def layer_norm(M, N, blk_m=4, eps=1e-5, dtype="float32", threads=128):
    Mdyn = T.dyn("M")

    @T.macro
    def row_mean(src: T.FragmentBuffer([blk_m, N], "float32"),
                 dst: T.FragmentBuffer([blk_m], "float32")):
        T.reduce_sum(src, dst, dim=1)
        for i in T.Parallel(blk_m):
            dst[i] /= N

    @T.prim_func
    def main(X: T.Tensor([Mdyn, N], dtype), Y: T.Tensor([Mdyn, N], dtype)):
        with T.Kernel(T.ceildiv(Mdyn, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            d2 = T.alloc_fragment((blk_m, N), "float32")
            mean = T.alloc_fragment((blk_m,), "float32")
            var = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m:(bx + 1) * blk_m, :], x)
            row_mean(x, mean)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] -= mean[i]
                d2[i, j] = x[i, j] * x[i, j]
            row_mean(d2, var)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] /= T.sqrt(var[i] + eps)
            T.copy(x, Y[bx * blk_m:(bx + 1) * blk_m, :])

    return main


def _ln_ref(x, s):
    v = x[0]
    c = v - v.mean(axis=1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5)


register(Case(
    "layer_norm", "layer_norm",
    ("macro", "annotations", "slice", "full_slice", "copy_g2f", "copy_f2g", "reduce", "inplace",
     "jit", "prim_func"),
    factory=layer_norm,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32")],
    reference=_ln_ref, tol=1e-5,
    cpu={"M": 9, "N": 128}, gpu={"M": 32768, "N": 4096, "blk_m": 1},
    work=lambda s: ("bytes", 2 * 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.nn.functional.layer_norm(x[0], (s["N"],)))))


@tiled.jit(out_idx=[-1])
def softmax(M, N, blk_m=4, dtype="float32", threads=128):
    Mdyn = T.dyn("M")
    log2e = math.log2(math.e)

    @T.prim_func
    def main(X: T.Tensor((Mdyn, N), dtype), Y: T.Tensor((Mdyn, N), dtype)):
        with T.Kernel(T.ceildiv(Mdyn, blk_m), threads=threads) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            row_max = T.alloc_fragment((blk_m,), "float32")
            row_sum = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.fill(row_max, -T.infinity("float32"))
            T.reduce_max(x, row_max, dim=1, clear=False)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = T.exp2((x[i, j] - row_max[i]) * log2e)
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] /= row_sum[i]
            T.copy(x, Y[bx * blk_m, 0])

    return main


def _softmax_ref(x, s):
    e = np.exp(x[0] - x[0].max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


register(Case(
    "softmax", "softmax", ("infinity", "reduce", "inplace", "copy_g2f", "copy_f2g", "jit"),
    factory=softmax,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["N"])), "float32")],
    reference=_softmax_ref, tol=1e-5,
    cpu={"M": 11, "N": 256}, gpu={"M": 32768, "N": 4096, "blk_m": 1},
    work=lambda s: ("bytes", 2 * 4 * s["M"] * s["N"]),
    torch_op=lambda torch, x, s: (lambda: torch.softmax(x[0], dim=1))))
