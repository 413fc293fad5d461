"""tiled.ops.quantize_fp8 and tiled.ops.fp8_linear on CPU tensors (the cpu target's float8 is
exact), against the same arithmetic in torch; and their CUDA kernels compile for sm_90a."""


import pytest

torch = pytest.importorskip("torch")

import tiled
import tiled.ops as ops
from tiled import tuning
from tiled.ops import fp8

E4M3 = torch.float8_e4m3fn


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_group_quantization_matches_torch(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 256, generator=g) * 4).to(dtype)
    x[0, 0, :128] = 0  # an all-zero group keeps a positive scale
    q, s = ops.quantize_fp8(x, block=128)
    assert q.dtype == E4M3 and q.shape == x.shape and s.shape == (3, 5, 2)
    groups = x.float().view(3, 5, 2, 128)
    want_s = groups.abs().amax(-1).clamp_min(1e-12) / 448.0
    torch.testing.assert_close(s, want_s)
    want_q = (groups / want_s[..., None]).to(E4M3).view(x.shape)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert _rel(q.float().view(3, 5, 2, 128) * s[..., None], groups) < 0.05


def test_per_tensor_quantization_and_bad_blocks():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 64, generator=g).half() * 3
    q, s = ops.quantize_fp8(x, block=None)
    want_s = x.float().abs().max() / 448.0
    torch.testing.assert_close(s, want_s.reshape(1))
    assert _rel(q.float() * s, x) < 0.05
    wide = torch.randn(5, 3072, generator=g).bfloat16()  # reduced in chunks of 1024
    wide[3, 2500] = -70.0
    q, s = ops.quantize_fp8(wide, block=None)
    torch.testing.assert_close(s, torch.tensor([70.0 / 448.0]))
    want_q = (wide.float() / s).clamp(-448, 448).to(E4M3)  # bfloat16 input: the values too
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    with pytest.raises(ValueError, match="does not divide the last dim 64"):
        ops.quantize_fp8(x, block=48)


def test_per_tensor_fp8_linear():
    g = torch.Generator().manual_seed(2)
    xf, wf = torch.randn(20, 256, generator=g), torch.randn(96, 256, generator=g)
    xq, xs = ops.quantize_fp8(xf, block=None)
    wq, ws = ops.quantize_fp8(wf, block=None)
    bias = torch.randn(96, generator=g)
    y = ops.fp8_linear(xq, wq, xs, ws, bias=bias, out_dtype=torch.float32)
    want = (xq.float() @ wq.float().T) * xs * ws + bias
    assert y.shape == (20, 96) and y.dtype == torch.float32 and _rel(y, want) < 1e-5
    assert _rel(ops.fp8_linear(xq, wq, xs, ws), xf @ wf.T) < 0.08  # bf16 default, vs float
    assert tuning.STATS["tunings"] == 2  # one per out dtype


