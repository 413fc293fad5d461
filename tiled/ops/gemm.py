"""tiled.ops.linear (this module, tiled.ops.gemm): y = x @ w.T (F.linear's layout, w [N, K]),
tuned by tiled.autotune over the kernel shapes benchmarks/gpu/linear.py measured on the H200,
per bucket of token counts.

Two kernel forms, both with the token count M symbolic (one compile serves a whole bucket):
- `tile`: BM x BN output tiles, x and w tiles copied per 64-wide K step, T.gemm with
  transpose_B (on sm_90a the whole-kernel warp-specialized GEMM path takes it);
- `swap`: y^T = w @ x^T for few tokens, so that w's rows fill the MMA's M side and the tokens
  its N side; with `splits` > 1, split-K over a third grid axis, each split atomically adding
  its float32 partial into a zeroed float32 buffer that is cast after.
"""

import tiled
import tiled.lang as T
from tiled.ops.tuned import TunedOp

BK = 64

# (name, kind, args) per target kind; args: tile (BM, BN, threads), swap (BW, BX, threads,
# splits). The CUDA space is the candidates of benchmarks/results/linear_h200.json.
CUDA_SPACE = [
    {"kind": "tile", "BM": 128, "BN": 256, "threads": 256},
    {"kind": "tile", "BM": 128, "BN": 128, "threads": 256},
    {"kind": "tile", "BM": 64, "BN": 128, "threads": 128},
    {"kind": "tile", "BM": 64, "BN": 256, "threads": 128},
    *({"kind": "swap", "BM": bx, "BN": bw, "threads": t, "splits": s}
      for bx in (64, 128) for bw, t in ((128, 256), (64, 128)) for s in (1, 2, 4)),
]
CPU_SPACE = [
    {"kind": "tile", "BM": 32, "BN": 32, "threads": 128},
    {"kind": "tile", "BM": 16, "BN": 64, "threads": 128},
]


def token_bucket(M: int, N: int, K: int, dtype: str, out_dtype: str):
    """The token counts one tuning serves: 1, 2, ... powers of two up to 4096, then 8192+."""
    m = 1
    while m < M and m < 8192:
        m *= 2
    return m, N, K, dtype, out_dtype


def _fits(cfg: dict, M: int) -> bool:
    """Swap kernels are for few tokens (their BX covers M), tiles for the rest."""
    if cfg["kind"] == "swap":
        return cfg["BM"] >= M
    return M >= 64 or cfg["BM"] == 64 or cfg["BM"] <= 32


