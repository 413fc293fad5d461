"""tiled.ops.attention (prefill) on CPU tensors (the cpu target) against attention written out
in torch: BSHD / BHSD, GQA, causal with the last query on the last key, sliding windows,
softcap, the log-sum-exp, varlen packed sequences; its CUDA kernel compiles for sm_90a."""

import math

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled.ops import prefill as att


def _reference(q, k, v, causal=False, window=None, softcap=None, scale=None):
    """q [Sq, H, D], k / v [Sk, KVH, D] of one sequence -> (out [Sq, H, D], lse [H, Sq])."""
    Sq, H, D = q.shape
    Sk, KVH = k.shape[:2]
    scale = scale or D ** -0.5
    k, v = (t.float().repeat_interleave(H // KVH, 1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    seen = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        seen &= j <= i
        if window:
            seen &= j > i - window
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), lse


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal,window,softcap", [(False, None, None), (True, None, None),
                                                   (True, 24, None), (False, None, 5.0)])
def test_dense_attention_matches_torch(layout, causal, window, softcap):
    g = torch.Generator().manual_seed(0)
    B, Sq, Sk, H, KVH, D = 2, 40, 56, 4, 2, 64  # Sk > Sq: causal aligns the last rows
    q = torch.randn(B, Sq, H, D, generator=g)
    k = torch.randn(B, Sk, KVH, D, generator=g)
    v = torch.randn(B, Sk, KVH, D, generator=g)
    if layout == "bhsd":
        args = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    else:
        args = [q, k, v]
    out, lse = ops.attention(*args, causal=causal, window=window, softcap=softcap,
                             return_lse=True, layout=layout)
    if layout == "bhsd":
        out = out.transpose(1, 2)
    for b in range(B):
        want, want_lse = _reference(q[b], k[b], v[b], causal, window, softcap)
        assert _rel(out[b], want) < 1e-5
        assert torch.allclose(lse[b], want_lse, atol=1e-4)


def test_varlen_attention_matches_each_sequence():
    g = torch.Generator().manual_seed(1)
    H, KVH, D = 4, 1, 64
    lens_q, lens_k = [5, 33, 1, 20], [5, 40, 17, 20]
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cq[-1]), H, D, generator=g)
    k = torch.randn(int(ck[-1]), KVH, D, generator=g)
    v = torch.randn(int(ck[-1]), KVH, D, generator=g)
    for kwargs in ({}, {"max_seqlen_q": 33, "max_seqlen_k": 40}):
        out, lse = ops.attention(q, k, v, causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                 return_lse=True, **kwargs)
        for b in range(4):
            qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
            want, want_lse = _reference(q[qs], k[ks], v[ks], causal=True)
            assert _rel(out[qs], want) < 1e-5
            assert torch.allclose(lse[:, qs], want_lse, atol=1e-4)


def test_bf16_attention_and_its_custom_op():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 24, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    out = ops.attention(q, k, v, causal=True, scale=0.1)
    want, _ = _reference(q[0], k[0], v[0], causal=True, scale=0.1)
    assert out.dtype == torch.bfloat16 and _rel(out[0], want) < 1e-2
    torch.library.opcheck(torch.ops.tiled.attention.default, (q, k, v, True))


def test_attention_refuses_bad_arguments():
    q = torch.zeros(1, 8, 4, 64)
    k = torch.zeros(1, 8, 3, 64)
    with pytest.raises(ValueError, match="divide into kv heads"):
        ops.attention(q, k, k)
    with pytest.raises(ValueError, match="with causal=True"):
        ops.attention(q, q, q, window=4)
    with pytest.raises(ValueError, match="layout 'sbhd'"):
        ops.attention(q, q, q, layout="sbhd")
    with pytest.raises(ValueError, match="varlen takes both"):
        ops.attention(q, q, q, cu_seqlens_q=torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("D", [64, 128, 256])
def test_prefill_kernel_compiles_for_sm90a(D):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    for varlen in (False, True):
        for P in ("shared", "regs"):
            c = compile_program(att.prefill_kernel(16, 4, D, "bfloat16", "bshd", True, 0, 0.0,
                                                   D ** -0.5, varlen, True, 4096, BM=64,
                                                   BN=64, threads=128, P=P),
                                target="cuda:sm_90a")
            if P == "regs" and D <= 128 and not varlen:
                # P from registers, dense: the TMA-fed, software-pipelined loop (varlen's K / V
                # offsets load cu_seqlens, which keeps its loop on cp.async)
                assert "wgmma_rows_rs_issue<" in c.source and "retire<1>" in c.source
    assert math.isfinite(D ** -0.5)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 24)])
