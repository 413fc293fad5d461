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
    # the per-op path: a TMA ring (ws_loop.py), wgmma per warpgroup, vector stores
    assert "tiled::sm90::tma_load(" in src and "wgmma_rows_issue<__nv_bfloat16" in src
    assert "WgmmaTile<128, 256, 2>::store<__nv_bfloat16>" in src


@pytest.mark.parametrize("kind,bm,splits", [("tile", 16, 3), ("swap", 16, 2)])
@pytest.mark.parametrize("sum_", ["kernel", "last"])
def test_split_k_partials_add_up_to_x_at_w_t(kind, bm, splits, sum_):
    """K = 200 is 4 steps of 64: with 3 splits of 2 steps the last split reads only past K
    (its guarded loads give a zero partial); splitk_sum adds the partials and casts, or
    (sum="last") each tile's last split does, in the GEMM kernel, leaving the tiles'
    counters at zero for the next launch (two launches on one buffer, the second with
    another x)."""
    import tiled
    from tiled.ops import split_k
    from tiled.ops.gemm import _run, linear_kernel

    g = torch.Generator().manual_seed(3)
    rows = 70 if kind == "tile" else 9
    w = (torch.randn(48, 200, generator=g) / 200 ** 0.5).bfloat16()
    cfg = {"kind": kind, "BM": bm, "BN": 32, "threads": 128, "splits": splits, "sum": sum_}
    kernel = tiled.compile(linear_kernel(rows if kind == "tile" else bm, 48, 200,
                                         "bfloat16", "bfloat16", **cfg), target="cpu")
    for _ in range(2):
        x = torch.randn(rows, 200, generator=g).bfloat16()
        y = torch.full((rows, 48), float("nan")).bfloat16()
        out = _run(kernel, cfg, [x, w, y])
        want = x.float() @ w.float().T
        assert out is y and ((y.float() - want).norm() / want.norm()).item() < 1e-2
    if sum_ == "last":
        assert not split_k.counters(x.device, 10).any()


def test_captured_launches_take_counters_of_their_own_from_the_pool(monkeypatch):
    """split_k.counters inside a CUDA graph capture: one buffer per capture and stream, cut
    from the device's zeroed pool (no memset in the graph), each capture's its own; a pool
    with no room left hands out counters made (and zeroed) in the capture."""
    from tiled.ops import split_k

    dev = torch.device("cpu")
    monkeypatch.setattr(split_k, "_POOLS", {"cpu": [torch.zeros(3000, dtype=torch.int32), 0]})
    a, b = split_k._from_pool(dev, 1024), split_k._from_pool(dev, 1024)
    assert a.data_ptr() != b.data_ptr() and not a.any() and not b.any()
    assert split_k._POOLS["cpu"][1] == 2048
    c = split_k._from_pool(dev, 1024)  # past the pool's end: its own zeroed buffer
    assert c.numel() == 1024 and not c.any() and split_k._POOLS["cpu"][1] == 2048


def test_decode_token_counts_tune_over_gemv_kernels_and_match_torch():
    from tiled.ops.gemm import CPU_SPACE, LINEAR, _fits

    g = torch.Generator().manual_seed(4)
    w = (torch.randn(40, 1100, generator=g) / 1100 ** 0.5).bfloat16()
    for m in (1, 2, 3):
        assert sum(c["kind"] == "gemv" and _fits(c, m) for c in CPU_SPACE) == 1
        x = torch.randn(m, 1100, generator=g).bfloat16()
        want = x.float() @ w.float().T
        y = ops.linear(x, w)
        assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
    # every candidate of each bucket ran and matched (the others' factories refused M)
    assert tuning.STATS["tunings"] == 3 and all(
        c.us is not None or "is not for M" in c.skipped
        for t in LINEAR.chosen.values() for c in t.candidates)


