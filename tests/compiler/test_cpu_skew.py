"""Row-skewed stores on the cpu backend (targets/cpu/skew.py): which statements run skewed, the
lowering that stores row r - 1 in row r's pass, and kernels that give the same results skewed
or not: whole blocks and an edge block, streaming or plain stores, float32 and bfloat16."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler.targets.cpu import forward, skew
from tiled.compiler.targets.cpu.levels import codegen_of, resolve_level
from tiled.compiler.targets.cpu.lower import lower_cpu
from tiled.ops import kernels


def skews_of(kernel) -> dict[int, skew.Skew]:
    p = kernel.ir.proto
    return skew.plan(p, forward.plan(p))


def kinds_of(kernel) -> list[str]:
    return [s.WhichOneof("kind") for s in forward.top_level(kernel.ir.proto.kernel.body)]


def tir_of(kernel, enabled: bool = True) -> str:
    codegen = codegen_of(resolve_level(None))
    saved, skew.ENABLED = skew.ENABLED, enabled
    try:
        return lower_cpu(kernel.ir, codegen.vector_bytes, codegen.vector_ldexp).script()
    finally:
        skew.ENABLED = saved


def build(kernel, enabled: bool):
    saved, skew.ENABLED = skew.ENABLED, enabled
    try:
        return tiled.compile(kernel, target="cpu", cache=False)
    finally:
        skew.ENABLED = saved


def scaled_rows(cols: int, row_of_store: str = "i", map_reads: str = "i", blk: int = 4):
    """A softmax-like kernel: each row's sum of exponentials, its reciprocal (a row map
    reading `map_reads`'s row), the row scaled from the tile's row `row_of_store`."""
    M = T.dyn("M")

    @tiled.kernel
    def scaled(X: T.Tensor((M, cols), "float32"), Y: T.Tensor((M, cols), "float32")):
        with T.Kernel(T.ceildiv(M, blk), threads=128) as bx:
            x = T.alloc_fragment((blk, cols), "float32")
            s = T.alloc_fragment((blk,), "float32")
            T.copy(X[bx * blk, 0], x)
            for i, j in T.Parallel(blk, cols):
                x[i, j] = T.exp(x[i, j])
            T.reduce_sum(x, s, dim=1)
            for i in T.Parallel(blk):
                s[i] = 1.0 / s[{"i": i, "0": 0}[map_reads]]
            for i, j in T.Parallel(blk, cols):
                x[i, j] = x[{"i": i, "0": 0}[row_of_store], j] * s[i]
            T.copy(x, Y[bx * blk, 0])
    return scaled


def test_softmax_reduction_runs_its_row_map_and_store_loop_skewed():
    k = kernels.softmax(256, "float32", blk_m=4)
    kinds = kinds_of(k)
    [(p, sk)] = skews_of(k).items()
    assert kinds[p] == "reduce" and [kinds[m] for m in sk.maps] == ["for_"]
    assert kinds[sk.store] == "for_" and sk.store == sk.maps[-1] + 1
    assert kinds[sk.store + 1] == "copy"  # the copy out the store loop's stores go through


@pytest.mark.parametrize("make", [
    lambda: scaled_rows(256, row_of_store="0"),  # stores read another row of the tile
    lambda: scaled_rows(256, map_reads="0"),  # the row map reads another row
])
def test_no_skew_where_a_row_reads_another_row(make):
    assert skews_of(make()) == {}
    assert skews_of(scaled_rows(256)) != {}


def test_skewed_only_where_the_reduction_reads_memory():
    """float32 softmax's exponentials prefetch the next block: skewed, the store indexed by
    the row before. RMSNorm's and LayerNorm's plans name a skew their lowering does not take
    (their passes read rows first, or in the caches), nor bfloat16 softmax's (its stores
    convert)."""
    softmax = tir_of(kernels.softmax(256, "float32", blk_m=4))
    assert re.search(r"Y\[[^\]]*- 1\)", softmax)
    assert tir_of(kernels.softmax(256, "float32", blk_m=4), enabled=False) != softmax
    for k in (kernels.softmax(256, "bfloat16", blk_m=4),
              kernels.rms_norm(256, "float32", 1e-6, blk_m=4),
              kernels.layer_norm(256, "float32", 1e-5, True, blk_m=4)):
        assert skews_of(k) != {}
        assert tir_of(k) == tir_of(k, enabled=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 4, 13])
def test_skewed_softmax_equals_the_unskewed_build(dtype, rows):
    """With an edge block (13 rows: three blocks of 4 and one of 1) and a single row; 300
    columns: the reduction's steps and its tail. Equal to rounding: LLVM may fuse a scalar
    tail's x * log2(e) - max differently in either build (one element 1.2e-6 apart in
    float32, where the exponent is near -25)."""
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        npdt = ml_dtypes.bfloat16
    else:
        npdt = np.float32
    k = kernels.softmax(300, dtype, blk_m=4)
    on, off = build(k, True), build(k, False)
    x = (np.random.default_rng(rows).standard_normal((rows, 300), dtype=np.float32) * 3)
    x = x.astype(npdt)
    y_on, y_off = np.full_like(x, 7), np.full_like(x, 7)
    on(x, y_on)
    off(x, y_off)
    np.testing.assert_allclose(y_on.astype(np.float64), y_off.astype(np.float64),
                               rtol=1e-5 if dtype == "float32" else 8e-3, atol=0)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert np.abs(y_on.astype(np.float64) - e / e.sum(1, keepdims=True)).max() < tol


def test_skewed_kernel_with_loaded_elements_and_a_weight():
    """A reduction of loaded (not computed) elements, two row maps, a store loop that reads a
    global weight row: skew.plan takes it; the results equal numpy's."""
    M, N, blk = T.dyn("M"), 96, 4

    @tiled.kernel
    def norm(X: T.Tensor((M, N), "float32"), W: T.Tensor((N,), "float32"),
             Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, blk), threads=128) as bx:
            x = T.alloc_fragment((blk, N), "float32")
            s = T.alloc_fragment((blk,), "float32")
            r = T.alloc_fragment((blk,), "float32")
            T.copy(X[bx * blk, 0], x)
            T.reduce_max(x, s, dim=1)
            for i in T.Parallel(blk):
                r[i] = s[i] * 2.0
            for i in T.Parallel(blk):
                r[i] = 1.0 / (r[i] + 10.0)
            for i, j in T.Parallel(blk, N):
                x[i, j] = x[i, j] * r[i] + W[j]
            T.copy(x, Y[bx * blk, 0])

    [(_, sk)] = skews_of(norm).items()
    assert len(sk.maps) == 2
    x = np.random.default_rng(1).standard_normal((7, N), dtype=np.float32)
    w = np.random.default_rng(2).standard_normal(N, dtype=np.float32)
    y = np.zeros_like(x)
    tiled.compile(norm, target="cpu", cache=False)(x, w, y)
    want = x / (x.max(1, keepdims=True) * 2 + 10) + w
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
