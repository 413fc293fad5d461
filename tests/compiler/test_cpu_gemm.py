"""The CPU gemm microkernel (tiled/compiler/targets/cpu/gemm.c) against numpy, built for each
vector width among the levels this host runs: each tile shape around the register block's
edges, transposed operands, float16 and bfloat16 operands (every one of the 65536 halves
converts exactly) and K past one panel."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from tiled import config
from tiled.compiler.targets.cpu.levels import codegen_of
from tiled.compiler.toolchain import cc
from tiled.runtime import cpu_levels

# Exports the hidden microkernel entry for ctypes.
WRAPPER = r"""
#include <stdint.h>
void tiled_gemm_f32(float*, int32_t, const void*, int32_t, int32_t, int32_t, const void*,
                    int32_t, int32_t, int32_t, int32_t, int32_t, int32_t);
__attribute__((visibility("default"))) void gemm(float* c, int32_t ldc, const void* a,
    int32_t a_rs, int32_t a_cs, int32_t a_dt, const void* b, int32_t b_rs, int32_t b_cs,
    int32_t b_dt, int32_t m, int32_t n, int32_t k) {
  tiled_gemm_f32(c, ldc, a, a_rs, a_cs, a_dt, b, b_rs, b_cs, b_dt, m, n, k);
}
"""
HOST = cpu_levels.host_cpu()
# The levels this host runs, one per vector width (gemm.c's register block follows the width).
_WIDTHS: dict[int, str] = {}
for _lv in cpu_levels.levels_of(HOST.isa):
    if _lv.requires <= HOST.flags:
        _WIDTHS.setdefault(codegen_of(_lv.name, HOST.isa).vector_bytes, _lv.name)
LEVELS = list(_WIDTHS.values())
ml_dtypes = pytest.importorskip("ml_dtypes")
DTYPE_CODE = {np.float32: 0, np.float16: 1, ml_dtypes.bfloat16: 2}


@pytest.fixture(scope="module", params=LEVELS)
def gemm(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    src = tmp / "wrapper.c"
    src.write_text(WRAPPER)
    with config.override(cache_dir=tmp / "cache"):
        objs = cc.shim_objects(codegen_of(request.param).cflags)
    so = tmp / "gemm.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-pthread", str(src), *map(str, objs), "-o",
                    str(so)], check=True)
    fn = ctypes.CDLL(str(so)).gemm
    fn.restype = None

    def run(c, a, b, transpose_a=False, transpose_b=False):
        """c += op(a) @ op(b), each a C-contiguous 2-d array as the tiles of a T.gemm."""
        m, n = c.shape
        k = a.shape[0] if transpose_a else a.shape[1]
        a_rs, a_cs = (1, a.shape[1]) if transpose_a else (a.shape[1], 1)
        b_rs, b_cs = (1, b.shape[1]) if transpose_b else (b.shape[1], 1)
        i32 = ctypes.c_int32
        fn(c.ctypes.data_as(ctypes.c_void_p), i32(n), a.ctypes.data_as(ctypes.c_void_p),
           i32(a_rs), i32(a_cs), i32(DTYPE_CODE[a.dtype.type]), b.ctypes.data_as(ctypes.c_void_p),
           i32(b_rs), i32(b_cs), i32(DTYPE_CODE[b.dtype.type]), i32(m), i32(n), i32(k))
    return run


def _ints(rng, shape, dtype):
    """Small integers: every product and sum is exact in float32, so results compare equal."""
    return rng.integers(-4, 5, size=shape).astype(dtype)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (5, 7, 3), (8, 32, 16), (9, 33, 17),
                                     (64, 64, 32), (13, 70, 300), (48, 16, 8), (6, 48, 5)])
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_accumulates_exactly(gemm, m, n, k, ta, tb):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    for a_dt, b_dt in ((np.float32, np.float32), (np.float16, np.float32),
                       (np.float32, np.float16), (np.float16, np.float16),
                       (ml_dtypes.bfloat16, np.float32), (np.float16, ml_dtypes.bfloat16)):
        a = _ints(rng, (k, m) if ta else (m, k), a_dt)
        b = _ints(rng, (n, k) if tb else (k, n), b_dt)
        c0 = _ints(rng, (m, n), np.float32)
        c = c0.copy()
        gemm(c, a, b, ta, tb)
        ref = c0 + (a.T if ta else a).astype(np.float32) @ (b.T if tb else b).astype(np.float32)
        np.testing.assert_array_equal(c, ref)


def test_every_half_converts_exactly(gemm):
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 1)
    one = np.ones((1, 1), np.float32)
    c = np.zeros((halves.shape[0], 1), np.float32)
    gemm(c, halves, one)
    want = halves.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(c), nan)
    np.testing.assert_array_equal(c[~nan], want[~nan])  # subnormals and infinities included
