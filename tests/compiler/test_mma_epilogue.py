"""mma.sync accumulators to memory by vector stores (targets/cuda/epilogue.py, tiled_cuda.h's
MmaTile::store and store_acc_warp).

- The header's store code itself, compiled for the host with one thread per GPU thread and a
  barrier in each lane exchange (cuda_store_emulation.cpp), writes every element of the
  fragment where MmaLayout (the layout the lowering fills) says it lies: float32 pairs,
  16-bit quad-transposed rows, ragged rows and columns, an unaligned column offset (the
  element path), and nothing outside the tile.
- On sm_80 and sm_90a a T.copy of an mma accumulator (or of a 16-bit fragment cast from one)
  to global memory or to a plain shared tile is 16-byte stores (STG.E.128 / STS.128) where it
  was one 2-byte store per element.
"""

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler.targets.cuda.layouts import MmaLayout

REPO = pathlib.Path(__file__).resolve().parents[2]
HEADER = REPO / "tiled/compiler/targets/cuda/include/tiled_cuda.h"
HARNESS = pathlib.Path(__file__).with_name("cuda_store_emulation.cpp")
BEGIN = "// -- accumulator fragments (the mma.m16n8 C layout) to memory"
END = "// T.exp2 of a float32 on CUDA"


def _clang():
    return shutil.which("clang++-22") or shutil.which("clang++")


@pytest.fixture(scope="module")
def harness_source() -> str:
    text = HEADER.read_text()
    assert BEGIN in text and END in text, "the store region's markers moved in tiled_cuda.h"
    region = text[text.index(BEGIN):text.index(END)]
    return HARNESS.read_text().replace("// TILED_STORE_REGION", region)


def _emulate(tmp_path, source, shape, out_t, acc, row0, col0, m, n, ldc, rows):
    M, N, wm, wn = shape
    src = tmp_path / "store.cpp"
    src.write_text(source)
    exe = tmp_path / "store"
    subprocess.run([_clang(), "-std=c++20", "-O1", "-pthread", f"-DTILE_M={M}", f"-DTILE_N={N}",
                    f"-DWARPS_M={wm}", f"-DWARPS_N={wn}", f"-DOUT_T={out_t}", str(src), "-o",
                    str(exe)], check=True, capture_output=True, text=True)
    threads = len(acc)
    stdin = f"{threads} {row0} {col0} {m} {n} {ldc} {rows}\n" + \
        "\n".join(" ".join(repr(float(v)) for v in a) for a in acc)
    out = subprocess.run([str(exe)], input=stdin, check=True, capture_output=True, text=True,
                         timeout=60).stdout
    return np.array([[float(v) for v in line.split()] for line in out.splitlines()])


CASES = [  # (M, N, warp_m, warp_n), out type, row0, col0, m, n, ldc
    ((64, 64, 2, 2), "float", 0, 0, 64, 64, 64),
    ((32, 128, 1, 2), "half", 16, 64, 40, 200, 256),  # quad path, rows past m cut
    ((16, 256, 1, 4), "__nv_bfloat16", 0, 8, 16, 100, 264),  # columns past n cut mid-run
    ((32, 64, 2, 1), "half", 3, 5, 30, 60, 72),  # odd column offset: element by element
    ((16, 16, 1, 1), "__nv_bfloat16", 0, 0, 16, 16, 16),  # 16 columns a warp: pairs
]


@pytest.mark.skipif(_clang() is None, reason="needs clang++ (the dev setup installs clang-22)")
@pytest.mark.parametrize(("shape", "out_t", "row0", "col0", "m", "n", "ldc"), CASES)
def test_header_store_puts_each_slot_where_the_layout_says(tmp_path, harness_source, shape,
                                                           out_t, row0, col0, m, n, ldc):
    M, N, wm, wn = shape
    lay = MmaLayout(M, N, wm, wn)
    threads = 32 * wm * wn
    # slot values: a code of the element's tile coords, exact in the output type (bfloat16
    # holds integers to 256, half to 2048)
    span = 251 if out_t == "__nv_bfloat16" else 2039
    coords = [[[int(x) for x in lay.coords(t, i)[0]] for i in range(lay.local_size)]
              for t in range(threads)]
    code = lambda r, c: float((r * 37 + c) % span + 1)  # noqa: E731
    acc = [[code(r, c) for r, c in row] for row in coords]
    rows = row0 + M + 2
    got = _emulate(tmp_path, harness_source, shape, out_t, acc, row0, col0, m, n, ldc, rows)
    want = np.full((rows, ldc), -1.0)
    for r in range(M):
        for c in range(N):
            if row0 + r < m and col0 + c < n:
                want[row0 + r, col0 + c] = code(r, c)
    np.testing.assert_array_equal(got, want)


def _gemm_to(dst_scope, M, N, K, threads, out_dtype):
    """An mma.sync gemm whose accumulator (or its 16-bit cast) goes to C directly or through
    a shared tile."""
    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(1, threads=threads):
            a = T.alloc_shared((M, K), "float16")
            b = T.alloc_shared((K, N), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            T.copy(A[0, 0], a)
            T.copy(B[0, 0], b)
            T.clear(acc)
            T.gemm(a, b, acc)
            if out_dtype == "float32":
                out = acc
            else:
                out = T.alloc_fragment((M, N), out_dtype)
                T.copy(acc, out)
            if dst_scope == "shared":
                c = T.alloc_shared((M, N), out_dtype)
                T.copy(out, c)
                T.copy(c, C[0, 0])
            else:
                T.copy(out, C[0, 0])
    return gemm


@pytest.mark.parametrize(("arch", "dst", "M", "N", "threads", "out", "stores"), [
    ("sm_80", "global", 128, 128, 128, "float16", "STG.E.128"),
    ("sm_80", "shared", 64, 128, 128, "bfloat16", "STS.128"),
    ("sm_90a", "global", 16, 128, 128, "bfloat16", "STG.E.128"),  # too few rows for wgmma
    ("sm_80", "global", 64, 64, 128, "float32", "STG.E.64"),
])
def test_mma_accumulator_leaves_by_vectors(tmp_path, arch, dst, M, N, threads, out, stores):
    k = tiled.compile(_gemm_to(dst, M, N, 32, threads, out), target=f"cuda:{arch}",
                      cache=False)
    assert "tiled::MmaTile<" in k.source
    text = sass(k.artifact, tmp_path)
    assert "HMMA" in text and "HGMMA" not in text
    assert re.search(re.escape(stores) + r"\b", text)
    assert not re.search(r"\b(LDL|STL)\b", text)