def test_block_scaled_fp8_linear():
    g = torch.Generator().manual_seed(3)
    M, N, K = 19, 160, 384  # N not a multiple of the 128-row weight blocks
    xf = torch.randn(M, K, generator=g)
    wf = torch.randn(N, K, generator=g)
    xq, xs = ops.quantize_fp8(xf, block=128)  # [M, 3]
    NB = -(-N // 128)
    wpad = torch.zeros(NB * 128, K)
    wpad[:N] = wf
    blocks = wpad.view(NB, 128, K // 128, 128)
    ws = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0  # [NB, 3]
    wq = (blocks / ws[:, None, :, None]).to(E4M3).view(NB * 128, K)[:N].contiguous()
    y = ops.fp8_linear(xq, wq, xs, ws, out_dtype=torch.float32)
    xd = (xq.float().view(M, 3, 128) * xs[..., None]).view(M, K)
    wd = (wq.float().view(N, 3, 128) * ws.repeat_interleave(128, 0)[:N, :, None]).view(N, K)
    assert y.shape == (M, N) and _rel(y, xd @ wd.T) < 1e-5
    assert _rel(y, xf @ wf.T) < 0.08


def _block_scaled_operands(M, N, K, g):
    xq = torch.randn(M, K, generator=g).to(E4M3)
    wq = torch.randn(N, K, generator=g).to(E4M3)
    xs = torch.rand(M, K // 128, generator=g) + 0.5
    ws = torch.rand(-(-N // 128), K // 128, generator=g) + 0.5
    return xq, wq, xs, ws


@pytest.mark.parametrize("BM,BN", [(16, 64), (16, 128), (16, 256)])
def test_block_scaled_tiles_of_one_and_of_two_weight_blocks(BM, BN):
    """BN <= 128: one weight scale per K step, folded into the row scales loaded before the
    MMA; BN = 256: the tile spans two weight blocks, each column takes its own."""
    g = torch.Generator().manual_seed(4)
    M, N, K = 24, 256, 256
    xq, wq, xs, ws = _block_scaled_operands(M, N, K, g)
    kernel = fp8.scaled_gemm_kernel(M, N, K, "float32", True, BM=BM, BN=BN, threads=128,
                                    stages=2)
    y = torch.zeros(M, N)
    tiled.compile(kernel, target="cpu")(xq, wq, xs, ws, y)
    xd = (xq.float().view(M, 2, 128) * xs[..., None]).view(M, K)
    wd = (wq.float().view(N, 2, 128) * ws.repeat_interleave(128, 0)[:, :, None]).view(N, K)
    assert _rel(y, xd @ wd.T) < 1e-5


@pytest.mark.parametrize("M", [24, 40])
def test_paired_block_scaled_gemm_adds_every_step_once(M):
    """Two K steps an iteration, the second product added in the next one and the last after
    the loop: every step once, at its own scales (K = 512: four steps; K = 448: four, the
    last partial; M past a tile)."""
    g = torch.Generator().manual_seed(5)
    N, K = 128, 512
    xq, wq, xs, ws = _block_scaled_operands(M, N, K, g)
    kernel = fp8.scaled_gemm_kernel(M, N, K, "float32", True, BM=16, BN=64, threads=128,
                                    stages=4, paired=True)
    y = torch.zeros(M, N)
    tiled.compile(kernel, target="cpu")(xq, wq, xs, ws, y)
    xd = (xq.float().view(M, 4, 128) * xs[..., None]).view(M, K)
    wd = (wq.float().view(N, 4, 128) * ws.repeat_interleave(128, 0)[:, :, None]).view(N, K)
    assert _rel(y, xd @ wd.T) < 1e-5
    # K = 448: four steps, the last one 64 deep past K (zeros), each with its scale column
    K = 448
    xq, wq = torch.randn(M, K, generator=g).to(E4M3), torch.randn(N, K, generator=g).to(E4M3)
    xs, ws = torch.rand(M, 4, generator=g) + 0.5, torch.rand(1, 4, generator=g) + 0.5
    y = torch.zeros(M, N)
    tiled.compile(fp8.scaled_gemm_kernel(M, N, K, "float32", True, BM=16, BN=64, threads=128,
                                         stages=4, paired=True), target="cpu")(xq, wq, xs, ws, y)
    cols = torch.arange(K) // 128
    ref = (xq.float() * xs[:, cols]) @ (wq.float() * ws[0, cols]).T
    assert _rel(y, ref) < 1e-5
    K = 512
    for bad in (dict(K=384), dict(BN=256), dict(block_scaled=False)):
        args = {"K": K, "BN": 64, "block_scaled": True, **bad}
        with pytest.raises(ValueError, match="paired"):
            fp8.scaled_gemm_kernel(M, N, args["K"], "float32", args["block_scaled"], BM=16,
                                   BN=args["BN"], threads=128, paired=True)


def test_paired_configs_are_in_the_cuda_space_with_and_without_turns():
    paired = [c for c in fp8.CUDA_SPACE if c.get("paired")]
    assert {c.get("compile_options", {}).get("pingpong", False) for c in paired} == \
        {False, True}
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    src = compile_program(fp8.scaled_gemm_kernel(4096, 7168, 2048, "bfloat16", True,
                                                 **tuning.factory_kwargs(paired[0])),
                          target="cuda:sm_90a").source
    assert src.count("wgmma_rows_issue<__nv_fp8_e4m3, 64, 128, 128, 128") == 2
    assert "float p0_ptr[64];" in src and "float p1_ptr[64];" in src


def test_fp8_gemms_on_sm90a_take_the_ws_loop_and_keep_row_scales_in_registers():
    """Per-tensor: the generic WS loop (e4m3 wgmma over 128-element K rows, the
    accumulator's 16-byte stores); block-scaled: the same with each thread's two row scales
    in registers (layout inference gives the vector its readers' rows)."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    pt = compile_program(fp8.scaled_gemm_kernel(4096, 4096, 4096, "bfloat16", False, BM=128,
                                                BN=256, threads=256), target="cuda:sm_90a")
    assert "wgmma_rows_issue<__nv_fp8_e4m3, 64, 128, 256, 128, true>" in pt.source
    assert "WgmmaTile<128, 256, 2>::store<__nv_bfloat16>" in pt.source
    assert [a.box for a in pt.manifest.kernel_args if a.kind == "tensor_map"] == \
        [(128, 128), (128, 256)]
    bs = compile_program(fp8.scaled_gemm_kernel(4096, 7168, 2048, "bfloat16", True, BM=128,
                                                BN=128, threads=256), target="cuda:sm_90a")
    assert "float sa_ptr[2];" in bs.source


def test_fp8_linear_refuses_what_it_cannot_run():
    x = torch.zeros(4, 128, dtype=E4M3)
    w = torch.zeros(64, 128, dtype=E4M3)
    one = torch.ones(1)
    with pytest.raises(TypeError, match="expected float8_e4m3fn"):
        ops.fp8_linear(x.float(), w, one, one)
    with pytest.raises(ValueError, match="do not multiply"):
        ops.fp8_linear(x, w[:, :64], one, one)
    with pytest.raises(ValueError, match="neither per-tensor"):
        ops.fp8_linear(x, w, torch.ones(4, 2), torch.ones(1, 1))
    with pytest.raises(ValueError, match="expected float32"):
        ops.fp8_linear(x, w, one.double(), one)


@pytest.mark.parametrize("name", ["groups", "absmax", "scaled", "gemm", "gemm_blockscaled"])
def test_fp8_kernels_compile_for_sm90a(name):
    """Each CUDA kernel compiles (nvcc, sm_90a); the GEMMs take wgmma on the warp-specialized
    path. A bf16 guarded load vectorized by 4 is among them (its select used to reach nvcc
    as a vector of bools it rejected)."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    kernel = {"groups": lambda: fp8.quantize_group_kernel(128, "bfloat16"),
              "absmax": lambda: fp8.absmax_kernel(4096, "bfloat16"),
              "scaled": lambda: fp8.quantize_scaled_kernel(4096, "bfloat16"),
              "gemm": lambda: fp8.scaled_gemm_kernel(256, 4096, 4096, "bfloat16", False),
              "gemm_blockscaled": lambda: fp8.scaled_gemm_kernel(256, 7168, 2048, "bfloat16",
                                                                 True)}[name]()
    src = compile_program(kernel, target="cuda:sm_90a").source
    if name.startswith("gemm"):  # the generic WS loop's wgmma
        assert "wgmma_rows_issue<__nv_fp8_e4m3" in src


def test_fp8_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 256, generator=g).bfloat16()
    torch.library.opcheck(torch.ops.tiled.quantize_fp8, (x, 128))
    torch.library.opcheck(torch.ops.tiled.quantize_fp8, (x, None))
    xq, xs = ops.quantize_fp8(x.float(), block=128)
    wq, ws = ops.quantize_fp8(torch.randn(128, 256, generator=g), block=None)
    wsb = torch.rand(1, 2, generator=g) + 0.5
    # test_schema compares float8 inputs with an arithmetic op that CPU torch lacks for
    # float8 ("mul_cpu_reduced_float" not implemented): the other checks run.
    checks = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.tiled.fp8_linear, (xq, wq, xs[:, :1].amax().reshape(1),
                                                       ws, None, torch.float32),
                          test_utils=checks)
    torch.library.opcheck(torch.ops.tiled.fp8_linear, (xq, wq, xs, wsb, None, torch.bfloat16),
                          test_utils=checks)
