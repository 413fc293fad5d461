"""ROCm kernels on an AMD GPU through tiled.runtime.rocm (HIP module API by ctypes), checked
against torch and against the CPU emulation of the same code object. No machine of this
project has an AMD GPU: these tests are marked `amd_gpu` and skip, with the reason, wherever
libamdhip64.so reports no gfx942 / gfx90a device. Until they have run somewhere, ROCm
artifacts are "compiled and CPU-emulated", not "runs on MI300"."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tiled.compiler import compile_program
from tiled.compiler.targets.rocm.backend import ARCHS
from tiled.runtime import rocm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARCH = rocm.local_arch()
pytestmark = [
    pytest.mark.amd_gpu,
    pytest.mark.skipif(ARCH not in ARCHS, reason="no AMD GPU with ROCm here (libamdhip64.so "
                       "reports no gfx942 / gfx90a device): ROCm kernels are compiled and "
                       "CPU-emulated, not run"),
]


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_elementwise_on_the_gpu_on_torchs_stream():
    torch = pytest.importorskip("torch")
    k = compile_program(example("elementwise").add(), f"rocm:{ARCH}")
    a, b = torch.randn(2, 100_003, device="cuda")
    c = torch.zeros_like(a)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        k(a, b, c)
    s.synchronize()
    torch.testing.assert_close(c, a + b)


def test_gemm_on_the_gpu_matches_torch_and_the_emulation():
    torch = pytest.importorskip("torch")
    M, N, K = 1000, 520, 256
    k = compile_program(example("gemm").matmul(M, N, K), f"rocm:{ARCH}")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.zeros(M, N, device="cuda", dtype=torch.float16)
    k(a, b, c)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
    emulated = np.zeros((M, N), np.float16)
    k.emulate(a.cpu().numpy(), b.cpu().numpy(), emulated)
    np.testing.assert_allclose(c.cpu().numpy().astype(np.float32),
                               emulated.astype(np.float32), rtol=1e-2, atol=1e-1)
