"""tiled.ops.linear on CPU tensors: x @ w.T by an autotuned kernel per token bucket."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled import tuning


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_matches_torch_and_tunes_once_per_bucket(dtype):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 128, generator=g) / 128 ** 0.5).to(dtype)
    for m in (20, 32, 17):  # one bucket (32): one tuning, one kernel
        x = torch.randn(m, 128, generator=g).to(dtype)
        y = ops.linear(x, w)
        want = (x.float() @ w.float().T).to(dtype)
        err = ((y.float() - want.float()).norm() / want.float().norm()).item()
        assert y.shape == (m, 96) and y.dtype == dtype and err < 2e-2, err
    assert tuning.STATS["tunings"] == 1


def test_linear_bias_out_dtype_leading_dims_and_no_tokens():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 64, generator=g).half()
    b = torch.randn(64, generator=g)
    x = torch.randn(2, 3, 64, generator=g).half()
    y = ops.linear(x, w, bias=b, out_dtype=torch.float32)
    want = x.float() @ w.float().T + b
    assert y.shape == (2, 3, 64) and y.dtype == torch.float32
    assert ((y - want).norm() / want.norm()).item() < 2e-3
    assert ops.linear(torch.empty(0, 64).half(), w).shape == (0, 64)
    with pytest.raises(ValueError, match="do not multiply"):
        ops.linear(x, torch.randn(64, 32).half())
    with pytest.raises(TypeError, match="float32 inputs"):
        ops.linear(x.float(), w.float())


def test_linear_custom_op_passes_opcheck():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 64, generator=g).half(), torch.randn(32, 64, generator=g).half()
    torch.library.opcheck(torch.ops.tiled.linear, (x, w, None, torch.float32))


def test_matmul_matches_torch_and_refuses_a_batched_b():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 9, 128, generator=g).bfloat16()
    b = (torch.randn(128, 80, generator=g) / 128 ** 0.5).bfloat16()
    y = ops.matmul(a, b)
    want = a.float() @ b.float()
    assert y.shape == (2, 9, 80) and y.dtype == torch.bfloat16
    assert ((y.float() - want).norm() / want.norm()).item() < 2e-2
    assert ops.matmul(a, b, out_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="2-D b"):
        ops.matmul(a, b.expand(2, 128, 80))
    torch.library.opcheck(torch.ops.tiled.matmul, (a[0], b, None))


def test_matmul_kernels_take_the_sm90_warp_specialized_gemm():
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program
    from tiled.ops.gemm import matmul_kernel

    src = compile_program(matmul_kernel(256, 4096, 4096, "bfloat16", "bfloat16", BM=128,
                                        BN=256, threads=256), target="cuda:sm_90a").source
    assert "tiled::sm90::WsGemm" in src
