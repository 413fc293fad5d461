"""tiled.ops.conv2d on CPU tensors (the cpu target) against F.conv2d: 3x3 and 1x1 filters,
strides, padding, dilation, channel counts that do not fill a channel step, bias; its CUDA
kernel compiles for sm_90a at a ResNet-50 layer's shape."""

import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

import tiled.ops as ops
from tiled.ops import conv


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("N,C,H,W,Fo,R,stride,pad,dil,bias", [
    (2, 8, 9, 7, 24, 3, 1, 1, 1, True),     # 3x3 same-size, a ragged pixel tile
    (1, 20, 10, 10, 16, 3, 2, 1, 1, False),  # stride 2; 20 channels: a partial channel step
    (2, 16, 8, 8, 8, 1, 1, 0, 1, True),     # 1x1
    (1, 3, 11, 11, 8, 3, 1, 2, 2, False),   # RGB input, dilation 2
])
def test_conv2d_matches_torch(N, C, H, W, Fo, R, stride, pad, dil, bias):
    g = torch.Generator().manual_seed(C)
    x = torch.randn(N, C, H, W, generator=g)
    w = torch.randn(Fo, C, R, R, generator=g)
    b = torch.randn(Fo, generator=g) if bias else None
    y = ops.conv2d(x, w, b, stride, pad, dil)
    want = F.conv2d(x, w, b, stride, pad, dil)
    assert y.shape == want.shape and _rel(y, want) < 1e-5
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_conv2d_bf16_channels_last_and_its_custom_op():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, 6, 6, generator=g).to(torch.bfloat16).to(
        memory_format=torch.channels_last)
    w = torch.randn(8, 16, 3, 3, generator=g).to(torch.bfloat16).to(
        memory_format=torch.channels_last)
    y = ops.conv2d(x, w, padding=1)
    assert _rel(y, F.conv2d(x.float(), w.float(), padding=1)) < 1e-2
    torch.library.opcheck(torch.ops.tiled.conv2d.default, (x, w, None, 1, 1, 1))


def test_a_bf16_1x1_conv2d_runs_as_linear(monkeypatch):
    """1x1, stride 1, no padding: the GEMM of the pixels' channel rows, by tiled.ops.linear
    (x read in place: channels_last), with the bias; y channels_last."""
    from tiled.ops import gemm

    calls = []
    real = gemm.linear
    monkeypatch.setattr(gemm, "linear", lambda *a, **k: calls.append(a) or real(*a, **k))
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 16, 5, 7, generator=g).to(torch.bfloat16).to(
        memory_format=torch.channels_last)
    w = torch.randn(24, 16, 1, 1, generator=g).to(torch.bfloat16)
    b = torch.randn(24, generator=g).to(torch.bfloat16)
    y = ops.conv2d(x, w, b)
    assert len(calls) == 1 and calls[0][0].data_ptr() == x.data_ptr()
    assert _rel(y, F.conv2d(x.float(), w.float(), b.float())) < 1e-2
    assert y.shape == (2, 24, 5, 7) and y.is_contiguous(memory_format=torch.channels_last)


def test_conv2d_refuses_bad_arguments():
    x = torch.zeros(1, 4, 8, 8)
    with pytest.raises(ValueError, match="groups = 1"):
        ops.conv2d(x, torch.zeros(8, 2, 3, 3))
    with pytest.raises(ValueError, match="one int"):
        ops.conv2d(x, torch.zeros(8, 4, 3, 3), stride=(1, 2))
    with pytest.raises(ValueError, match="leaves no output"):
        ops.conv2d(x, torch.zeros(8, 4, 9, 9))


def test_conv2d_kernel_compiles_for_sm90a():
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    compile_program(conv.conv2d_kernel(64, 56, 56, 64, 3, 3, 1, 1, 1, "bfloat16", False,
                                       BM=128, BN=128, BC=32, threads=256),
                    target="cuda:sm_90a")


def test_wide_cpu_tiles_serve_layers_of_64_channels_and_more():
    """The CPU space's 64-channel-step tiles are for layers of 64+ input and output channels
    (one such layer, with a ragged pixel tile, matches torch); narrower layers keep 16 x 16."""
    from tiled.ops import conv

    wide = [c for c in conv.CPU_SPACE if c.get("min_channels")]
    assert wide and any(not c.get("min_channels") for c in conv.CPU_SPACE)
    with pytest.raises(ValueError, match="is not for 32 -> 64 channels"):
        conv.conv2d_kernel(32, 6, 6, 64, 3, 3, 1, 1, 1, "bfloat16", False, **wide[0])
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1, 64, 5, 7, generator=g).bfloat16()
    w = (torch.randn(72, 64, 3, 3, generator=g) / 24).bfloat16()
    conv.CONV2D.spaces["cpu"] = wide[:1]  # this config only
    try:
        y = ops.conv2d(x, w, padding=1)
    finally:
        conv.CONV2D.spaces["cpu"] = conv.CPU_SPACE
        conv.CONV2D.clear()
    assert _rel(y, F.conv2d(x.float(), w.float(), padding=1)) < 1e-2


@pytest.mark.parametrize("splits", [3, 4])
@pytest.mark.parametrize("sum_", ["kernel", "last"])
def test_split_k_configs_add_their_partials(splits, sum_):
    """A split config: each split's float32 partial (the bias in split 0's), added up by
    splitk_sum or by each tile's last split (sum="last"); 4 splits of 18 steps (9 taps x 2
    channel chunks) leave the last split steps past the filter's taps, which read zeros."""
    g = torch.Generator().manual_seed(splits)
    x = torch.randn(2, 20, 6, 5, generator=g)
    w = torch.randn(12, 20, 3, 3, generator=g)
    b = torch.randn(12, generator=g)
    conv.CONV2D.spaces["cpu"] = [{"BM": 16, "BN": 16, "BC": 16, "threads": 32, "stages": 2,
                                  "splits": splits, "sum": sum_}]
    try:
        y = ops.conv2d(x, w, b, padding=1)
    finally:
        conv.CONV2D.spaces["cpu"] = conv.CPU_SPACE
        conv.CONV2D.clear()
    assert _rel(y, F.conv2d(x, w, b, padding=1)) < 1e-5


def test_split_k_kernel_gathers_on_a_producer_for_sm90a():
    """The CUDA space's split configs compile for sm_90a, their gather on the producer
    warpgroup (ws_loop.py) and the partial a float32 store."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    cfg = next(c for c in conv.CUDA_SPACE if c.get("splits", 1) > 1)
    k = compile_program(conv.conv2d_kernel(1280, 8, 8, 1280, 3, 3, 1, 1, 1, "bfloat16", True,
                                           **cfg), target="cuda:sm_90a")
    assert "ring_gathered" in k.source and "float* __restrict__ Y_ptr" in k.source
    # the sum in the kernel: partials into Part, the tile's count, the last split's sum
    last = compile_program(conv.conv2d_kernel(1280, 8, 8, 1280, 3, 3, 1, 1, 1, "bfloat16",
                                              True, **cfg, sum="last"), target="cuda:sm_90a")
    assert "ring_gathered" in last.source and "float* __restrict__ Part_ptr" in last.source
    assert "atomicAdd((&(Count_ptr[" in last.source
    assert "launch_dependents" not in last.source
