"""Math on metal: the DSL's float functions as TVM's Metal codegen prints them (MSL's exp,
exp2, log, sqrt, rsqrt, sin, cos, floor, ceil; tanh as a stable expression; erf as TVM's
polynomial, since MSL has no erf) in float32, float16 and bfloat16 pass the type check and,
under the emulation (Metal's functions computed in float, as the reference does), match
numpy within a few ulps of the dtype. This checks tiled's lowering and TVM's expansions, not
Apple's libraries (their accuracy is Apple's: not emulated)."""


import numpy as np
import pytest

import tiled.lang as T
from tests.emulated_examples import FLOAT_DTYPES, MATH_OPS
from tiled.compiler import compile_program

OPS = [*MATH_OPS, ("abs", T.abs, np.abs, lambda x, a: x)]
NP = FLOAT_DTYPES
TOL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}
# TVM's erf polynomial (its Metal rule) is good to about 3e-6 in float32.
ERF_TOL = {"float32": 5e-6}


def math_kernel(dt: str):
    @T.prim_func
    def every_op(X: T.Tensor((256,), dt), Y: T.Tensor((len(OPS), 256), dt)):
        with T.Kernel(2, threads=64) as bx:
            for i in T.Parallel(128):
                for j, (_, op, _, pre) in enumerate(OPS):
                    Y[j, bx * 128 + i] = op(pre(X[bx * 128 + i], T.abs))

    return every_op


@pytest.mark.parametrize(("dt", "arch"), [("float32", "apple7"), ("float16", "apple7"),
                                          ("bfloat16", "apple7"), ("bfloat16", "apple9")])
def test_float_functions_match_numpy(dt, arch):
    k = compile_program(math_kernel(dt), f"metal:{arch}")
    x = np.linspace(-4, 4, 256).astype(NP[dt])
    y = np.zeros((len(OPS), 256), NP[dt])
    k.emulate(x, y)
    x64 = x.astype(np.float64)
    for j, (name, _, ref, pre) in enumerate(OPS):
        arg = pre(x64, np.abs)
        if dt != "bfloat16":  # TVM computes a bfloat16 expression in float32, rounding once
            arg = arg.astype(NP[dt]).astype(np.float64)  # the dtype rounds the input
        want = ref(arg)
        err = np.max(np.abs(y[j].astype(np.float64) - want) / np.maximum(np.abs(want), 1e-3))
        tol = ERF_TOL.get(dt, TOL[dt]) if name == "erf" else TOL[dt]
        assert err <= tol, f"{name} ({dt}): relative error {err:.2e} > {tol:.0e}"
