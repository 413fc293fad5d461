"""tiled.ops.paged_attention on CPU tensors (the cpu target) against attention computed in
torch over each sequence's gathered blocks; its CUDA kernels compile for sm_90a."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled.ops import paged


def _reference(q, kc, vc, bt, seq_lens, scale, k_scale=1.0, v_scale=1.0):
    B, H, D = q.shape
    _, bs, KVH, _ = kc.shape
    out = torch.zeros(B, H, D)
    for b in range(B):
        n = int(seq_lens[b])
        if not n:
            continue
        pages = bt[b, : -(-n // bs)].long()
        k = kc[pages].float().reshape(-1, KVH, D)[:n] * k_scale
        v = vc[pages].float().reshape(-1, KVH, D)[:n] * v_scale
        k, v = (t.repeat_interleave(H // KVH, 1) for t in (k, v))
        att = torch.softmax(torch.einsum("hd,thd->ht", q[b].float(), k) * scale, -1)
        out[b] = torch.einsum("ht,thd->hd", att, v)
    return out


def _problem(B, H, KVH, D, bs, MB, NB, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    kc = torch.randn(NB, bs, KVH, D, generator=g).to(dtype)
    vc = torch.randn(NB, bs, KVH, D, generator=g).to(dtype)
    bt = torch.randint(0, NB, (B, MB), generator=g, dtype=torch.int32)
    return q, kc, vc, bt


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("H,KVH,bs", [(8, 2, 16), (4, 4, 32), (20, 1, 16), (8, 2, 64)])
def test_paged_attention_matches_torch_over_gathered_blocks(H, KVH, bs):
    """GQA (4 heads a kv head), plain MHA, and a group wider than one 16-row tile (20 heads
    over one kv head: two row tiles); sequences of 1 token, a ragged last block, an empty
    one and a full table."""
    B, D, MB = 4, 32, 4
    q, kc, vc, bt = _problem(B, H, KVH, D, bs, MB, NB=11, dtype=torch.float32)
    seq = torch.tensor([1, bs + 3, 0, MB * bs], dtype=torch.int32)
    out = ops.paged_attention(q, kc, vc, bt, seq)
    want = _reference(q, kc, vc, bt, seq, D ** -0.5)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, want) < 1e-5
    assert out[2].abs().max().item() == 0.0  # no tokens: zeros, not NaN


@pytest.mark.parametrize("splits", [1, 2, 3])
def test_each_split_count_and_the_combine_agree(splits):
    """The kernel of each split count directly (a split may get no tokens: its share of the
    table's width lies past a short sequence), combined by paged_combine."""
    B, H, KVH, D, bs, MB = 3, 4, 2, 32, 16, 6
    q, kc, vc, bt = _problem(B, H, KVH, D, bs, MB, NB=9, dtype=torch.float32, seed=1)
    seq = torch.tensor([5, 40, 96], dtype=torch.int32)
    kernel = paged.decode_kernel(B, H, KVH, D, bs, "float32", "float32", MB, D ** -0.5,
                                 BN=16, threads=32, splits=splits)
    import tiled

    compiled = tiled.compile(kernel, target="cpu")
    out = paged._run(compiled, {"splits": splits},
                     [q, kc, vc, bt, seq, torch.ones(2), torch.zeros_like(q)])
    assert _rel(out, _reference(q, kc, vc, bt, seq, D ** -0.5)) < 1e-5


def test_bf16_scale_and_float8_caches_with_their_scales():
    B, H, KVH, D, bs, MB = 2, 8, 2, 64, 16, 3
    q, kc, vc, bt = _problem(B, H, KVH, D, bs, MB, NB=7, dtype=torch.bfloat16, seed=2)
    seq = torch.tensor([17, 48], dtype=torch.int32)
    out = ops.paged_attention(q, kc, vc, bt, seq, scale=0.05)
    assert out.dtype == torch.bfloat16
    assert _rel(out, _reference(q, kc, vc, bt, seq, 0.05)) < 1e-2
    k8, v8 = (t.float().div(2.0).to(torch.float8_e4m3fn) for t in (kc, vc))
    want = _reference(q, k8, v8, bt, seq, D ** -0.5, k_scale=2.0, v_scale=2.0)
    for ks, vs in ((2.0, 2.0), (torch.tensor([2.0]), torch.tensor([2.0]))):
        out8 = ops.paged_attention(q, k8, v8, bt, seq, k_scale=ks, v_scale=vs)
        assert _rel(out8, want) < 1e-2


def test_paged_attention_refuses_bad_arguments():
    q, kc, vc, bt = _problem(2, 8, 2, 32, 16, 3, NB=5, dtype=torch.float32)
    seq = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="divide into kv heads"):
        ops.paged_attention(q[:, :7], kc, vc, bt, seq)
    with pytest.raises(TypeError, match=r"expected torch\.float32"):
        ops.paged_attention(q, kc.half(), vc.half(), bt, seq)
    with pytest.raises(ValueError, match="must be int32"):
        ops.paged_attention(q, kc, vc, bt.long(), seq)
    with pytest.raises(ValueError, match="one-element tensor"):
        ops.paged_attention(q, kc, vc, bt, seq, k_scale=torch.ones(2))
    with pytest.raises(ValueError, match="not a positive float"):
        ops.paged_attention(q, kc, vc, bt, seq, scale=-1.0)
    with pytest.raises(ValueError, match="leave some without"):
        paged.decode_kernel(1, 8, 2, 32, 16, "float32", "float32", 1, 0.1, BN=16, splits=4)


def test_paged_attention_custom_op_passes_opcheck():
    q, kc, vc, bt = _problem(2, 4, 2, 32, 16, 2, NB=4, dtype=torch.float32)
    seq = torch.tensor([7, 32], dtype=torch.int32)
    torch.library.opcheck(torch.ops.tiled.paged_attention.default, (q, kc, vc, bt, seq))


@pytest.mark.parametrize("splits,threads", [(1, 32), (4, 32), (4, 128)])
def test_paged_kernels_compile_for_sm90a(splits, threads):
    """Llama-3-8B's head config (32 query heads over 8 kv heads, d = 128), bf16 and fp8
    caches; the row statistics of a one-warp block stay in its lanes (shuffles)."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    for kv in ("bfloat16", "float8_e4m3"):
        c = compile_program(paged.decode_kernel(8, 32, 8, 128, 16, "bfloat16", kv, 256,
                                                128 ** -0.5, BN=64, threads=threads,
                                                splits=splits), target="cuda:sm_90a")
        if threads == 32:
            assert "float m_ptr[2];" in c.source
        if kv == "float8_e4m3":  # the float8 blocks are converted 4 elements a step
            assert "tiled::fp8_tile_convert<__nv_fp8_e4m3, __nv_bfloat16, 64, 128," in c.source
    compile_program(paged.combine_kernel(32, 128, 4, "bfloat16"), target="cuda:sm_90a")
