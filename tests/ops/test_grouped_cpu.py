"""tiled.ops.grouped.grouped_linear on CPU tensors (the cpu target) against a loop of F.linear
per expert: uneven routings, experts without tokens, token counts off the tile; the tile
table's invariant; the kernel's row guard; errors for bad inputs; the sm_90a compile."""

import itertools
import shutil

import pytest

torch = pytest.importorskip("torch")

import tiled
from tiled import tuning
from tiled.ops import grouped
from tiled.ops.grouped import grouped_linear

F = torch.nn.functional
TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _weights(E, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, N, K, generator=g) / K ** 0.5).to(dtype)


def _offsets(counts, dtype=torch.int64):
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=dtype)


def _check_against_loop(x, w, offsets, y):
    """Each expert's rows of y against F.linear of its rows of x (float32), one relative error
    per expert, so that a small expert's wrong rows are not hidden by the others."""
    assert y.shape == (x.shape[0], w.shape[1]) and y.dtype == x.dtype
    o = offsets.tolist()
    for e in range(w.shape[0]):
        if o[e] == o[e + 1]:
            continue
        want = F.linear(x[o[e]:o[e + 1]].float(), w[e].float())
        err = ((y[o[e]:o[e + 1]].float() - want).norm() / want.norm()).item()
        assert err < TOL[x.dtype], (e, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_uneven_routings_match_a_loop_of_f_linear_and_tune_once_per_bucket(dtype):
    E, N, K = 5, 72, 96  # N and K off the CPU tiles (32, 64 wide) too
    w = _weights(E, N, K, dtype)
    g = torch.Generator().manual_seed(1)
    # One token bucket (64): a zero-token expert first, in the middle and last; one expert
    # with all the tokens; counts off the tile.
    for counts in ((0, 17, 1, 0, 23), (41, 0, 0, 0, 0), (3, 9, 0, 27, 0), (0, 0, 0, 0, 64)):
        x = torch.randn(sum(counts), K, generator=g).to(dtype)
        offsets = _offsets(counts, torch.int32 if counts[0] else torch.int64)
        _check_against_loop(x, w, offsets, grouped_linear(x, w, offsets))
    assert tuning.STATS["tunings"] == 1


def test_no_tokens_gives_an_empty_result():
    w = _weights(3, 32, 64, torch.float16)
    x = torch.empty(0, 64, dtype=torch.float16)
    y = grouped_linear(x, w, torch.zeros(4, dtype=torch.int32))
    assert y.shape == (0, 32) and y.dtype == torch.float16


@pytest.mark.parametrize("BM", [16, 128])
def test_the_tile_table_covers_each_row_with_its_experts_tiles(BM):
    """Every row lies in a tile of its expert; an expert has ceildiv(count, BM) tiles, whole
    ones when it has BM rows or more (its last overlaps the one before), else one partial."""
    g = torch.Generator().manual_seed(2)
    for E in (1, 4, 33):
        counts = torch.randint(0, 3 * BM, (E,), generator=g)
        counts[torch.randint(0, E, (E // 3,), generator=g)] = 0
        counts[0] = 2 * BM  # no overlap: whole tiles only
        offsets = _offsets(counts.tolist())
        tokens = int(offsets[-1])
        table = grouped.tile_table(offsets, tokens, BM)
        assert table.shape == (grouped.table_rows(tokens, E, BM), 3)
        assert table.dtype == torch.int32
        expert_of = torch.repeat_interleave(torch.arange(E), counts)
        covered = torch.zeros(tokens, dtype=torch.int64)
        tiles = torch.zeros(E, dtype=torch.int64)
        for e, first, rows in table.tolist():
            assert 0 <= rows <= BM and 0 <= e < E
            if rows == 0:
                assert (e, first) == (0, 0)
                continue
            assert rows == min(BM, counts[e])
            covered[first:first + rows] += 1
            tiles[e] += 1
            assert (expert_of[first:first + rows] == e).all()
        assert (covered >= 1).all() and (tiles == (counts + BM - 1) // BM).all()
        assert (covered[:2 * BM] == 1).all()


def test_a_tile_stores_its_rows_only_and_reads_past_the_tokens_safely():
    """Tiles by hand: expert 1's 5 rows from row 3 (the next rows belong to no one here: they
    must keep their sentinel), 8 rows from row 12 of 20 (its loads run past x's end), and an
    unused tile."""
    BM, E, N, K = 16, 2, 32, 64
    kernel = tiled.compile(grouped.grouped_kernel(20, E, N, K, "float16", BM=BM, BN=32,
                                                  threads=128), target="cpu",
                            **grouped.COMPILE_OPTIONS)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, K, generator=g).half()
    w = _weights(E, N, K, torch.float16)
    y = torch.full((20, N), float("nan"), dtype=torch.float16)
    table = torch.tensor([[1, 3, 5], [0, 12, 8], [0, 0, 0]], dtype=torch.int32)
    kernel(x, w.view(E * N, K), table, y)
    written = torch.zeros(20, dtype=torch.bool)
    written[3:8] = written[12:20] = True
    assert torch.isnan(y[~written]).all()
    for rows, e in ((slice(3, 8), 1), (slice(12, 20), 0)):
        want = F.linear(x[rows].float(), w[e].float())
        assert ((y[rows].float() - want).norm() / want.norm()).item() < TOL[torch.float16]


def test_bad_inputs_raise_errors_that_name_the_problem():
    x = torch.randn(6, 64).half()
    w = _weights(3, 32, 64, torch.float16)
    off = _offsets([2, 0, 4])
    with pytest.raises(ValueError, match=r"not x \[T, K\] and w \[E, N, K\]"):
        grouped_linear(x, w[0], off)
    with pytest.raises(ValueError, match="one K"):
        grouped_linear(x, _weights(3, 32, 48, torch.float16), off)
    with pytest.raises(ValueError, match=r"expected \(4,\)"):
        grouped_linear(x, w, off[:3])
    with pytest.raises(TypeError, match="int32 or int64"):
        grouped_linear(x, w, off.float())
    with pytest.raises(TypeError, match="float32 inputs"):
        grouped_linear(x.float(), w.float(), off)
    with pytest.raises(ValueError, match=r"w torch\.bfloat16"):
        grouped_linear(x, w.bfloat16(), off)
    with pytest.raises(ValueError, match="must rise from 0 to T = 6"):
        grouped_linear(x, w, _offsets([2, 0, 3]))
    with pytest.raises(ValueError, match="must rise"):
        grouped_linear(x, w, torch.tensor([0, 4, 2, 6]))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_cuda_config_compiles_for_sm_90a_on_the_warp_specialized_path():
    """The largest tile of the CUDA space, N off the tile (no GPU needed to compile). The
    warp-specialized GEMM path shows in the manifest: TMA descriptors among the kernel's
    arguments (the producer reads the tile table too), a producer warpgroup beside the 256
    threads, and blocks walking the grid (a trip count that only the table ties to a block
    does not keep them from it)."""
    kernel = grouped.grouped_kernel(4096, 8, 1000, 4096, "bfloat16", **grouped.CUDA_SPACE[0])
    compiled = tiled.compile(kernel, target="cuda:sm_90a", cache=False,
                             **grouped.COMPILE_OPTIONS)
    m = compiled.manifest
    assert compiled.artifact and m.arch == "sm_90a"
    assert m.block[0] == 256 + 128 and "tensor_map" in [a.kind for a in m.kernel_args]
    assert "tiled_sm_count" in str(m.grid[0])


def test_grouped_linear_custom_op_passes_opcheck():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 64, generator=g).half()
    w = torch.randn(3, 32, 64, generator=g).half()
    offsets = torch.tensor([0, 10, 10, 40])
    torch.library.opcheck(torch.ops.tiled.grouped_linear, (x, w, offsets))


def test_swapped_tiles_match_the_loop_for_ragged_experts():
    """The swap form (w[e] rows x the tile's tokens) over a routing with an empty expert, one
    of fewer rows than the tile, and one of several tiles whose last overlaps."""
    import tiled
    from tiled.ops import grouped

    g = torch.Generator().manual_seed(7)
    counts = [0, 5, 37, 16]
    E, N, K = len(counts), 40, 96
    x = torch.randn(sum(counts), K, generator=g).bfloat16()
    w = (torch.randn(E, N, K, generator=g) / K ** 0.5).bfloat16()
    offsets = torch.tensor([0, *itertools.accumulate(counts)])
    kernel = tiled.compile(grouped.grouped_kernel(x.shape[0], E, N, K, "bfloat16", kind="swap",
                                                  BM=16, BN=32, threads=128), target="cpu")
    y = torch.full((x.shape[0], N), float("nan")).bfloat16()
    kernel(x, w.view(E * N, K), grouped.tile_table(offsets, x.shape[0], 16), y)
    want = torch.cat([x[offsets[e]:offsets[e + 1]].float() @ w[e].float().T for e in range(E)])
    assert ((y.float() - want).norm() / want.norm()).item() < 1e-2


def test_large_cpu_tiles_serve_experts_that_average_their_rows():
    """The CPU space's 64 .. 256-row tiles fit only when experts average that many rows; a
    64 x 128 tile over ragged experts (one empty, one off the tile, N off the tile) matches."""
    big = [c for c in grouped.CPU_SPACE if c.get("min_rows")]
    assert big and all(c["min_rows"] == c["BM"] for c in big)
    for c in big:
        assert grouped._fits(c, 4 * c["BM"], 4) and not grouped._fits(c, 2 * c["BM"], 4)
        grouped.grouped_kernel(2 * c["BM"] + 1, 4, 40, 96, "bfloat16", **c)  # bucket 4 BM
        with pytest.raises(ValueError, match="is not for"):
            grouped.grouped_kernel(2 * c["BM"], 4, 40, 96, "bfloat16", **c)
    counts = [0, 70, 130, 64]
    E, N, K = len(counts), 40, 96
    g = torch.Generator().manual_seed(8)
    x = torch.randn(sum(counts), K, generator=g).bfloat16()
    w = _weights(E, N, K, torch.bfloat16, seed=9)
    offsets = _offsets(counts)
    cfg = big[0]
    kernel = tiled.compile(grouped.grouped_kernel(x.shape[0], E, N, K, "bfloat16", **cfg),
                           target="cpu")
    y = torch.full((x.shape[0], N), float("nan")).bfloat16()
    kernel(x, w.view(E * N, K), grouped.tile_table(offsets, x.shape[0], cfg["BM"]), y)
    _check_against_loop(x, w, offsets, y)
