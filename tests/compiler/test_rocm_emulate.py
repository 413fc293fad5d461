"""ROCm kernels run on the CPU (`CompiledKernel.emulate`): the code object's own HIP source,
built over tiled_hip_cpu.h (fibers, barriers, wave64 exchanges, a poisoned LDS arena,
reference MFMA), matches numpy; and what the emulation exists to catch is reported, not hung
on or crashed on: a barrier some threads never reach, a write outside a tensor, a crash."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tiled.lang as T
from tests.emulated_examples import example, rel_err
from tiled.compiler import compile_program
from tiled.compiler.targets.rocm.emulate import emulate
from tiled.errors import EmulationError, LaunchError

ARCHS = ("gfx942", "gfx90a")


@pytest.fixture(scope="module")
def elementwise():
    return compile_program(example("elementwise").add(), "rocm:gfx942")


@pytest.mark.parametrize("arch", ARCHS)
def test_elementwise(arch):
    k = compile_program(example("elementwise").add(), f"rocm:{arch}")
    rng = np.random.default_rng(0)
    n = 3000  # a ragged last block
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.zeros(n, np.float32)
    k.emulate(a, b, c)
    np.testing.assert_array_equal(c, a + b)


@pytest.mark.parametrize("arch", ARCHS)
def test_softmax(arch):
    k = compile_program(example("softmax").softmax(), f"rocm:{arch}")
    x = np.random.default_rng(1).standard_normal((7, 256)).astype(np.float32) * 4
    y = np.zeros_like(x)
    k.emulate(x, y)
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert rel_err(y, ref) < 1e-6


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemm_mfma_ragged_symbolic_m(arch, dtype):
    M, N, K = 100, 72, 96  # ragged M and N tiles, M symbolic
    k = compile_program(example("gemm").matmul(T.dyn("M"), N, K, block_M=64, block_N=64,
                                               dtype=dtype), f"rocm:{arch}")
    npdt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, K)).astype(npdt)
    b = rng.standard_normal((K, N)).astype(npdt)
    c = np.full((M, N), 7, npdt)
    k.emulate(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_err(c, ref) < (2e-3 if dtype == "float16" else 1e-2)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(arch, causal):
    fa = example("flash_attention")
    b, h, kvh, s, d = 1, 2, 1, 80, 64  # GQA, a ragged last key tile
    k = compile_program(fa.flash_attention(b, h, kvh, s, s, d, causal), f"rocm:{arch}")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((b, h, s, d)).astype(np.float16)
    kk, v = (rng.standard_normal((b, kvh, s, d)).astype(np.float16) for _ in "kv")
    o = np.full(q.shape, np.nan, np.float16)
    k.emulate(q, kk, v, o)
    assert rel_err(o, fa.reference(q, kk, v, causal)) < 2e-3


def test_emulate_checks_arguments_like_a_launch(elementwise):
    a = np.zeros(8, np.float32)
    with pytest.raises(LaunchError, match="expected dtype float32"):
        elementwise.emulate(a, a, np.zeros(8, np.float16))
    with pytest.raises(LaunchError, match="expected 3 arguments"):
        elementwise.emulate(a, a)
    cpu = compile_program(example("elementwise").add(), "cpu")  # runs as it is, no emulation
    with pytest.raises(LaunchError, match=r"this emulation runs rocm kernels; this one is for "
                                          r"cpu"):
        cpu.emulate(a, a, a)


def _edited(kernel, old: str, new: str) -> str:
    assert kernel.source.count(old) >= 1, old
    return kernel.source.replace(old, new, 1)


def test_a_write_outside_a_tensor_is_reported(elementwise):
    src = _edited(elementwise, "C_ptr[((((int)blockIdx.x) * 1024) + ((int)threadIdx.x))] =",
                  "C_ptr[N + 1] =")  # one element past the end
    a = np.ones(1000, np.float32)
    with pytest.raises(EmulationError, match="wrote outside tensor argument 2"):
        emulate(elementwise.artifact, elementwise.manifest, (a, a, a.copy()), source=src)


def test_an_exchange_half_a_wave_skips_is_a_deadlock(elementwise):
    # (A thread that ends counts as arrived at __syncthreads, as a finished wave leaves the
    # hardware barrier; a lane exchange needs every lane of the wave.)
    src = _edited(elementwise, "  int cse_v1 =",
                  "  if (threadIdx.x % 64 < 32) (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);\n"
                  "  int cse_v1 =")
    a = np.ones(1000, np.float32)
    with pytest.raises(EmulationError, match=r"deadlock in block \(0, 0, 0\).*lane exchange"):
        emulate(elementwise.artifact, elementwise.manifest, (a, a, a.copy()), source=src)


def test_lds_is_poisoned_before_each_block():
    @T.prim_func
    def read_unwritten(X: T.Tensor((2, 64), "float32"), Y: T.Tensor((2, 64), "float32")):
        with T.Kernel(2, threads=64) as bx:
            s = T.alloc_shared((64,), "float32")
            for i in T.Parallel(64):
                if i < 32 or bx == 0:  # block 1 leaves s[32:] unwritten
                    s[i] = X[bx, i]
            for i in T.Parallel(64):
                Y[bx, i] = s[i]

    k = compile_program(read_unwritten, "rocm:gfx942")
    x = np.arange(128, dtype=np.float32).reshape(2, 64)
    y = np.zeros((2, 64), np.float32)
    k.emulate(x, y)
    np.testing.assert_array_equal(y[0], x[0])
    np.testing.assert_array_equal(y[1, :32], x[1, :32])
    assert np.isnan(y[1, 32:]).all()  # 0xFF bytes, not block 0's values


def test_a_crash_is_an_error_not_a_dead_caller(elementwise):
    src = _edited(elementwise, "  int cse_v1 =", "  *(volatile int*)0 = 1;\n  int cse_v1 =")
    a = np.ones(10, np.float32)
    with pytest.raises(EmulationError, match="SIGSEGV"):
        emulate(elementwise.artifact, elementwise.manifest, (a, a, a.copy()), source=src)


def test_a_cache_hit_emulates_from_the_source_in_its_code_object():
    import tiled

    first = tiled.compile(example("elementwise").add(), target="rocm:gfx90a")
    hit = tiled.compile(example("elementwise").add(), target="rocm:gfx90a")
    assert first.source is not None and hit.source is None  # a hit keeps no source
    assert hit.artifact == first.artifact
    a, b = np.arange(300, dtype=np.float32), np.ones(300, np.float32)
    c = np.zeros(300, np.float32)
    hit.emulate(a, b, c)
    np.testing.assert_array_equal(c, a + 1)
