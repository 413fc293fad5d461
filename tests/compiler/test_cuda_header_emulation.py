"""CPU emulation of the tensor-core path of tiled_cuda.h (gemm_ss).

There is no GPU here, so the ldmatrix lane addressing and mma fragment orders
of ``tiled::gemm_ss`` are checked by emulating, for every warp of the block,
the exact sequence of ldmatrix / mma.sync operations the header issues, and
comparing the scattered accumulators with op(A) @ op(B).

PTX ISA definitions modelled here (16-bit element types):

ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 d, [addr]
    Loads 1/2/4 8x8 matrices.  Lanes 8j..8j+7 supply the addresses of rows
    0..7 of matrix j (each row = 8 consecutive 16-bit elements, 16-byte
    aligned); for .x2 only lanes 0..15 are read, for .x1 lanes 0..7.
    Destination register j of lane ln holds two elements of matrix j:
        no .trans:  Mj[ln/4][2(ln%4)],  Mj[ln/4][2(ln%4)+1]
        .trans:     Mj[2(ln%4)][ln/4],  Mj[2(ln%4)+1][ln/4]
    (the lower-k / lower-column element in the low 16 bits).

mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, c
    With g = lane/4, t = lane%4:
      A (16 x 16): a0 = A[g][2t, 2t+1]      a1 = A[g+8][2t, 2t+1]
                   a2 = A[g][2t+8, 2t+9]    a3 = A[g+8][2t+8, 2t+9]
      B (16 x 8):  b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
      C/D (16x8):  c0, c1 = C[g][2t, 2t+1]  c2, c3 = C[g+8][2t, 2t+1]
    D = A @ B + C.

What the header does (mirrored by ``emulate_gemm`` and pinned against the
header text by ``test_header_register_order_matches_emulation``):
  * A fragment (mt, ks): ldmatrix.x4, .trans iff TRANS_A, registers -> a0..a3.
  * B fragments (nt, nt+1): ldmatrix.x4, .trans iff !TRANS_B, registers
    {r0, r1, r2, r3} -> {b0, b1 of nt, b0, b1 of nt+1}; an odd last tile uses
    .x2 with {r0, r1} -> {b0, b1}.
  * mma(acc[(mt*NT + nt)*4 .. +3], a(mt), b(nt)).
The per-lane addresses come either from the Python formulas below (which
restate the derivation in the header comments) or, when nvcc is available,
from the header itself: a host program compiled against tiled_cuda.h dumps
detail::gemm_a_addr / gemm_b_addr / acc_coord_of, and the emulation runs on
those tables, so the real index code is what gets checked.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "tiled" / "compiler" / "targets" / "cuda" / "include"
HEADER = INCLUDE / "tiled_cuda.h"

SHAPES = [  # (M, N, K, WARP_M, WARP_N)
    (128, 128, 32, 2, 2),
    (64, 64, 32, 2, 2),
    (128, 256, 32, 2, 4),
    (64, 128, 64, 1, 4),
    (16, 8, 16, 1, 1),
    (128, 128, 64, 4, 1),
    (32, 24, 32, 1, 1),  # NT = 3: x4 pair + x2 tail in one warp
]
CONFIGS = [
    (shape, ta, tb, pad)
    for shape in SHAPES
    for ta, tb in itertools.product([False, True], repeat=2)
    for pad in (0, 8)
]


def _cfg_id(cfg):
    (m, n, k, wm, wn), ta, tb, pad = cfg
    return f"{m}x{n}x{k}_w{wm}x{wn}_ta{int(ta)}_tb{int(tb)}_pad{pad}"


# ---------------------------------------------------------------------------
# PTX instruction models
# ---------------------------------------------------------------------------

LANES = np.arange(32)
G = LANES // 4
T2 = 2 * (LANES % 4)


def ldmatrix(smem: np.ndarray, addrs: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """Return regs[lane, j, 2] for ldmatrix.m8n8.x{num}[.trans].b16."""
    addrs = np.asarray(addrs)
    assert addrs.shape == (32,)
    regs = np.empty((32, num, 2))
    for j in range(num):
        rows = addrs[8 * j : 8 * j + 8]
        # Row addresses must be 16-byte aligned and inside the buffer.
        assert np.all(rows % 8 == 0), f"misaligned ldmatrix row address {rows}"
        assert np.all(rows >= 0) and np.all(rows + 8 <= smem.size), f"out of bounds {rows}"
        mat = smem[rows[:, None] + np.arange(8)[None, :]]  # 8 x 8, row r from lane 8j+r
        if trans:
            mat = mat.T
        regs[:, j, 0] = mat[G, T2]
        regs[:, j, 1] = mat[G, T2 + 1]
    return regs


def mma_m16n8k16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a[lane, 4, 2], b[lane, 2, 2], c[lane, 4] -> d[lane, 4] per the PTX fragments."""
    A = np.full((16, 16), np.nan)
    B = np.full((16, 8), np.nan)
    C = np.full((16, 8), np.nan)
    for i in range(2):
        A[G, T2 + i] = a[:, 0, i]
        A[G + 8, T2 + i] = a[:, 1, i]
        A[G, T2 + 8 + i] = a[:, 2, i]
        A[G + 8, T2 + 8 + i] = a[:, 3, i]
        B[T2 + i, G] = b[:, 0, i]
        B[T2 + 8 + i, G] = b[:, 1, i]
        C[G, T2 + i] = c[:, i]
        C[G + 8, T2 + i] = c[:, 2 + i]
    D = A @ B + C
    d = np.empty((32, 4))
    for i in range(2):
        d[:, i] = D[G, T2 + i]
        d[:, 2 + i] = D[G + 8, T2 + i]
    return d


