"""T.cumsum on the GPU lowerings by teams of lanes (targets/cuda/scan.py): where the block has
two threads or more a line, a warp's lanes scan each line a chunk at a time with shuffles and
a carry. Run under the ROCm (wave64) and Metal (SIMD 32) CPU emulations against numpy: long
rows (TileLang's 4 x 1024 form), ragged chunks, a last round with idle teams, columns (dim
0), reverse, shared and fragment tiles, float / bfloat16 / int32; and on sm_90a: the team
form shuffles (SHFL.IDX, no local memory), a tile of as many lines as threads keeps one
thread a line."""

import re

import ml_dtypes
import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler import compile_program

TARGETS = ("rocm:gfx942", "metal")


def scan_kernel(M, N, dtype, scope, dim, reverse, rows, threads):
    alloc = T.alloc_shared if scope == "shared" else T.alloc_fragment

    @tiled.kernel
    def scan(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            a = alloc((rows, N), dtype)
            T.copy(X[bx * rows, 0], a)
            T.cumsum(a, dim=dim, reverse=reverse)
            T.copy(a, Y[bx * rows, 0])
    return scan


def reference(x, dim, reverse, rows):
    M = x.shape[0]
    padded = np.zeros((-(-M // rows) * rows, x.shape[1]), np.float64)
    padded[:M] = x.astype(np.float64)
    tiles = padded.reshape(-1, rows, x.shape[1])  # per block; the tail rows are zeros
    axis = dim + 1
    flip = (lambda t: np.flip(t, axis)) if reverse else (lambda t: t)
    return flip(np.cumsum(flip(tiles), axis)).reshape(padded.shape)[:M]


CASES = {  # name: (M, N, dtype, scope, dim, reverse, rows, threads)
    "rows_4x1024": (8, 1024, "float32", "fragment", 1, False, 4, 128),
    "ragged_chunks_reverse": (4, 200, "float32", "shared", 1, True, 2, 128),
    "idle_team": (6, 96, "int32", "fragment", 1, False, 3, 128),
    "columns": (200, 5, "float32", "shared", 0, False, 100, 128),
    "columns_reverse_bf16": (64, 12, "bfloat16", "fragment", 0, True, 64, 64),
    "one_thread_a_line": (16, 256, "float32", "fragment", 0, False, 8, 128),
}


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "int32":
        return rng.integers(-100, 100, shape).astype(np.int32)
    x = rng.standard_normal(shape)
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(CASES))
def test_team_scan_matches_numpy(target, case):
    M, N, dtype, scope, dim, reverse, rows, threads = CASES[case]
    k = compile_program(scan_kernel(M, N, dtype, scope, dim, reverse, rows, threads), target)
    x = _data((M, N), dtype, seed=len(case))
    y = np.zeros_like(x)
    k.emulate(x, y)
    want = reference(x, dim, reverse, rows)
    if dtype == "int32":
        np.testing.assert_array_equal(y, want.astype(np.int32))
    else:  # float32 running sums, each output rounded once
        tol = 1e-2 if dtype == "bfloat16" else 1e-5
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol * 8)


@pytest.mark.parametrize(("case", "shuffles"), [("rows_4x1024", True), ("columns", True),
                                                ("one_thread_a_line", False)])
def test_cuda_scans_by_teams_where_lines_are_few(tmp_path, case, shuffles):
    M, N, dtype, scope, dim, reverse, rows, threads = CASES[case]
    k = tiled.compile(scan_kernel(M, N, dtype, scope, dim, reverse, rows, threads),
                      target="cuda:sm_90a", cache=False)
    assert ("__shfl_sync" in k.source) == shuffles
    text = sass(k.artifact, tmp_path)
    assert ("SHFL.IDX" in text) == shuffles
    assert not re.search(r"\b(LDL|STL)\b", text)  # the running sums stay in registers
