"""tiled.jit: TileLang's calling convention (outputs allocated and returned), on `cpu`."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import LaunchError


@tiled.jit(out_idx=[-1])
def vadd(n, dtype="float32"):
    @tiled.kernel
    def vadd(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), C: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, 256), threads=256) as bx:
            for i in T.Parallel(256):
                C[bx * 256 + i] = A[bx * 256 + i] + B[bx * 256 + i]
    return vadd


def test_a_factory_returns_a_kernel_that_allocates_its_output():
    k = vadd(1000)
    assert k is vadd(1000)  # cached per argument tuple
    a, b = np.arange(1000, dtype="float32"), np.ones(1000, "float32")
    c = k(a, b)
    assert isinstance(c, np.ndarray) and c.dtype == np.float32
    np.testing.assert_array_equal(c, a + 1)


def test_torch_inputs_give_torch_outputs():
    torch = pytest.importorskip("torch")
    k = vadd(300)
    a, b = torch.arange(300, dtype=torch.float32), torch.full((300,), 2.0)
    c = k(a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32
    torch.testing.assert_close(c, a + 2)


def test_symbolic_dims_come_from_the_inputs_and_several_outputs_return_a_list():
    N = T.dyn("N")

    @tiled.kernel
    def split(X: T.Tensor((N, 2), "float32"), Lo: T.Tensor((N,), "float32"),
              Hi: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 64), threads=64) as bx:
            for i in T.Parallel(64):
                Lo[bx * 64 + i] = X[bx * 64 + i, 0]
                Hi[bx * 64 + i] = X[bx * 64 + i, 1]

    k = tiled.jit(split, out_idx=[1, -1])
    for n in (1, 77):
        x = np.arange(2 * n, dtype="float32").reshape(n, 2)
        lo, hi = k(x)
        np.testing.assert_array_equal(lo, x[:, 0])
        np.testing.assert_array_equal(hi, x[:, 1])


def test_bad_calls_name_the_problem():
    M = T.dyn("M")

    @tiled.kernel
    def fill(X: T.Tensor((4,), "float32"), Y: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=4):
            for i in T.Parallel(4):
                Y[i] = X[i]

    with pytest.raises(LaunchError, match=r"output Y's dim M is not the dim of any input"):
        tiled.jit(fill, out_idx=-1)(np.zeros(4, "float32"))
    with pytest.raises(LaunchError, match=r"expected 2 inputs \(A, B; the outputs \['C'\]"):
        vadd(10)(np.zeros(10, "float32"))
    with pytest.raises(ValueError, match=r"out_idx 5 is out of range"):
        tiled.jit(fill, out_idx=[5])


def test_tilelang_pass_configs_are_checked_and_dropped():
    configs = {tiled.PassConfigKey.TL_ENABLE_FAST_MATH: True,
               "tl.disable_tma_lower": True, tiled.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}

    @tiled.jit(out_idx=[-1], pass_configs=configs)
    def add(n):
        @T.prim_func
        def add(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
            with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
                for i in T.Parallel(128):
                    C[bx * 128 + i] = A[bx * 128 + i] + 1.0
        return add

    a = np.arange(300, dtype="float32")
    np.testing.assert_array_equal(add(300)(a), a + 1)
    k = tiled.compile(add(300).kernel, "cpu", cache=False, pass_configs=configs)
    assert k.manifest.target.startswith("cpu")
    with pytest.raises(ValueError, match="not a TileLang pass-config key"):
        tiled.jit(add(300).kernel, out_idx=[-1], pass_configs={"fast_math": True})
    with pytest.raises(TypeError, match="pass_configs must be a dict"):
        tiled.compile(add(300).kernel, "cpu", pass_configs=["tl.enable_fast_math"])
