"""T.im2col / T.c2d_im2col (TileLang's convolution operand tile): numerics on `cpu` and under
the ROCm emulation against a numpy convolution, the CUDA gather it lowers to, and located
errors for what it cannot take."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_cuda_tileops import kernel_body, source
from tiled.errors import KernelDefinitionError


def conv_kernel(N, C, H, W, F, K, S, D, P, BM, BN, BK, old_name=False, dyn_batch=False):
    """TileLang's convolution example, its Hopper branch: data NHWC, kernel [K, K, C, F]."""
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1
    Nd = T.dyn("N") if dyn_batch else N
    Md = T.dyn("M") if dyn_batch else N * OH * OW  # the output pixels
    gather = T.c2d_im2col if old_name else T.im2col

    @T.prim_func
    def conv(data: T.Tensor((Nd, H, W, C), "float32"), kernel: T.Tensor((K * K * C, F), "float32"),
             out: T.Tensor((Md, F), "float32")):
        with T.Kernel(T.ceildiv(F, BN), T.ceildiv(Nd * OH * OW, BM), threads=128) as (bx, by):
            data_shared = T.alloc_shared((BM, BK), "float32")
            kernel_shared = T.alloc_shared((BK, BN), "float32")
            out_local = T.alloc_fragment((BM, BN), "float32")
            T.clear(out_local)
            for k_iter in T.Pipelined(T.ceildiv(K * K * C, BK), num_stages=2):
                gather(data, data_shared, by, k_iter, K, S, D, P)
                T.copy(kernel[k_iter * BK, bx * BN], kernel_shared)
                T.gemm(data_shared, kernel_shared, out_local)
            T.copy(out_local, out[by * BM, bx * BN])

    return conv


def reference(x, w, K, S, D, P):
    n, h, wd, c = x.shape
    oh, ow = (h + 2 * P - D * (K - 1) - 1) // S + 1, (wd + 2 * P - D * (K - 1) - 1) // S + 1
    pad = np.pad(x, ((0, 0), (P, P), (P, P), (0, 0)))
    taps = [pad[:, i * D:i * D + S * (oh - 1) + 1:S, j * D:j * D + S * (ow - 1) + 1:S, :]
            for i in range(K) for j in range(K)]
    cols = np.stack(taps, 3).reshape(n * oh * ow, K * K * c)
    return cols @ w


SHAPES = [  # N, C, H, W, F, K, S, D, P, BM, BN, BK
    (2, 8, 9, 7, 24, 3, 1, 1, 1, 32, 16, 16),   # pixels and taps past the last tile
    (1, 6, 11, 10, 16, 3, 2, 1, 1, 16, 16, 8),  # stride 2; C not a multiple of BK
    (2, 4, 12, 12, 8, 3, 1, 2, 2, 32, 8, 16),   # dilation 2
    (1, 16, 6, 5, 16, 1, 1, 1, 0, 16, 16, 16),  # 1x1
    (2, 16, 9, 9, 16, 3, 2, 1, 1, 32, 16, 8),   # whole channel steps (BK divides C), stride 2
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("target", ["cpu", "rocm:gfx942"])
def test_im2col_convolution_matches_numpy(shape, target):
    N, C, H, W, F, K, S, D, P, BM, BN, BK = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, H, W, C)).astype(np.float32)
    w = rng.standard_normal((K * K * C, F)).astype(np.float32)
    want = reference(x, w, K, S, D, P)
    y = np.zeros_like(want)
    k = conv_kernel(N, C, H, W, F, K, S, D, P, BM, BN, BK, old_name=target == "cpu")
    c = tiled.compile(k, target=target, cache=False)
    if target == "cpu":
        c(x, w, y)
    else:
        c.emulate(x, w, y)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_a_symbolic_batch():
    rng = np.random.default_rng(1)
    k = conv_kernel(None, 8, 9, 7, 24, 3, 1, 1, 1, 32, 16, 16, dyn_batch=True)
    c = tiled.compile(k, target="cpu", cache=False)
    for n in (1, 3):
        x = rng.standard_normal((n, 9, 7, 8)).astype(np.float32)
        w = rng.standard_normal((72, 24)).astype(np.float32)
        want = reference(x, w, 3, 1, 1, 1)
        y = np.zeros_like(want)
        c(x, w, y)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_whole_channel_steps_gather_by_cp_async(arch):
    """With C a multiple of BK every step's columns are one tap's consecutive channels: the
    tile is gathered 16 bytes at a time by cp.async, as tiled.ops.conv2d's."""
    @T.prim_func
    def conv(data: T.Tensor((T.dyn("N"), 28, 28, 128), "float16"),
             kernel: T.Tensor((9 * 128, 128), "float16"),
             out: T.Tensor((T.dyn("M"), 128), "float16")):
        with T.Kernel(1, T.ceildiv(out.shape[0], 128), threads=128) as (bx, by):
            xs = T.alloc_shared((128, 64), "float16")
            ks = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k_iter in T.Pipelined(18, num_stages=3):
                T.im2col(data, xs, by, k_iter, 3, 1, 1, 1)
                T.copy(kernel[k_iter * 64, bx * 128], ks)
                T.gemm(xs, ks, acc)
            T.copy(acc, out[by * 128, bx * 128])

    body = kernel_body(source(conv, arch)[0])
    assert [ln for ln in body.splitlines() if "cp_async<16>" in ln and "data_ptr[" in ln]


@pytest.mark.parametrize(("args", "match"), [
    (lambda d, s, f: (s, s, 0, 0, 3), "img must be a 4-D global tensor"),
    (lambda d, s, f: (d, d, 0, 0, 3), "col must be a 2-D shared or fragment tile"),
    (lambda d, s, f: (d, f, 0, 0, 3), "col x_frag is float16"),
    (lambda d, s, f: (d, s, 0, 0, 0), "kernel must be an int >= 1"),
    (lambda d, s, f: (d, s, 0, 0, 3, 0), "stride must be an int >= 1"),
    (lambda d, s, f: (d, s, 0, 0, 3, 1, 1, -1), "pad must be an int >= 0"),
    (lambda d, s, f: (d, s, 0, 0, 9), "leaves no output of a 6x6 image"),
])
def test_bad_arguments_are_located_errors(args, match):
    @T.prim_func
    def k(data: T.Tensor((1, 6, 6, 8), "float32"), y: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            xs = T.alloc_shared((16, 16), "float32")
            xf = T.alloc_fragment((16, 16), "float16", name="x_frag")
            T.im2col(*args(data, xs, xf))  # here
            T.copy(xs, y)

    with pytest.raises(KernelDefinitionError, match=match) as info:
        _ = k.ir
    assert info.value.file == __file__


def test_eviction_policy_is_checked():
    @T.prim_func
    def k(data: T.Tensor((1, 6, 6, 8), "float32"), y: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            xs = T.alloc_shared((16, 16), "float32")
            T.im2col(data, xs, 0, 0, 3, 1, 1, 1, eviction_policy="evict_sometimes")
            T.copy(xs, y)

    with pytest.raises(KernelDefinitionError, match="eviction_policy must be one of"):
        _ = k.ir
