"""T.gemm on rocm for every operand type MFMA takes, both archs: f16, bf16 and f32 (MFMA
16x16x16 / 16x16x4 into float32), int8 (into int32: 16x16x16 on gfx90a, 16x16x32 on gfx942),
float8 e4m3 / e5m2 and mixed (16x16x32 fp8 / bf8 on gfx942, which reads FNUZ: tiled rescales;
gfx90a has none and runs the SIMT gemm), with transposed operands and a fragment A (staged
through LDS). Disassembly shows the instruction; numerics are checked under emulation
against numpy (exactly for integers and float8 products of small values)."""

import re

import ml_dtypes
import numpy as np
import pytest

import tiled.lang as T
from tiled.compiler import compile_program
from tiled.compiler.toolchain.hip import disassemble

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
      "int8": np.int8, "int32": np.int32, "float8_e4m3": ml_dtypes.float8_e4m3fn,
      "float8_e5m2": ml_dtypes.float8_e5m2}
# (A, B, C) -> the MFMA mnemonic per arch (None: no MFMA, the SIMT gemm)
CASES = {
    ("float16", "float16", "float32"): {"gfx942": "v_mfma_f32_16x16x16_f16",
                                        "gfx90a": "v_mfma_f32_16x16x16f16"},
    ("bfloat16", "bfloat16", "float32"): {"gfx942": "v_mfma_f32_16x16x16_bf16",
                                          "gfx90a": "v_mfma_f32_16x16x16bf16_1k"},
    ("float32", "float32", "float32"): {"gfx942": "v_mfma_f32_16x16x4_f32",
                                        "gfx90a": "v_mfma_f32_16x16x4f32"},
    ("int8", "int8", "int32"): {"gfx942": "v_mfma_i32_16x16x32_i8",
                                "gfx90a": "v_mfma_i32_16x16x16i8"},
    ("float8_e4m3", "float8_e4m3", "float32"): {"gfx942": "v_mfma_f32_16x16x32_fp8_fp8",
                                                "gfx90a": None},
    ("float8_e5m2", "float8_e5m2", "float32"): {"gfx942": "v_mfma_f32_16x16x32_bf8_bf8",
                                                "gfx90a": None},
    ("float8_e4m3", "float8_e5m2", "float32"): {"gfx942": "v_mfma_f32_16x16x32_fp8_bf8",
                                                "gfx90a": None},
}
M = N = 64
K = 128


def gemm_kernel(a_dt, b_dt, c_dt, trans_a=False, trans_b=False, a_fragment=False):
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)

    @T.prim_func
    def gemm(A: T.Tensor(a_shape, a_dt), B: T.Tensor(b_shape, b_dt), C: T.Tensor((M, N), c_dt)):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared(a_shape, a_dt)
            B_s = T.alloc_shared(b_shape, b_dt)
            C_f = T.alloc_fragment((M, N), c_dt)
            T.copy(A, A_s)
            T.copy(B, B_s)
            if a_fragment:
                A_f = T.alloc_fragment(a_shape, a_dt)
                T.copy(A_s, A_f)
                T.gemm(A_f, B_s, C_f, transpose_A=trans_a, transpose_B=trans_b,
                       clear_accum=True)
            else:
                T.gemm(A_s, B_s, C_f, transpose_A=trans_a, transpose_B=trans_b,
                       clear_accum=True)
            T.copy(C_f, C)

    return gemm


def operands(a_dt, b_dt, trans_a=False, trans_b=False):
    rng = np.random.default_rng(5)
    a = rng.integers(-4, 5, (K, M) if trans_a else (M, K)).astype(np.float64)
    b = rng.integers(-4, 5, (N, K) if trans_b else (K, N)).astype(np.float64)
    if a_dt.startswith("float8") or a_dt == "int8":  # small values: exact products
        return a.astype(NP[a_dt]), b.astype(NP[b_dt])
    return (rng.standard_normal(a.shape).astype(NP[a_dt]),
            rng.standard_normal(b.shape).astype(NP[b_dt]))


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
@pytest.mark.parametrize("dts", sorted(CASES))
def test_gemm_dtype(dts, arch):
    a_dt, b_dt, c_dt = dts
    k = compile_program(gemm_kernel(a_dt, b_dt, c_dt), f"rocm:{arch}")
    asm = disassemble(k.artifact, arch)
    want = CASES[dts][arch]
    found = set(re.findall(r"\bv_mfma_\w+", asm))
    assert found == ({want} if want else set()), found
    a, b = operands(a_dt, b_dt)
    c = np.zeros((M, N), NP[c_dt])
    k.emulate(a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if c_dt == "int32" or a_dt.startswith("float8"):
        np.testing.assert_array_equal(c.astype(np.float64), ref)
    else:
        err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
        assert err < 1e-6, err


@pytest.mark.parametrize("trans_a, trans_b, a_fragment",
                         [(True, False, False), (False, True, False), (True, True, False),
                          (False, False, True), (False, True, True)])
def test_gemm_layouts(trans_a, trans_b, a_fragment):
    k = compile_program(gemm_kernel("float16", "float16", "float32", trans_a, trans_b,
                                    a_fragment), "rocm:gfx942")
    assert "v_mfma_f32_16x16x16_f16" in disassemble(k.artifact, "gfx942")
    a, b = operands("float16", "float16", trans_a, trans_b)
    c = np.zeros((M, N), np.float32)
    k.emulate(a, b, c)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-6


def test_float8_negative_zero_and_scale_on_gfx942():
    """OCP e4m3's -0 (0x80) is FNUZ's NaN to gfx942's MFMA: tiled passes it as +0; and the
    bias difference (products read as a quarter) is undone exactly."""
    k = compile_program(gemm_kernel("float8_e4m3", "float8_e4m3", "float32"), "rocm:gfx942")
    a = np.full((M, K), -0.0).astype(NP["float8_e4m3"])
    a[:, 0] = 448.0  # the largest e4m3 value: FNUZ reads it as 224
    b = np.full((K, N), 0.5).astype(NP["float8_e4m3"])
    c = np.zeros((M, N), np.float32)
    k.emulate(a, b, c)
    np.testing.assert_array_equal(c, np.full((M, N), 224.0, np.float32))