def linear_kernel(M, N, K, dtype, out_dtype, kind="tile", BM=128, BN=128, threads=128,
                  splits=1, stages=4):
    """The kernel of one config (M only selects: the kernel's M is symbolic)."""
    if not _fits({"kind": kind, "BM": BM}, M):
        raise ValueError(f"config {kind} {BM}x{BN} is not for M = {M}")
    Md = T.dyn("M")
    if kind == "tile":
        @tiled.kernel
        def linear_tile(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype),
                        Y: T.Tensor((Md, N), out_dtype)):
            with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
                xs = T.alloc_shared((BM, BK), dtype)
                ws = T.alloc_shared((BN, BK), dtype)
                acc = T.alloc_fragment((BM, BN), "float32")
                T.clear(acc)
                for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                    T.copy(X[by * BM, k * BK], xs)
                    T.copy(Wt[bx * BN, k * BK], ws)
                    T.gemm(xs, ws, acc, transpose_B=True)
                T.copy(acc, Y[by * BM, bx * BN])
        return linear_tile

    BW, BX = BN, BM  # swap: w rows per block, tokens per block
    steps = -(-K // BK)
    per_split = -(-steps // splits)
    acc_dtype = out_dtype if splits == 1 else "float32"

    @tiled.kernel
    def linear_swap(X: T.Tensor((Md, K), dtype), Wt: T.Tensor((N, K), dtype),
                    Y: T.Tensor((Md, N), acc_dtype)):
        with T.Kernel(T.ceildiv(N, BW), T.ceildiv(Md, BX), splits, threads=threads) as (
                bx, by, bz):
            ws = T.alloc_shared((BW, BK), dtype)
            xs = T.alloc_shared((BX, BK), dtype)
            acc = T.alloc_fragment((BW, BX), "float32")
            T.clear(acc)
            for k in T.Pipelined(per_split, num_stages=stages):
                T.copy(Wt[bx * BW, (bz * per_split + k) * BK], ws)
                T.copy(X[by * BX, (bz * per_split + k) * BK], xs)
                T.gemm(ws, xs, acc, transpose_B=True)
            for i, j in T.Parallel(BW, BX):  # rows past M or N: the guards drop them
                if splits == 1:
                    Y[by * BX + j, bx * BW + i] = acc[i, j]
                else:
                    T.atomic_add(Y[by * BX + j, bx * BW + i], acc[i, j])
    return linear_swap


def matmul_kernel(M, N, K, dtype, out_dtype, kind="tile", BM=128, BN=128, threads=128,
                  stages=4):
    """C = A @ B for A [M, K] and B [K, N] row-major (B's tiles K x N: wgmma's N-major B
    operand), M symbolic; the tile configs of linear's space (`kind` must be "tile")."""
    if kind != "tile":
        raise ValueError(f"matmul takes tile configs, not {kind!r}")
    Md = T.dyn("M")

    @tiled.kernel
    def matmul_tile(A: T.Tensor((Md, K), dtype), B: T.Tensor((K, N), dtype),
                    C: T.Tensor((Md, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), dtype)
            b_s = T.alloc_shared((BK, BN), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=stages):
                T.copy(A[by * BM, k * BK], a_s)
                T.copy(B[k * BK, bx * BN], b_s)
                T.gemm(a_s, b_s, acc)
            T.copy(acc, C[by * BM, bx * BN])
    return matmul_tile


def _matmul_inputs(M, N, K, dtype, out_dtype, **config):
    x, w, y = _inputs(M, N, K, dtype, out_dtype)
    return [x, w.t().contiguous(), y]


def _inputs(M, N, K, dtype, out_dtype, **config):
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    x = torch.randn(M, K, device=dev, generator=g).to(dt)
    w = (torch.randn(N, K, device=dev, generator=g) / K ** 0.5).to(dt)
    out = "float32" if config.get("splits", 1) > 1 else out_dtype
    return [x, w, torch.zeros(M, N, device=dev, dtype=_torch_dtype(torch, out))]


def _run(kernel, config, args, out_dtype=None):
    """y = x @ w.T by `kernel` of `config` into args' y, as linear runs it and so as its
    candidates are timed: split-K zeroes its float32 y first and returns it cast to
    `out_dtype` (default x's) after."""
    x, w, y = args
    if config.get("splits", 1) == 1:
        kernel(x, w, y)
        return y
    y.zero_()
    kernel(x, w, y)
    return y.to(out_dtype or x.dtype)


def _launch(tuned, x2, w, odt):
    """y = x2 @ w.T in dtype `odt` through the tuned kernel."""
    import torch

    M, N = x2.shape[0], w.shape[0]
    if not M:
        return torch.empty(0, N, device=x2.device, dtype=odt)
    acc = torch.float32 if tuned.config.get("splits", 1) > 1 else odt
    return _run(tuned.compiled, tuned.config,
                [x2, w, torch.empty(M, N, device=x2.device, dtype=acc)], odt)


LINEAR = TunedOp("linear", linear_kernel, {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                 key=["M", "N", "K", "dtype", "out_dtype"], bucket=token_bucket,
                 inputs=_inputs, run=_run)
MATMUL = TunedOp("matmul", matmul_kernel,
                 {kind: [c for c in space if c["kind"] == "tile"]
                  for kind, space in (("cuda", CUDA_SPACE), ("cpu", CPU_SPACE))},
                 key=["M", "N", "K", "dtype", "out_dtype"], bucket=token_bucket,
                 inputs=_matmul_inputs)


def _operands(op: str, x, w, out_dtype):
    """(x as [M, K] rows, its dtype name, the output's torch dtype and name) for a bf16 / fp16
    GEMM of x and w; raises for operands of other dtypes or devices."""
    from tiled.ops import _dtype, _rows

    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"tiled.ops.{op}: the operands are {x.dtype} on {x.device} and "
                         f"{w.dtype} on {w.device}")
    dtype = _dtype(x, op)
    if dtype == "float32":
        raise TypeError(f"tiled.ops.{op}: float32 inputs are not supported (bf16 or fp16)")
    odt = out_dtype or x.dtype
    return _rows(x.contiguous(), op), dtype, odt, str(odt).removeprefix("torch.")


def linear(x, w, bias=None, out_dtype=None):
    """x @ w.T (+ bias) for x [..., K] and w [N, K] (bf16 / fp16), in `out_dtype` (default
    x's). The kernel is chosen by tiled.autotune per token-count bucket, then kept."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"tiled.ops.linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not "
                         "multiply as x @ w.T")
    x2, dtype, odt, out_name = _operands("linear", x, w, out_dtype)
    (M, K), N = x2.shape, w.shape[0]
    tuned = LINEAR.tuned(x, M, N, K, dtype, out_name)
    y = _launch(tuned, x2, w.contiguous(), odt)
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], N)


def matmul(a, b, out_dtype=None):
    """a @ b for a [..., K] and a 2-D b [K, N] (bf16 / fp16), in `out_dtype` (default a's),
    by a tile kernel tiled.autotune picks per token-count bucket. A batched b is refused."""
    import torch

    if b.dim() != 2 or a.dim() < 1 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"tiled.ops.matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not "
                         "multiply as a @ b with a 2-D b")
    a2, dtype, odt, out_name = _operands("matmul", a, b, out_dtype)
    (M, K), N = a2.shape, b.shape[1]
    tuned = MATMUL.tuned(a, M, N, K, dtype, out_name)
    y = torch.empty(M, N, device=a.device, dtype=odt)
    if M:
        tuned.compiled(a2, b.contiguous(), y)
    return y.view(*a.shape[:-1], N)
