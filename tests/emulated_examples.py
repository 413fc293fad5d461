"""What the backends that run their code on the CPU under emulation (rocm, metal) check
alike: the examples/ kernels loaded by file, relative errors, a table of the DSL's float
functions with numpy references, and the example rows of the backends' tables
(scripts/rocm_table.py, scripts/metal_table.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import ml_dtypes
import numpy as np

import tiled.lang as T

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# (name, the DSL op on x, the same on float64 numpy values (rounded to the dtype where the
# DSL rounds an intermediate), the input transform (given the abs to use))
MATH_OPS = [
    ("exp", T.exp, np.exp, lambda x, a: x),
    ("exp2", T.exp2, np.exp2, lambda x, a: x),
    ("log", T.log, np.log, lambda x, a: a(x) + 0.05),
    ("log2", T.log2, np.log2, lambda x, a: a(x) + 0.05),
    ("sqrt", T.sqrt, np.sqrt, lambda x, a: a(x)),
    ("rsqrt", T.rsqrt, lambda v: 1 / np.sqrt(v), lambda x, a: a(x) + 0.05),
    ("tanh", T.tanh, np.tanh, lambda x, a: x),
    ("sigmoid", T.sigmoid, lambda v: 1 / (1 + np.exp(-v)), lambda x, a: x * 2),
    ("erf", T.erf, np.vectorize(math.erf), lambda x, a: x),
    ("floor", T.floor, np.floor, lambda x, a: x),
    ("ceil", T.ceil, np.ceil, lambda x, a: x),
    ("sin", T.sin, np.sin, lambda x, a: x * 5),
    ("cos", T.cos, np.cos, lambda x, a: x * 5),
]
FLOAT_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def example(name: str):
    """examples/<name>.py as a module (the examples are files, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel_err(out, ref) -> float:
    """The relative Frobenius error of `out` against `ref`, in float64."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def example_runs(gemm_tiles: dict | None = None, attention_tiles: dict | None = None):
    """(row name, kernel factory, run(compiled) -> relative error, tolerance) for the examples
    at small shapes; `gemm_tiles` / `attention_tiles`: tile sizes a backend needs instead of
    the examples' own (named in the rows)."""
    rng = np.random.default_rng(0)
    ew, sm, gm, fa = (example(n) for n in ("elementwise", "softmax", "gemm", "flash_attention"))

    def elementwise(k):
        a, b = rng.standard_normal((2, 3000)).astype(np.float32)
        c = np.zeros(3000, np.float32)
        k.emulate(a, b, c)
        return rel_err(c, a + b)

    def softmax(k):
        x = rng.standard_normal((7, 256)).astype(np.float32) * 4
        y = np.zeros_like(x)
        k.emulate(x, y)
        ref = np.exp(x - x.max(1, keepdims=True))
        return rel_err(y, ref / ref.sum(1, keepdims=True))

    def gemm(M, N, K, dtype):
        npdt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16

        def run(k):
            a = rng.standard_normal((M, K)).astype(npdt)
            b = rng.standard_normal((K, N)).astype(npdt)
            c = np.zeros((M, N), npdt)
            k.emulate(a, b, c)
            return rel_err(c, a.astype(np.float64) @ b.astype(np.float64))
        return run

    def attention(causal):
        def run(k):
            q = rng.standard_normal((1, 2, 80, 64)).astype(np.float16)
            kk, v = (rng.standard_normal((1, 1, 80, 64)).astype(np.float16) for _ in "kv")
            o = np.zeros(q.shape, np.float16)
            k.emulate(q, kk, v, o)
            return rel_err(o, fa.reference(q, kk, v, causal))
        return run

    def label(tiles, what):
        return f", {' x '.join(str(v) for v in tiles.values())} {what}" if tiles else ""

    gt, at = gemm_tiles or {}, attention_tiles or {}
    symbolic = {"block_M": 64, "block_N": 64, **gt}
    return [
        ("examples/elementwise.py add", lambda: ew.add(), elementwise, 1e-6),
        ("examples/softmax.py softmax", lambda: sm.softmax(), softmax, 1e-5),
        (f"examples/gemm.py fp16 (200 x 136 x 96{label(gt, 'tiles')})",
         lambda: gm.matmul(200, 136, 96, **gt), gemm(200, 136, 96, "float16"), 2e-3),
        (f"examples/gemm.py bf16, symbolic M (100 x 72 x 96{label(gt, 'tiles')})",
         lambda: gm.matmul(T.dyn("M"), 72, 96, dtype="bfloat16", **symbolic),
         gemm(100, 72, 96, "bfloat16"), 1e-2),
        (f"examples/flash_attention.py (s 80, d 64, GQA{label(at, 'tiles')})",
         lambda: fa.flash_attention(1, 2, 1, 80, 80, 64, **at), attention(False), 2e-3),
        ("examples/flash_attention.py causal" + (f" ({label(at, 'tiles')[2:]})" if at else ""),
         lambda: fa.flash_attention(1, 2, 1, 80, 80, 64, causal=True, **at), attention(True),
         2e-3),
    ]