def test_large_cpu_tiles_serve_only_token_counts_that_fill_them():
    import tiled
    from tiled.ops.gemm import CPU_SPACE, _fits, _run, linear_kernel, matmul_kernel

    big = [c for c in CPU_SPACE if c.get("min_tokens")]
    assert big and all(c["min_tokens"] == c["BM"] for c in big)
    for c in big:
        # decided by the bucket: 33 .. 64 tokens share the 64-token tuning
        assert _fits(c, c["BM"]) and _fits(c, c["BM"] // 2 + 1) and not _fits(c, c["BM"] // 2)
        with pytest.raises(ValueError, match="is not for M"):
            linear_kernel(c["BM"] // 2, 96, 128, "bfloat16", "bfloat16", **c)
        with pytest.raises(ValueError, match="is not for M"):
            matmul_kernel(c["BM"] // 2, 96, 128, "bfloat16", "bfloat16", **c)
    # a 64 x 128 tile over 70 tokens and 96 rows of w: edges in both M and N
    g = torch.Generator().manual_seed(6)
    x = torch.randn(70, 192, generator=g).bfloat16()
    w = (torch.randn(96, 192, generator=g) / 192 ** 0.5).bfloat16()
    cfg = big[0]
    kernel = tiled.compile(linear_kernel(70, 96, 192, "bfloat16", "bfloat16", **cfg), "cpu")
    y = _run(kernel, cfg, [x, w, torch.empty(70, 96).bfloat16()])
    want = x.float() @ w.float().T
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2


def test_a_config_fits_every_token_count_of_its_bucket_alike():
    """A tuning builds its candidates at the bucket's count and its winner then serves every
    count of the bucket: no config may fit the one and not the other."""
    from tiled.ops.gemm import CPU_SPACE, CUDA_SPACE, _fits, tokens_bucket

    for cfg in CPU_SPACE + CUDA_SPACE:
        for m in range(1, 2100):
            assert _fits(cfg, m) == _fits(cfg, tokens_bucket(m)), (cfg, m)


def test_gemv_kernel_with_split_k_matches_torch():
    import tiled
    from tiled.ops.gemm import _run, linear_kernel

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2500, generator=g).half()
    w = (torch.randn(20, 2500, generator=g) / 50).half()
    kernel = tiled.compile(linear_kernel(3, 20, 2500, "float16", "float16", kind="gemv", BM=4,
                                         BN=8, threads=128, splits=2), target="cpu")
    y = _run(kernel, {"kind": "gemv", "splits": 2}, [x, w, torch.empty(3, 20).half()])
    want = x.float() @ w.float().T
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2


def test_16_token_swaps_and_split_k_tiles_take_the_sm90_warp_specialized_gemm():
    """wgmma's n16 (B K-major: the tokens' tile [16][64]) and a 3-D grid (split-K's splits
    walked outermost by the persistent blocks) both stay on the WS path."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program
    from tiled.ops.gemm import linear_kernel

    swap = compile_program(linear_kernel(16, 4096, 4096, "bfloat16", "bfloat16", kind="swap",
                                         BM=16, BN=64, threads=128, splits=2),
                           target="cuda:sm_90a")
    # 16-row tiles of x: one wgmma n16 per k16 slice (the per-op path)
    assert "wgmma_rows_issue<__nv_bfloat16, 64, 64, 16, 64, true>" in swap.source
    assert tuple(swap.manifest.grid[1:]) == (1, 1)  # persistent: every block walks x, y and z
    tile = compile_program(linear_kernel(256, 1024, 8192, "bfloat16", "bfloat16", kind="tile",
                                         BM=64, BN=128, threads=128, splits=4),
                           target="cuda:sm_90a")
    assert "wgmma_rows_issue<__nv_bfloat16, 64, 64, 128, 64, true>" in tile.source
    assert tuple(tile.manifest.grid[1:]) == (1, 1)  # persistent over the splits too


def test_every_config_of_the_cuda_space_defines_a_kernel_for_its_token_counts():
    from tiled.ops.gemm import CUDA_SPACE, LAST_SUM_CONFIGS, _fits, linear_kernel

    for cfg in CUDA_SPACE + LAST_SUM_CONFIGS:
        ms = [m for m in (1, 2, 4, 16, 64, 128, 256, 1024, 4096) if _fits(cfg, m)]
        assert ms, cfg
        linear_kernel(ms[0], 4096, 4096, "bfloat16", "bfloat16", **cfg)


@pytest.mark.parametrize("bn,splits", [(32, 1), (32, 2), (16, 1)])
def test_narrow_tiles_compute_x_at_w_t_and_take_wgmma_on_sm90a(bn, splits):
    """The CUDA space's narrow tiles (64 tokens x 32 or 16 weight rows, 8 stages, split-K
    on programmatic launch): right on cpu, and on sm_90a a TMA ring with wgmma of that N."""
    import shutil

    import tiled
    from tiled.ops.gemm import _run, linear_kernel

    cfg = {"kind": "tile", "BM": 64, "BN": bn, "threads": 128, "stages": 8, "splits": splits}
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 256, generator=g).bfloat16()
    w = (torch.randn(96, 256, generator=g) / 16).bfloat16()
    kernel = tiled.compile(linear_kernel(40, 96, 256, "bfloat16", "bfloat16", **cfg), "cpu")
    y = torch.full((40, 96), float("nan")).bfloat16()
    _run(kernel, cfg, [x, w, y])
    want = x.float() @ w.float().T
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    cuda = tiled.compile(linear_kernel(64, 4096, 4096, "bfloat16", "bfloat16", **cfg),
                         "cuda:sm_90a")
    assert "tiled::sm90::tma_load(" in cuda.source
    assert f"wgmma_rows_issue<__nv_bfloat16, 64, 64, {bn}, 64, true>" in cuda.source
    assert ("tiled::launch_dependents()" in cuda.source) == (splits > 1)


@pytest.mark.parametrize("bm,threads", [(128, 256), (64, 128)])
def test_224_column_tiles_compute_x_at_w_t_and_take_one_wgmma_on_sm90a(tmp_path, bm, threads):
    """The CUDA space's 224-column tiles (a wave-filling width for N = 14336): right on cpu
    with a partial last tile (N = 500), and on sm_90a a TMA ring whose gemm issues wgmma
    n224 (tiled_sm90_explicit.h cols_width), not 128 + 64 + 32."""
    import re
    import shutil

    import tiled
    from tests.compiler.test_sm90_path import sass
    from tiled.ops.gemm import _run, linear_kernel

    cfg = {"kind": "tile", "BM": bm, "BN": 224, "threads": threads}
    g = torch.Generator().manual_seed(6)
    x = torch.randn(70, 192, generator=g).bfloat16()
    w = (torch.randn(500, 192, generator=g) / 16).bfloat16()
    kernel = tiled.compile(linear_kernel(128, 500, 192, "bfloat16", "bfloat16", **cfg), "cpu")
    y = torch.full((70, 500), float("nan")).bfloat16()
    _run(kernel, cfg, [x, w, y])
    want = x.float() @ w.float().T
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    cuda = tiled.compile(linear_kernel(1024, 14336, 4096, "bfloat16", "bfloat16", **cfg),
                         "cuda:sm_90a", cache=False)
    assert "tiled::sm90::tma_load(" in cuda.source
    assert set(re.findall(r"HGMMA\.(\d+x\d+)x16", sass(cuda.artifact, tmp_path))) == {"64x224"}


@pytest.mark.parametrize("M,units", [(70, 4), (16, 5), (256, 7), (300, 7)])
def test_stream_k_linear_matches_torch(M, units):
    """Stream-K (gemm_streamk.py): the partial last wave's tiles shared by `units` runs whose
    parts meet in the workspace (the last part, by the tile's step count, writes y), the
    rest whole; 70 rows (a partial tile), 16 (every tile shared: decode), 256 (full waves
    and shared tiles both), 300 (two groups of the tile order, the second partial)."""
    import tiled
    from tiled.ops.gemm import _run, linear_kernel
    from tiled.ops.gemm_streamk import partial_tiles

    cfg = {"kind": "streamk", "BM": 32, "BN": 32, "threads": 128, "units": units}
    N, K = 96, 320  # 5 K steps a tile
    g = torch.Generator().manual_seed(8)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / 16).bfloat16()
    kernel = tiled.compile(linear_kernel(max(M, 64), N, K, "bfloat16", "bfloat16", **cfg),
                           target="cpu")
    y = torch.full((M, N), float("nan")).bfloat16()
    _run(kernel, cfg, [x, w, y])
    want = x.float() @ w.float().T
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
    assert 0 < partial_tiles(M, N, 32, 32, units) < units


def test_last_split_sum_has_all_its_loads_in_flight_on_sm90a(tmp_path):
    """sum="last" on sm_90a (64 w rows x 64 tokens, 4 splits): after the tile's count
    (ATOMG), the last split issues every load of the partials (4 x 8 float4 a thread) before
    its first add, rather than a row's loads per L2 round trip, and the GEMM keeps its TMA
    ring and wgmma; no programmatic-launch trigger (there is no second kernel)."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass
    from tiled.ops.gemm import linear_kernel

    c = tiled.compile(linear_kernel(64, 4096, 4096, "bfloat16", "bfloat16", kind="swap", BM=64,
                                    BN=64, threads=128, splits=4, stages=8, sum="last"),
                      "cuda:sm_90a", cache=False)
    assert "launch_dependents" not in c.source
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert "UTMALDG" in text and "HGMMA.64x64x16.F32.BF16" in text
    after = text[text.index("ATOMG"):]
    assert len(re.findall(r"LDG\.E\.128", after[:after.index("FADD")])) == 32
    assert not re.search(r"\b(LDL|STL)\b", text)