def test_probabilities_in_registers_match_torch(causal, window):
    """The P="regs" configs (P cast into a 16-bit fragment that the second gemm reads from
    registers) compute what the shared-P ones do."""
    import tiled

    g = torch.Generator().manual_seed(4)
    B, Sq, Sk, H, KVH, D = 1, 40, 56, 4, 2, 64
    q = torch.randn(B, Sq, H, D, generator=g)
    k = torch.randn(B, Sk, KVH, D, generator=g)
    v = torch.randn(B, Sk, KVH, D, generator=g)
    kernel = att.prefill_kernel(H, KVH, D, "float32", "bshd", causal, window or 0, 0.0,
                                D ** -0.5, False, True, BM=16, BN=16, threads=32, P="regs")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Sq)
    unused = torch.zeros(1, dtype=torch.int32)
    tiled.compile(kernel, target="cpu")(q, k, v, unused, unused, out, lse, unused)
    want, want_lse = _reference(q[0], k[0], v[0], causal, window)
    assert _rel(out[0], want) < 1e-5
    assert torch.allclose(lse[0], want_lse, atol=1e-4)


@pytest.mark.parametrize("window", [None, 8])
def test_rows_that_see_no_key_are_zero_with_lse_minus_inf(window):
    """Causal with more queries than keys (the last query on the last key): the first
    Sq - Sk rows see no key; their output is 0 and their log-sum-exp -inf, the others as
    torch computes them (no NaN leaks into a tile's other rows)."""
    g = torch.Generator().manual_seed(2)
    Sq, Sk, H, D = 56, 40, 2, 64
    q = torch.randn(1, Sq, H, D, generator=g)
    k = torch.randn(1, Sk, H, D, generator=g)
    v = torch.randn(1, Sk, H, D, generator=g)
    out, lse = ops.attention(q, k, v, causal=True, window=window, return_lse=True)
    empty = Sq - Sk
    assert torch.equal(out[0, :empty], torch.zeros_like(out[0, :empty]))
    assert torch.all(lse[0, :, :empty] == float("-inf"))
    want, want_lse = _reference(q[0, empty:], k[0], v[0], True, window)
    assert _rel(out[0, empty:], want) < 1e-5
    assert torch.allclose(lse[0, :, empty:], want_lse, atol=1e-4)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("P", ["shared", "regs"])
def test_the_h200_configs_stay_out_of_local_memory(tmp_path, varlen, P):
    """d 128 at the 128 x 128 tiles the H200 tunes to: no spill to local memory (a folded
    scale once made the varlen kernel spill and run 6% slower: see prefill_kernel)."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tests.compiler.test_sm90_path import sass
    from tiled.compiler import compile_program

    c = compile_program(att.prefill_kernel(32, 32, 128, "bfloat16", "bshd", True, 0, 0.0,
                                           128 ** -0.5, varlen, False, BM=128, BN=128,
                                           threads=256, P=P), target="cuda:sm_90a")
    assert not re.search(r"\b(LDL|STL)\b", sass(c.artifact, tmp_path, c.manifest.symbol))


def test_cpu_space_tiles_fit_each_query_length_by_its_bucket():
    """The 128 x 64 CPU tile serves buckets of 128 query rows and up, all of each bucket (a
    tuning's winner serves every length of its bucket), and 16 x 16 the rest."""
    from tiled.ops import prefill

    big = next(c for c in prefill.CPU_SPACE if c.get("min_seq"))
    args = (4, 4, 64, "float32", "bshd", False, None, None, 0.125, False, False)
    prefill.prefill_kernel(*args, S_bucket=65, **big)  # bucket 128
    with pytest.raises(ValueError, match="is not for 64 query rows"):
        prefill.prefill_kernel(*args, S_bucket=64, **big)
    assert any(not c.get("min_seq") for c in prefill.CPU_SPACE)
