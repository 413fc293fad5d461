"""Metal kernels on an Apple GPU through tiled.runtime.metal (PyObjC's Metal framework for
numpy arrays, torch.mps.compile_shader for MPS tensors), checked against numpy / torch and
against the CPU emulation of the same MSL. No machine of this project is a Mac: these tests
are marked `apple_gpu` and skip, with the reason, wherever there is no Metal device. Until
they have run somewhere, Metal artifacts are "compiled, type-checked and CPU-emulated", not
"runs on Apple GPUs"."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tiled.compiler import compile_program
from tiled.runtime import metal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARCH = metal.local_arch()
pytestmark = [
    pytest.mark.apple_gpu,
    pytest.mark.skipif(ARCH is None, reason="no Apple GPU with Metal here (macOS, PyObjC's "
                       "Metal framework and an Apple7+ device are needed): Metal kernels are "
                       "compiled, type-checked and CPU-emulated, not run"),
]


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_elementwise_on_numpy_arrays_through_pyobjc():
    k = compile_program(example("elementwise").add(), f"metal:{ARCH}")
    a, b = np.random.default_rng(0).standard_normal((2, 100_003)).astype(np.float32)
    c = np.zeros_like(a)
    k(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_gemm_on_mps_tensors_through_torch_matches_the_emulation():
    torch = pytest.importorskip("torch")
    if not torch.backends.mps.is_available():
        pytest.skip("torch has no MPS device here")
    k = compile_program(example("gemm").matmul(200, 136, 96, block_M=64, block_N=64,
                                               block_K=32), f"metal:{ARCH}")
    a = torch.randn(200, 96, dtype=torch.float16, device="mps")
    b = torch.randn(96, 136, dtype=torch.float16, device="mps")
    c = torch.zeros(200, 136, dtype=torch.float16, device="mps")
    k(a, b, c)
    torch.mps.synchronize()
    ref = (a.float() @ b.float()).cpu().numpy()
    out = c.cpu().numpy().astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    emulated = np.zeros((200, 136), np.float16)
    k.emulate(a.cpu().numpy(), b.cpu().numpy(), emulated)
    np.testing.assert_allclose(out, emulated, rtol=2e-2, atol=2e-2)


def test_softmax_and_flash_attention_on_the_gpu():
    x = np.random.default_rng(1).standard_normal((1003, 256)).astype(np.float32)
    y = np.zeros_like(x)
    compile_program(example("softmax").softmax(), f"metal:{ARCH}")(x, y)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    fa = example("flash_attention")
    k = compile_program(fa.flash_attention(1, 4, 2, 256, 256, 64, block_M=32, block_N=32),
                        f"metal:{ARCH}")
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 256, 64)).astype(np.float16)
    kk, v = (rng.standard_normal((1, 2, 256, 64)).astype(np.float16) for _ in "kv")
    o = np.zeros_like(q)
    k(q, kk, v, o)
    ref = fa.reference(q, kk, v, False)
    assert np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3
