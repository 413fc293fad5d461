"""Math on rocm without ROCm's device library: the DSL's float functions are tiled_hip.h's own
(exp, exp2, log, log2, sqrt on the hardware's instructions; tanh, erf, sin, cos, pow written
out) in float32, float16 and bfloat16, checked under emulation against numpy within a couple
of ulps of the dtype; float64 transcendentals, which AMDGPU cannot do without ocml, are a
located CompileError; float64 sqrt (an instruction) compiles."""


import numpy as np
import pytest

import tiled.lang as T
from tests.emulated_examples import FLOAT_DTYPES, MATH_OPS
from tiled.compiler import compile_program
from tiled.errors import CompileError

OPS = MATH_OPS
NP = FLOAT_DTYPES
# Largest relative error per op (float32: erf's rational form is good to ~1e-6).
TOL = {"float32": 4e-7, "float16": 1e-3, "bfloat16": 1e-2}


def math_kernel(dt: str):
    @T.prim_func
    def every_op(X: T.Tensor((512,), dt), Y: T.Tensor((len(OPS), 512), dt)):
        with T.Kernel(2, threads=128) as bx:
            for i in T.Parallel(256):
                for j, (_, op, _, pre) in enumerate(OPS):
                    Y[j, bx * 256 + i] = op(pre(X[bx * 256 + i], T.abs))

    return every_op


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_float_functions_match_numpy(dt):
    k = compile_program(math_kernel(dt), "rocm:gfx942")
    x = np.linspace(-4, 4, 512).astype(NP[dt])
    y = np.zeros((len(OPS), 512), NP[dt])
    k.emulate(x, y)
    x64 = x.astype(np.float64)
    for j, (name, _, ref, pre) in enumerate(OPS):
        arg = pre(x64, np.abs).astype(NP[dt]).astype(np.float64)  # the dtype rounds the input
        want = ref(arg)
        err = np.max(np.abs(y[j].astype(np.float64) - want) / np.maximum(np.abs(want), 1e-3))
        tol = 1e-6 if (dt, name) == ("float32", "erf") else TOL[dt]
        assert err <= tol, f"{name} ({dt}): relative error {err:.2e} > {tol:.0e}"


def test_float64_transcendentals_are_refused_where_written():
    @T.prim_func
    def exp64(X: T.Tensor((256,), "float64"), Y: T.Tensor((256,), "float64")):
        with T.Kernel(1, threads=256):
            for i in T.Parallel(256):
                Y[i] = T.exp(X[i])

    with pytest.raises(CompileError, match=r"T\.exp of float64 needs ROCm's device library") \
            as e:
        compile_program(exp64, "rocm:gfx90a")
    assert "test_rocm_math.py" in str(e.value)


def test_float64_sqrt_compiles_and_is_exact():
    @T.prim_func
    def sqrt64(X: T.Tensor((256,), "float64"), Y: T.Tensor((256,), "float64")):
        with T.Kernel(1, threads=256):
            for i in T.Parallel(256):
                Y[i] = T.sqrt(X[i])

    k = compile_program(sqrt64, "rocm:gfx90a")
    x = np.linspace(0, 100, 256)
    y = np.zeros(256)
    k.emulate(x, y)
    np.testing.assert_array_equal(y, np.sqrt(x))
