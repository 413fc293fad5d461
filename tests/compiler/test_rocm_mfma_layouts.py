"""The MFMA register layouts tiled relies on, against AMD's matrix instruction calculator
(tests/compiler/data/mfma_layouts.json, recorded by data/make_mfma_layouts.py from
github.com/ROCm/amd_matrix_instruction_calculator, cdna2 = gfx90a, cdna3 = gfx942):

- layout inference's anchor (targets/rocm/layouts.MfmaLayout, MfmaRows): which lane and slot
  hold each accumulator element, for every instruction the backend issues: 0 mismatches;
- the emulation's reference MFMA (tiled_hip_cpu.h): lanes loaded from the calculator's A / B
  tables with exact small integers, one instruction per lane group of 64, D read back through
  the calculator's D table equals A @ B exactly: 0 mismatches;
- the gemm's operand addressing (tiled_hip.h gemm_mfma: A[row l % 16][kpl * (l / 16) + j],
  B[kpl * (l / 16) + j][col l % 16]) against the A / B tables.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from tvm import tirx

from tiled.compiler.targets.rocm.layouts import MfmaLayout, MfmaRows
from tiled.compiler.toolchain import hip

DATA = json.loads((Path(__file__).with_name("data") / "mfma_layouts.json").read_text())
TABLES = DATA["instructions"]
ARCH = {"cdna2": "gfx90a", "cdna3": "gfx942"}

# calculator name -> (isa:: function, K, A element C type, B element C type, accumulator,
# how a value is encoded: numpy dtype)
INSTR = {
    "v_mfma_f32_16x16x16f16": ("mfma_f32_16x16x16_f16", 16, "_Float16", "float", np.float16),
    "v_mfma_f32_16x16x16_f16": ("mfma_f32_16x16x16_f16", 16, "_Float16", "float", np.float16),
    "v_mfma_f32_16x16x16bf16_1k": ("mfma_f32_16x16x16_bf16", 16, "unsigned short", "float",
                                   ml_dtypes.bfloat16),
    "v_mfma_f32_16x16x16_bf16": ("mfma_f32_16x16x16_bf16", 16, "unsigned short", "float",
                                 ml_dtypes.bfloat16),
    "v_mfma_f32_16x16x4f32": ("mfma_f32_16x16x4_f32", 4, "float", "float", np.float32),
    "v_mfma_f32_16x16x4_f32": ("mfma_f32_16x16x4_f32", 4, "float", "float", np.float32),
    "v_mfma_i32_16x16x16i8": ("mfma_i32_16x16x16_i8", 16, "signed char", "int", np.int8),
    "v_mfma_i32_16x16x32_i8": ("mfma_i32_16x16x32_i8", 32, "signed char", "int", np.int8),
    "v_mfma_f32_16x16x32_fp8_fp8": ("mfma_f32_16x16x32_f8<false, false>", 32, "unsigned char",
                                    "float", ml_dtypes.float8_e4m3fnuz),
    "v_mfma_f32_16x16x32_bf8_bf8": ("mfma_f32_16x16x32_f8<true, true>", 32, "unsigned char",
                                    "float", ml_dtypes.float8_e5m2fnuz),
}


def _int(e) -> int:
    return int(e.value)  # constants fold as the IR builds them


def test_the_table_covers_every_instruction_the_backend_issues():
    assert sorted(TABLES) == sorted(f"{arch}:{name}" for arch in ARCH for name in INSTR
                                    if (name in ("v_mfma_f32_16x16x16f16",
                                                 "v_mfma_f32_16x16x16bf16_1k",
                                                 "v_mfma_f32_16x16x4f32",
                                                 "v_mfma_i32_16x16x16i8")) == (arch == "cdna2"))


@pytest.mark.parametrize("key", sorted(TABLES))
def test_accumulator_anchor_matches_the_d_table(key):
    d = TABLES[key]["D"]
    lay = MfmaLayout(16, 16, 1, 1)
    rows = MfmaRows(16, 1)
    mismatches = 0
    for lane in range(64):
        for slot in range(4):
            tx, idx = tirx.const(lane, "int32"), tirx.const(slot, "int32")
            coords, _ = lay.coords(tx, idx)
            mismatches += [_int(c) for c in coords] != d[lane][slot]
            (row,), _ = rows.coords(tx, idx)
            mismatches += _int(row) != d[lane][slot][0]
            mismatches += _int(lay.row_slot(idx)) != slot
    assert mismatches == 0


def test_accumulator_anchor_over_a_wave_grid():
    # 2 x 2 waves, 2 x 2 tiles each: wave w, tile (mt, nt), register r of lane l.
    d = TABLES["cdna3:v_mfma_f32_16x16x16_f16"]["D"]
    lay = MfmaLayout(64, 64, 2, 2)
    mismatches = 0
    for tx in range(256):
        wave, lane = divmod(tx, 64)
        for idx in range(lay.local_size):
            tile, r = divmod(idx, 4)
            mt, nt = divmod(tile, 2)
            row = (wave // 2) * 32 + mt * 16 + d[lane][r][0]
            col = (wave % 2) * 32 + nt * 16 + d[lane][r][1]
            coords, _ = lay.coords(tirx.const(tx, "int32"), tirx.const(idx, "int32"))
            mismatches += [_int(c) for c in coords] != [row, col]
    assert mismatches == 0


@pytest.mark.parametrize("key", sorted(TABLES))
def test_gemm_operand_addressing_matches_the_a_and_b_tables(key):
    k = INSTR[key.split(":")[1]][1]
    kpl = k // 4
    t = TABLES[key]
    mismatches = 0
    for lane in range(64):
        for j in range(kpl):
            mismatches += t["A"][lane][j] != [lane % 16, kpl * (lane // 16) + j]
            mismatches += t["B"][lane][j] != [kpl * (lane // 16) + j, lane % 16]
    assert mismatches == 0


def _c_array(name: str, ctype: str, rows) -> str:
    body = ",".join("{" + ",".join(str(v) for v in r) + "}" for r in rows)
    return f"static const {ctype} {name}[64][{len(rows[0])}] = {{{body}}};\n"


def _program(cases: list) -> str:
    """A C++ program that runs each case's instruction over one 64-lane wave under the
    emulation and prints each lane's 4 results."""
    parts = ['#include "tiled_hip.h"\n#include <stdio.h>\n']
    calls = []
    for i, (fn, _k, a_ct, c_ct, a_bits, b_bits) in enumerate(cases):
        store = "unsigned short" if a_ct in ("_Float16", "unsigned short") else \
            "unsigned" if a_ct == "float" else a_ct
        parts.append(_c_array(f"A{i}", store, a_bits) + _c_array(f"B{i}", store, b_bits))
        parts.append(f"static void run{i}(void**) {{\n  const int l = threadIdx.x;\n"
                     f"  {a_ct} a[{len(a_bits[0])}], b[{len(b_bits[0])}];\n"
                     f"  __builtin_memcpy(a, A{i}[l], sizeof a);\n"
                     f"  __builtin_memcpy(b, B{i}[l], sizeof b);\n"
                     f"  {c_ct} c[4] = {{0, 0, 0, 0}};\n"
                     f"  tiled::isa::{fn}(a, b, c);\n"
                     f'  for (int r = 0; r < 4; ++r) printf("%d %d %d %.17g\\n", {i}, l, r, '
                     f"(double)c[r]);\n}}\n")
        calls.append(f"  tiled::emu::run_grid({{1, 1, 1}}, {{64, 1, 1}}, 0, run{i}, nullptr);")
    parts.append("int main() {\n" + "\n".join(calls) + "\n  return 0;\n}\n")
    return "".join(parts)


