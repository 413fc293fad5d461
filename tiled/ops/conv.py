"""tiled.ops.conv2d (this module, tiled.ops.conv): 2-D convolution as an implicit GEMM.

    conv2d(x, w, bias=None, stride=1, padding=0, dilation=1) -> y
        as F.conv2d: x [N, C, H, W], w [F, C, R, S], y [N, F, P, Q] (groups = 1). The kernel
        reads x and w channels-last (x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1): free for
        channels_last tensors, a copy otherwise) and returns y channels_last.

The GEMM is Y[n p q, f] = sum over (r, s, c) of X[n, p stride + r dil - pad, q stride + s dil
- pad, c] * W[f, r, s, c]: M = N P Q output pixels, N = F filters, K = R S C. Each K step is
one (r, s) tap and BC channels: the pixels' input rows gathered into a shared tile (zero where
the tap falls in the padding), the filters' tile copied, T.gemm. On sm_90a, when the channels
fill whole steps, the gather is a ring copy of the warp-specialized loop (its producer
warpgroup issues the rows as cp.async vectors, the filters' tile by TMA:
targets/cuda/ws_loop.py); elsewhere both tiles are cp.async producers issued stages ahead
(targets/cuda/gather.py). Configs with `splits` split the K steps over a third grid axis (for
layers whose output tiles do not fill the GPU), their float32 partials added up by
`splitk_sum`. Tuned by tiled.autotune per layer shape (the batch symbolic). A 1x1
convolution with stride 1 and no padding is a plain GEMM and runs as tiled.ops.linear.
"""

import tiled
import tiled.lang as T
from tiled.ops.split_k import add_up_last
from tiled.ops.tuned import TunedOp, pow2_bucket

CUDA_SPACE = [*({"BM": bm, "BN": bn, "BC": bc, "threads": t, "stages": st}
                for bm, bn, t in ((128, 128, 256), (64, 128, 128), (128, 64, 128))
                for bc, st in ((32, 2), (64, 2), (64, 3))),
              # more output per gathered byte (128 x 256, 256 x 128) and deeper rings: each
              # takes wgmma without local memory on sm_90a (SASS read here); not timed yet
              *({"BM": bm, "BN": bn, "BC": 64, "threads": 256, "stages": 3}
                for bm, bn in ((128, 256), (256, 128))),
              *({"BM": 128, "BN": 128, "BC": bc, "threads": 256, "stages": 4} for bc in (32, 64)),
              # split-K over the taps, for layers whose output tiles do not fill the GPU (few
              # pixels, many channels: UNet's 8 x 8 and 16 x 16 latents, ResNet's conv5)
              *({"BM": 128, "BN": 128, "BC": 64, "threads": 256, "stages": 4, "splits": sp}
                for sp in (3, 6)),
              {"BM": 64, "BN": 128, "BC": 64, "threads": 128, "stages": 3, "splits": 3},
              # tiles sized so that more layers' outputs fill the SMs in whole waves: 160
              # filters (640 / 1280-filter layers: 4 / 8 column tiles), 192 pixels (three
              # consumer warpgroups)
              *({"BM": bm, "BN": 160, "BC": 64, "threads": t, "stages": 4}
                for bm, t in ((128, 256), (64, 128))),
              {"BM": 64, "BN": 160, "BC": 64, "threads": 128, "stages": 4, "splits": 4},
              {"BM": 192, "BN": 128, "BC": 64, "threads": 384, "stages": 4}]
# (The split configs with their sum in the kernel, sum="last" (tiled.ops.split_k), are not in
# the space until a GPU has timed them: tiled/ops/gemm.py's LAST_SUM_CONFIGS says why.)
# CPU: 128 x 64 and 256 x 64 pixel x filter tiles over 64 channels a step for layers of at
# least 64 input and output channels (`min_channels`), 16 x 16 x 16 for the rest: bf16 3x3
# layers over 4 x 56 x 56 on the 2-core Zen 3, the wide tiles read 51-52 GFLOP/s at 64 -> 64
# channels and 82-88 at 128 -> 128 where 16 x 16 x 16 read 18 / 24, beside torch's CPU conv2d
# at 4-5 (NCHW) / 16-19 (channels-last) (benchmarks/results/cpu_conv.json).
CPU_SPACE = [*({"BM": bm, "BN": 64, "BC": 64, "threads": 128, "stages": 2, "min_channels": 64}
               for bm in (128, 256)),
             {"BM": 16, "BN": 16, "BC": 16, "threads": 32, "stages": 2}]


