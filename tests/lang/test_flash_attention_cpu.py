"""examples/flash_attention.py: numerics on `cpu` against a float64 numpy reference (tiny shapes,
ragged tails, GQA, causal), and a compile (no run) for cuda:sm_90a."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import flash_attention as fa

ml_dtypes = pytest.importorskip("ml_dtypes")

# P is rounded to the input dtype before P @ V and O to the output dtype: fp16 keeps ~1e-3
# relative error per element, bf16 ~8e-3, both far below what a wrong mask or rescale gives.
TOL = {"float16": 2e-3, "bfloat16": 1e-2}


def np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def run(kernel, b, h, kvh, sq, skv, d, causal, dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, sq, d)).astype(np_dtype(dtype))
    k, v = (rng.standard_normal((b, kvh, skv, d)).astype(np_dtype(dtype)) for _ in "kv")
    o = np.full(q.shape, np.nan, np_dtype(dtype))  # poisoned: every element must be written
    kernel(q, k, v, o)
    out = o.astype(np.float64)
    assert not np.isnan(out).any()
    ref = fa.reference(q, k, v, causal)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,kvh,sq,skv,dtype,bm,bn", [
    (1, 2, 2, 64, 64, "float16", 64, 64),      # MHA, one tile
    (2, 4, 1, 100, 100, "float16", 64, 64),    # GQA 4:1, ragged query and key tails
    (1, 4, 2, 130, 130, "bfloat16", 32, 64),   # GQA 2:1, block_M != block_N, 3 key tiles
    (1, 2, 1, 70, 150, "float16", 64, 32),     # seq_q != seq_kv
])
def test_matches_numpy(b, h, kvh, sq, skv, dtype, bm, bn, causal):
    k = tiled.compile(fa.flash_attention(b, h, kvh, sq, skv, 64, causal, dtype, block_M=bm,
                                         block_N=bn), "cpu")
    assert run(k, b, h, kvh, sq, skv, 64, causal, dtype) < TOL[dtype]


def test_symbolic_seq_one_compile_many_lengths():
    k = tiled.compile(fa.flash_attention(1, 2, 1, T.dyn("S"), T.dyn("S"), 64, True, "float16"),
                      "cpu")
    for s in (1, 63, 129):
        assert run(k, 1, 2, 1, s, s, 64, True, "float16", seed=s) < TOL["float16"], s


def test_gqa_rejects_non_dividing_kv_heads():
    with pytest.raises(ValueError, match="must divide"):
        fa.flash_attention(1, 6, 4, 64, 64, 64)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("dim,causal,dtype", [(64, False, "float16"), (128, True, "bfloat16")])
def test_compiles_for_sm90a(dim, causal, dtype):
    k = tiled.compile(fa.flash_attention(2, 8, 2, 1024, 1024, dim, causal, dtype), "cuda:sm_90a",
                      cache=False)
    assert k.artifact[:4] == b"\x7fELF"
    # The example's defaults (64 x 64 tiles, 128 threads) take the warp-specialized
    # attention path: one consumer warpgroup, K/V through a TMA ring (test_sm90_attention).
    assert "tiled::sm90::attn::WsAttn<" in k.source
    assert "tiled::gemm_ss<" not in k.source


def test_symbolic_seq_compiles_for_sm90a():
    """A symbolic sequence length reaches the kernel as a dim argument (CSE runs after the
    host / device split, so no expression of it becomes an unmatched kernel parameter)."""
    S = T.dyn("S")
    k = tiled.compile(fa.flash_attention(1, 2, 2, S, S, 64, True), "cuda:sm_90a", cache=False)
    assert [a.name for a in k.manifest.kernel_args if a.kind == "dim"] == ["S"]