@pytest.mark.parametrize("calc_arch", sorted(ARCH))
def test_reference_mfma_computes_a_times_b_in_the_calculators_layouts(calc_arch, tmp_path):
    rng = np.random.default_rng(7)
    cases, expected = [], []
    for key in sorted(k for k in TABLES if k.startswith(calc_arch + ":")):
        fn, k, a_ct, c_ct, npdt = INSTR[key.split(":")[1]]
        t = TABLES[key]
        a = rng.integers(-3, 4, (16, k)).astype(np.float64)  # exact in every format
        b = rng.integers(-3, 4, (k, 16)).astype(np.float64)
        def bits(m):
            enc = m.astype(npdt)
            if a_ct == "signed char":
                return enc.astype(np.int64)
            return enc.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[enc.itemsize])

        ea, eb = bits(a), bits(b)
        a_bits = [[int(ea[r][c]) for r, c in t["A"][lane]] for lane in range(64)]
        b_bits = [[int(eb[r][c]) for r, c in t["B"][lane]] for lane in range(64)]
        cases.append((fn, k, a_ct, c_ct, a_bits, b_bits))
        expected.append((t["D"], a @ b))
    src = tmp_path / "mfma.cc"
    src.write_text(_program(cases))
    exe = tmp_path / "mfma"
    subprocess.run([hip.tool("clang"), "--driver-mode=g++", "-std=c++17", "-O1", "-w",
                    f"-D__{ARCH[calc_arch]}__", f"-I{hip.INCLUDE}", str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.split("\n"):
        if line:
            i, lane, r, v = line.split()
            got[(int(i), int(lane), int(r))] = float(v)
    mismatches = 0
    for i, (d, ref) in enumerate(expected):
        for lane in range(64):
            for r in range(4):
                row, col = d[lane][r]
                mismatches += got[(i, lane, r)] != ref[row, col]
    assert len(got) == 64 * 4 * len(cases)
    assert mismatches == 0