# ---------------------------------------------------------------------------
# Address formulas (Python restatement of the header's derivation)
# ---------------------------------------------------------------------------


def ldsm_a_lane_off(trans_a: bool, lda: int, ln):
    if trans_a:
        return (8 * (ln >> 4) + (ln & 7)) * lda + 8 * ((ln >> 3) & 1)
    return (ln & 15) * lda + 8 * (ln >> 4)


def ldsm_b_lane_off(trans_b: bool, ldb: int, ln):
    if trans_b:
        return (8 * (ln >> 4) + (ln & 7)) * ldb + 8 * ((ln >> 3) & 1)
    return (8 * ((ln >> 3) & 1) + (ln & 7)) * ldb + 8 * (ln >> 4)


class PyTables:
    """Address / coordinate tables computed with the Python formulas."""

    def __init__(self, M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB):
        self.M, self.N, self.K, self.WARP_M, self.WARP_N = M, N, K, WARP_M, WARP_N
        self.TA, self.TB, self.LDA, self.LDB = TA, TB, LDA, LDB

    def a_addr(self, wm, ks, mt):
        m0, k0 = wm * (self.M // self.WARP_M) + mt * 16, ks * 16
        origin = k0 * self.LDA + m0 if self.TA else m0 * self.LDA + k0
        return origin + ldsm_a_lane_off(self.TA, self.LDA, LANES)

    def b_addr(self, wn, ks, nt, x4):
        n0, k0 = wn * (self.N // self.WARP_N) + nt * 8, ks * 16
        origin = n0 * self.LDB + k0 if self.TB else k0 * self.LDB + n0
        return origin + ldsm_b_lane_off(self.TB, self.LDB, LANES if x4 else (LANES & 15))

    def acc_coord(self, tid, idx):
        WM, WN = self.M // self.WARP_M, self.N // self.WARP_N
        NT = WN // 8
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // self.WARP_N, warp % self.WARP_N
        mt, nt, r = (idx // 4) // NT, (idx // 4) % NT, idx % 4
        row = wm * WM + mt * 16 + lane // 4 + 8 * (r // 2)
        col = wn * WN + nt * 8 + (lane % 4) * 2 + (r % 2)
        return row, col


# ---------------------------------------------------------------------------
# gemm_ss emulation
# ---------------------------------------------------------------------------


def emulate_gemm(M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB, tables, rng, b_reg_order=(0, 1, 2, 3)):
    """Run the header's instruction sequence for all warps; return (C, ref)."""
    WM, WN = M // WARP_M, N // WARP_N
    MT, NT, KS = WM // 16, WN // 8, K // 16
    a_rows, a_cols = (K, M) if TA else (M, K)
    b_rows, b_cols = (N, K) if TB else (K, N)
    # Integer data: float64 arithmetic is exact, so the comparison is exact.
    a_dense = rng.integers(-8, 9, size=(a_rows, a_cols)).astype(np.float64)
    b_dense = rng.integers(-8, 9, size=(b_rows, b_cols)).astype(np.float64)
    sA = np.full((a_rows, LDA), np.nan)  # padding is NaN: reading it poisons C
    sA[:, :a_cols] = a_dense
    sB = np.full((b_rows, LDB), np.nan)
    sB[:, :b_cols] = b_dense
    sA, sB = sA.ravel(), sB.ravel()
    opA = a_dense.T if TA else a_dense
    opB = b_dense.T if TB else b_dense
    init = rng.integers(-4, 5, size=(M, N)).astype(np.float64)
    ref = init + opA @ opB

    C = np.full((M, N), np.nan)
    written = np.zeros((M, N), dtype=int)
    nacc = MT * NT * 4
    for warp in range(WARP_M * WARP_N):
        wm, wn = warp // WARP_N, warp % WARP_N
        tids = warp * 32 + LANES
        acc = np.empty((32, nacc))
        coords = [tables.acc_coord(tids, idx) for idx in range(nacc)]
        for idx, (row, col) in enumerate(coords):
            acc[:, idx] = init[row, col]
        for ks in range(KS):
            af = [ldmatrix(sA, tables.a_addr(wm, ks, mt), 4, trans=TA) for mt in range(MT)]
            bf = [None] * NT
            for nt in range(0, NT - 1, 2):
                r = ldmatrix(sB, tables.b_addr(wn, ks, nt, True), 4, trans=not TB)
                r = r[:, list(b_reg_order), :]
                bf[nt], bf[nt + 1] = r[:, 0:2, :], r[:, 2:4, :]
            if NT % 2 == 1:
                bf[NT - 1] = ldmatrix(sB, tables.b_addr(wn, ks, NT - 1, False), 2, trans=not TB)
            for mt in range(MT):
                for nt in range(NT):
                    sl = slice((mt * NT + nt) * 4, (mt * NT + nt) * 4 + 4)
                    acc[:, sl] = mma_m16n8k16(af[mt], bf[nt], acc[:, sl])
        for idx, (row, col) in enumerate(coords):
            C[row, col] = acc[:, idx]
            np.add.at(written, (row, col), 1)
    assert np.all(written == 1), "accumulator layout does not cover C exactly once"
    return C, ref


def _params(cfg):
    (M, N, K, WARP_M, WARP_N), TA, TB, pad = cfg
    LDA = (M if TA else K) + pad
    LDB = (K if TB else N) + pad
    return M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB


# ---------------------------------------------------------------------------
# Tests: instruction models
# ---------------------------------------------------------------------------


def test_ldmatrix_model_matches_definition():
    smem = np.arange(4 * 8 * 16, dtype=np.float64)  # 4 matrices of 8 rows, row stride 16
    addrs = np.array([(ln // 8) * 128 + (ln % 8) * 16 for ln in range(32)])
    for trans in (False, True):
        regs = ldmatrix(smem, addrs, 4, trans)
        for ln in range(32):
            for j in range(4):
                mat = smem[j * 128 : j * 128 + 128].reshape(8, 16)[:, :8]
                g, t = ln // 4, ln % 4
                want = (
                    (mat[g, 2 * t], mat[g, 2 * t + 1])
                    if not trans
                    else (mat[2 * t, g], mat[2 * t + 1, g])
                )
                assert tuple(regs[ln, j]) == want


def test_mma_model_is_matrix_product():
    rng = np.random.default_rng(0)
    A = rng.integers(-5, 6, (16, 16)).astype(float)
    B = rng.integers(-5, 6, (16, 8)).astype(float)
    C = rng.integers(-5, 6, (16, 8)).astype(float)
    a = np.empty((32, 4, 2))
    b = np.empty((32, 2, 2))
    c = np.empty((32, 4))
    for ln in range(32):
        g, t = ln // 4, ln % 4
        for i in range(2):
            a[ln, 0, i], a[ln, 1, i] = A[g, 2 * t + i], A[g + 8, 2 * t + i]
            a[ln, 2, i], a[ln, 3, i] = A[g, 2 * t + 8 + i], A[g + 8, 2 * t + 8 + i]
            b[ln, 0, i], b[ln, 1, i] = B[2 * t + i, g], B[2 * t + 8 + i, g]
            c[ln, i], c[ln, 2 + i] = C[g, 2 * t + i], C[g + 8, 2 * t + i]
    d = mma_m16n8k16(a, b, c)
    D = A @ B + C
    for ln in range(32):
        g, t = ln // 4, ln % 4
        assert list(d[ln]) == [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]


# ---------------------------------------------------------------------------
# Tests: gemm_ss with the Python formulas
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_gemm_emulation_python_formulas(cfg):
    p = _params(cfg)
    C, ref = emulate_gemm(*p, tables=PyTables(*p), rng=np.random.default_rng(1))
    np.testing.assert_array_equal(C, ref)


def test_emulation_detects_wrong_register_order():
    """Sanity: the check is sensitive (swapping the two B tiles of an x4 fails)."""
    p = _params(((16, 16, 16, 1, 1), False, False, 8))
    C, ref = emulate_gemm(
        *p, tables=PyTables(*p), rng=np.random.default_rng(2), b_reg_order=(2, 3, 0, 1)
    )
    assert not np.array_equal(C, ref)


def test_emulation_detects_wrong_trans_address():
    """Sanity: using the !TRANS_A lane formula for a TRANS_A tile fails."""
    p = _params(((16, 8, 16, 1, 1), True, False, 8))

    class Wrong(PyTables):
        def a_addr(self, wm, ks, mt):
            return ks * 16 * self.LDA + ldsm_a_lane_off(False, self.LDA, LANES)

    C, ref = emulate_gemm(*p, tables=Wrong(*p), rng=np.random.default_rng(3))
    assert not np.array_equal(C, ref)


# ---------------------------------------------------------------------------
# Tests: the header's own index code (host-compiled with nvcc)
# ---------------------------------------------------------------------------

DUMP_TEMPLATE = r"""
#include "tiled_cuda.h"
#include <cstdio>

template <int M, int N, int K, int WARP_M, int WARP_N, bool TA, bool TB, int LDA, int LDB>
void dump(int id) {
  constexpr int WM = M / WARP_M, WN = N / WARP_N, MT = WM / 16, NT = WN / 8, KS = K / 16;
  constexpr int NACC = tiled::acc_size<M, N, WARP_M, WARP_N>();
  printf("CFG %d %d\n", id, NACC);
  for (int wm = 0; wm < WARP_M; ++wm)
    for (int ks = 0; ks < KS; ++ks)
      for (int mt = 0; mt < MT; ++mt) {
        printf("A %d %d %d", wm, ks, mt);
        for (int l = 0; l < 32; ++l)
          printf(" %d", tiled::detail::gemm_a_addr<M, K, WARP_M, TA, LDA>(wm, l, ks, mt));
        printf("\n");
      }
  for (int wn = 0; wn < WARP_N; ++wn)
    for (int ks = 0; ks < KS; ++ks) {
      for (int nt = 0; nt + 1 < NT; nt += 2) {
        printf("B4 %d %d %d", wn, ks, nt);
        for (int l = 0; l < 32; ++l)
          printf(" %d", tiled::detail::gemm_b_addr<N, K, WARP_N, TB, LDB, true>(wn, l, ks, nt));
        printf("\n");
      }
      if (NT % 2 == 1) {
        printf("B2 %d %d %d", wn, ks, NT - 1);
        for (int l = 0; l < 32; ++l)
          printf(" %d",
                 tiled::detail::gemm_b_addr<N, K, WARP_N, TB, LDB, false>(wn, l, ks, NT - 1));
        printf("\n");
      }
    }
  for (int idx = 0; idx < NACC; ++idx) {
    printf("C %d", idx);
    for (int tid = 0; tid < 32 * WARP_M * WARP_N; ++tid) {
      int r, c;
      tiled::detail::acc_coord_of<M, N, WARP_M, WARP_N>(tid, idx, r, c);
      printf(" %d %d", r, c);
    }
    printf("\n");
  }
}

int main() {
%CALLS%
  return 0;
}
"""


class HeaderTables:
    def __init__(self, a, b4, b2, coords):
        self.a, self.b4, self.b2, self.coords = a, b4, b2, coords

    def a_addr(self, wm, ks, mt):
        return self.a[(wm, ks, mt)]

    def b_addr(self, wn, ks, nt, x4):
        return (self.b4 if x4 else self.b2)[(wn, ks, nt)]

    def acc_coord(self, tids, idx):
        rc = self.coords[idx]  # (threads, 2)
        return rc[tids, 0], rc[tids, 1]


@pytest.fixture(scope="module")
def header_tables(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    calls = []
    for i, cfg in enumerate(CONFIGS):
        args = ", ".join(str(v).lower() for v in _params(cfg))  # bools -> true/false
        calls.append(f"  dump<{args}>({i});")
    d = tmp_path_factory.mktemp("hdrdump")
    src = d / "dump.cu"
    src.write_text(DUMP_TEMPLATE.replace("%CALLS%", "\n".join(calls)))
    exe = d / "dump"
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O1", f"-I{INCLUDE}", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, f"host dump program failed to build:\n{build.stderr[-4000:]}"
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    tables = {}
    cur = None
    for line in out.splitlines():
        f = line.split()
        if f[0] == "CFG":
            cur = ({}, {}, {}, {})
            tables[int(f[1])] = cur
        elif f[0] == "A":
            cur[0][tuple(map(int, f[1:4]))] = np.array(f[4:], dtype=int)
        elif f[0] == "B4":
            cur[1][tuple(map(int, f[1:4]))] = np.array(f[4:], dtype=int)
        elif f[0] == "B2":
            cur[2][tuple(map(int, f[1:4]))] = np.array(f[4:], dtype=int)
        elif f[0] == "C":
            cur[3][int(f[1])] = np.array(f[2:], dtype=int).reshape(-1, 2)
    return {i: HeaderTables(*t) for i, t in tables.items()}


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[_cfg_id(c) for c in CONFIGS])
def test_gemm_emulation_header_index_code(header_tables, index):
    p = _params(CONFIGS[index])
    tables = header_tables[index]
    C, ref = emulate_gemm(*p, tables=tables, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(C, ref)
    # The header agrees with the Python restatement too (same derivation).
    py = PyTables(*p)
    for key, v in tables.a.items():
        wm, ks, mt = key
        np.testing.assert_array_equal(v, py.a_addr(wm, ks, mt))
    for key, v in tables.b4.items():
        np.testing.assert_array_equal(v, py.b_addr(*key, True))
    for key, v in tables.b2.items():
        np.testing.assert_array_equal(v, py.b_addr(*key, False))
    for idx, rc in tables.coords.items():
        tids = np.arange(rc.shape[0])
        r, c = py.acc_coord(tids, idx)
        np.testing.assert_array_equal(rc[:, 0], r)
        np.testing.assert_array_equal(rc[:, 1], c)


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s)


def test_header_register_order_matches_emulation():
    """Pin the parts of gemm_ss the emulation assumes but cannot execute."""
    text = _norm(HEADER.read_text())
    expected = [
        # A: .trans iff TRANS_A; x4 registers -> a0..a3 in order.
        "detail::ldsm_x4<TRANS_A>(af[mt][0],af[mt][1],af[mt][2],af[mt][3],",
        # B: .trans iff !TRANS_B; x4 registers -> (b0,b1) of nt, then of nt+1.
        "detail::ldsm_x4<!TRANS_B>(bf[nt][0],bf[nt][1],bf[nt+1][0],bf[nt+1][1],",
        "detail::ldsm_x2<!TRANS_B>(bf[NT-1][0],bf[NT-1][1],",
        "detail::mma_16816<T>(acc+(mt*NT+nt)*4,af[mt],bf[nt]);",
        # ldmatrix destination registers in order.
        '"=r"(r0),"=r"(r1),"=r"(r2),"=r"(r3)',
        # mma operands: d = c = acc[0..3], a0..a3, b0..b1 in order.
        "{%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%0,%1,%2,%3};",
        ':"+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]):"r"(a[0]),"r"(a[1]),"r"(a[2]),"r"(a[3]),"r"(b[0]),"r"(b[1])',
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    ]
    for e in expected:
        assert _norm(e) in text, f"tiled_cuda.h no longer contains {e!r}; update the emulation"
    # The .trans variant must be chosen by the template flag (true -> .trans).
    for x in ("x4", "x2"):
        pinned = f'if constexpr (TRANS) {{ asm volatile("ldmatrix.sync.aligned.m8n8.{x}.trans'
        assert _norm(pinned) in text