def _out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def conv2d_kernel(C, H, W, F, R, S, stride, pad, dil, dtype, bias, batch=8, BM=128, BN=128,
                  BC=32, threads=256, stages=2, min_channels=0, splits=1, sum="kernel"):
    """The implicit-GEMM kernel of one layer shape and config (the batch symbolic: `batch`
    only names the tuning, a power-of-two bucket of images the tuner times it at); a config
    with `min_channels` is for layers of at least that many input and output channels. With
    `splits` > 1 the K steps (taps x channel chunks) are split over a third grid axis and
    split s writes its float32 partial (the bias in split 0's) into P[s] ([splits, M, F]),
    which `splitk_sum` adds up and casts (`sum="kernel"`: the kernel's Y is P) or each
    tile's last split adds up in the same kernel (`sum="last"`: tiled.ops.split_k); the
    steps past the last (when `splits` does not divide them) read filter taps past R x S,
    which are zeros (T.copy's fill), so they add nothing."""
    if min(C, F) < min_channels:
        raise ValueError(f"conv2d: config {BM}x{BN}x{BC} is not for {C} -> {F} channels "
                         f"(from {min_channels})")
    if sum not in ("kernel", "last"):
        raise ValueError(f"conv2d: sum must be 'kernel' or 'last', got {sum!r}")
    P, Q = _out_size(H, R, stride, pad, dil), _out_size(W, S, stride, pad, dil)
    if P < 1 or Q < 1:
        raise ValueError(f"conv2d: a {R}x{S} filter leaves no output of a {H}x{W} input")
    chunks = -(-C // BC)
    per_split = -(-(R * S * chunks) // splits)  # K steps per split
    Nd, Md = T.dyn("N"), T.dyn("M")  # images, and output pixels N P Q
    y_t = T.Tensor((Md, F), dtype)
    out = y_t if splits == 1 else T.Tensor((splits, Md, F), "float32")
    extra = (splits,) if splits > 1 else ()  # the split axis of the grid
    x_t, w_t = T.Tensor((Nd, H, W, C), dtype), T.Tensor((F, R, S, C), dtype)
    b_t = T.Tensor((F if bias else 1,), dtype)
    tiles_n = -(-F // BN)

    @T.macro
    def tile_acc(X, Wt, Bias, acc, bx, by, bz):
        """acc = the output tile (by, bx)'s sum over split bz's K steps, with the bias in
        split 0's."""
        xs = T.alloc_shared((BM, BC), dtype)
        ws = T.alloc_shared((BN, BC), dtype)
        T.clear(acc)
        for k in T.Pipelined(per_split, num_stages=stages):
            step = bz * per_split + k
            tap, c0 = step // chunks, step % chunks * BC
            r, s = tap // S, tap % S
            T.copy(Wt[bx * BN:bx * BN + BN, r, s, c0:c0 + BC], ws)
            for i, c in T.Parallel(BM, BC):
                m = by * BM + i
                n, pq = m // (P * Q), m % (P * Q)
                h = pq // Q * stride + r * dil - pad
                w = pq % Q * stride + s * dil - pad
                inside = (m < Md) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
                if C % BC:  # (whole channel steps: a row's test holds for all of it)
                    inside = inside & (c0 + c < C)
                xs[i, c] = T.if_then_else(inside, X[n, h, w, c0 + c], 0)
            T.gemm(xs, ws, acc, transpose_B=True)
        if splits > 1 and sum == "kernel":
            T.pdl_trigger()  # splitk_sum, launched programmatically, may start
        if bias:
            for i, j in T.Parallel(BM, BN):
                b = T.cast(Bias[bx * BN + j], "float32")
                acc[i, j] += b if splits == 1 else T.if_then_else(bz == 0, b, 0.0)

    if splits > 1 and sum == "last":
        @tiled.kernel
        def conv2d_igemm_last(X: x_t, Wt: w_t, Bias: b_t, Y: y_t, Part: out,
                              Count: T.Tensor((T.dyn("tiles"),), "int32")):
            with T.Kernel(tiles_n, T.ceildiv(Md, BM), splits, threads=threads) as (bx, by, bz):
                acc = T.alloc_fragment((BM, BN), "float32")
                tile_acc(X, Wt, Bias, acc, bx, by, bz)
                T.copy(acc, Part[bz, by * BM, bx * BN])
                add_up_last(Part, Count, Y, by * tiles_n + bx, by * BM, bx * BN, BM, BN,
                            splits, dtype)
        return conv2d_igemm_last

    @tiled.kernel
    def conv2d_igemm(X: x_t, Wt: w_t, Bias: b_t, Y: out):
        with T.Kernel(tiles_n, T.ceildiv(Md, BM), *extra, threads=threads) as g:
            bx, by = g[:2]
            bz = g[2] if splits > 1 else 0
            acc = T.alloc_fragment((BM, BN), "float32")
            tile_acc(X, Wt, Bias, acc, bx, by, bz)
            # (a tile copy: vector stores, 16 bytes a lane from a wgmma accumulator)
            T.copy(acc, Y[by * BM, bx * BN] if splits == 1 else Y[bz, by * BM, bx * BN])

    return conv2d_igemm


# Images a tuning is timed at: a power of two up to this many (tiled.ops.tuned.pow2_bucket).
# Which tiles fill the GPU's SMs in whole waves depends on the pixel count, so a layer is
# tuned per bucket of its batch: tuned at 8 images, a UNet 16 x 16 x 1280 layer chose a
# 128 x 160 tile that read 101 us at its batch of 4, where a 64 x 160 tile read 66 us
# (benchmarks/results/conv_probe_h100.json).
BATCH_CAP = 64


def _bucket(C, H, W, F, R, S, stride, pad, dil, dtype, bias, batch):
    return C, H, W, F, R, S, stride, pad, dil, dtype, bias, pow2_bucket(batch, BATCH_CAP)


def _inputs(C, H, W, F, R, S, stride, pad, dil, dtype, bias, batch, **config):
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    N = batch if dev == "cuda" else 1
    P, Q = _out_size(H, R, stride, pad, dil), _out_size(W, S, stride, pad, dil)
    x = torch.randn(N, H, W, C, device=dev, generator=g).to(dt)
    w = (torch.randn(F, R, S, C, device=dev, generator=g) / (R * S * C) ** 0.5).to(dt)
    b = torch.randn(F if bias else 1, device=dev, generator=g).to(dt)
    return [x, w, b, torch.zeros(N * P * Q, F, device=dev, dtype=dt)]


def _run(kernel, config, args):
    """The layer by `kernel` of `config` into args' y, as conv2d runs it and so as its
    candidates are timed (split-K through split_k.run_split)."""
    from tiled.ops.split_k import run_split

    x, w, b, y = args
    return run_split(y, config, lambda *out: kernel(x, w, b, *out))


CONV2D = TunedOp("conv2d", conv2d_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                 key=["C", "H", "W", "F", "R", "S", "stride", "pad", "dil", "dtype", "bias",
                      "batch"],
                 bucket=_bucket, inputs=_inputs, run=_run)


def _pair(v, name: str) -> int:
    vals = (v, v) if isinstance(v, int) else tuple(v)
    if len(vals) != 2 or vals[0] != vals[1] or not all(isinstance(x, int) for x in vals):
        raise ValueError(f"tiled.ops.conv2d: {name} {v!r}: one int (or an equal pair) only")
    return vals[0]


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1):
    """F.conv2d(x, w, bias, stride, padding, dilation) (module docstring)."""
    import torch

    from tiled.ops import _dtype

    op = "conv2d"
    dtype = _dtype(x, op)
    stride, pad, dil = _pair(stride, "stride"), _pair(padding, "padding"), \
        _pair(dilation, "dilation")
    if stride < 1 or dil < 1 or pad < 0:
        raise ValueError(f"tiled.ops.{op}: stride {stride}, padding {pad}, dilation {dil}")
    if x.dim() != 4 or w.dim() != 4 or w.shape[1] != x.shape[1]:
        raise ValueError(f"tiled.ops.{op}: x {tuple(x.shape)} and w {tuple(w.shape)} are not "
                         "[N, C, H, W] and [F, C, R, S] with one C (groups = 1)")
    if w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"tiled.ops.{op}: w is {w.dtype} on {w.device}, x {x.dtype} on "
                         f"{x.device}")
    if bias is not None and (bias.shape != (w.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"tiled.ops.{op}: bias {tuple(bias.shape)} {bias.dtype}, expected "
                         f"({w.shape[0]},) {x.dtype}")
    N, C, H, W = x.shape
    F, _, R, S = w.shape
    P, Q = _out_size(H, R, stride, pad, dil), _out_size(W, S, stride, pad, dil)
    if P < 1 or Q < 1:
        raise ValueError(f"tiled.ops.{op}: a {R}x{S} filter leaves no output of {H}x{W}")
    if R == S == 1 and stride == 1 and pad == 0 and dtype in ("bfloat16", "float16"):
        # A 1x1 convolution is a GEMM of the pixels' channel rows: tiled.ops.linear's
        # kernels (the sm_90a warp-specialized GEMM) take it, x read in place when it is
        # channels_last.
        from tiled.ops.gemm import linear

        rows = x.permute(0, 2, 3, 1).reshape(N * H * W, C)
        y = linear(rows, w.reshape(F, C), bias)
        return y.view(N, H, W, F).permute(0, 3, 1, 2)
    y = torch.empty(N, P, Q, F, device=x.device, dtype=x.dtype)  # NHWC: channels_last
    if N:
        tuned = CONV2D.tuned(x, C, H, W, F, R, S, stride, pad, dil, dtype, bias is not None,
                             N)
        b = bias.contiguous() if bias is not None else x.new_empty(1)  # (unread placeholder)
        _run(tuned.compiled, tuned.config, [x.permute(0, 2, 3, 1).contiguous(),
                                            w.permute(0, 2, 3, 1).contiguous(), b,
                                            y.view(N * P * Q, F)])
    return y.permute(0, 3, 1, 2)
