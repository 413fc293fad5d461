"""tiled.ops.mla_decode on CPU tensors (the cpu target) against attention over each sequence's
gathered latent cache in torch (keys whole rows, values their first head_dim_v lanes, causal
over the q_len new tokens); its CUDA kernels compile for sm_90a at DeepSeek-V3's shape."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled.ops import mla


def _reference(q, kv, bt, seq_lens, dv, scale):
    B, QL, H, D = q.shape
    bs = kv.shape[1]
    out = torch.zeros(B, QL, H, dv)
    for b in range(B):
        n = int(seq_lens[b])
        rows = kv[bt[b, : -(-n // bs)].long()].float().reshape(-1, D)[:n]
        for t in range(QL):
            seen = max(n - QL + t + 1, 0)
            if not seen:
                continue
            k, v = rows[:seen], rows[:seen, :dv]
            att = torch.softmax(q[b, t].float() @ k.T * scale, -1)
            out[b, t] = att @ v
    return out


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("q_len", [1, 2])
def test_mla_decode_matches_torch(q_len):
    g = torch.Generator().manual_seed(q_len)
    B, H, D, DV, bs, MB, NB = 3, 20, 72, 64, 16, 4, 10
    q = torch.randn(B, q_len, H, D, generator=g)
    kv = torch.randn(NB, bs, 1, D, generator=g)
    bt = torch.randint(0, NB, (B, MB), generator=g, dtype=torch.int32)
    seq = torch.tensor([1, 37, 64], dtype=torch.int32)
    out = ops.mla_decode(q, kv, bt, seq, head_dim_v=DV)
    assert out.shape == (B, q_len, H, DV)
    want = _reference(q, kv, bt, seq, DV, D ** -0.5)
    assert _rel(out, want) < 1e-5
    if q_len == 2:  # the first query token of the 1-token sequence sees nothing
        assert out[0, 0].abs().max().item() == 0.0


@pytest.mark.parametrize("cfg", mla.CPU_SPACE)
def test_every_cpu_config_matches_torch(cfg):
    """Each config by itself (the tuner checks only its choice), splits combined as
    mla_decode combines them."""
    import tiled
    from tiled.ops import paged

    g = torch.Generator().manual_seed(7)
    B, H, D, DV, bs, MB, NB = 2, 20, 72, 64, 16, 4, 10
    q = torch.randn(B, 1, H, D, generator=g)
    kv = torch.randn(NB, bs, 1, D, generator=g)
    bt = torch.randint(0, NB, (B, MB), generator=g, dtype=torch.int32)
    seq = torch.tensor([29, 64], dtype=torch.int32)
    k = tiled.compile(mla.mla_kernel(B, H, D, DV, bs, "float32", MB, D ** -0.5, **cfg), "cpu")
    out = torch.zeros(B, H, DV)
    paged._run(k, cfg, [q.view(B, H, D), kv, kv, bt, seq, torch.ones(2), out])
    assert _rel(out, _reference(q, kv, bt, seq, DV, D ** -0.5)[:, 0]) < 1e-5


@pytest.mark.parametrize("form", [{"cols": True}, {"latent": True},
                                  {"cols": True, "latent": True, "splits": 2}])
def test_cuda_space_forms_compute_the_same_on_cpu(form):
    """The forms the CUDA space adds (mla.CUDA_SPACE: FullCol gemms with P in shared memory;
    the cache rows copied once as value and rope lanes, the scores two gemms) give the same
    attention: the kernel's program is target-independent, so the cpu target checks it."""
    import tiled
    from tiled.ops import paged

    g = torch.Generator().manual_seed(11)
    B, H, D, DV, bs, MB, NB = 2, 20, 72, 64, 16, 4, 10
    q = torch.randn(B, 1, H, D, generator=g)
    kv = torch.randn(NB, bs, 1, D, generator=g)
    bt = torch.randint(0, NB, (B, MB), generator=g, dtype=torch.int32)
    seq = torch.tensor([29, 64], dtype=torch.int32)
    cfg = {"BN": 16, "threads": 32, "splits": 1, **form}
    k = tiled.compile(mla.mla_kernel(B, H, D, DV, bs, "float32", MB, D ** -0.5, **cfg), "cpu")
    out = torch.zeros(B, H, DV)
    paged._run(k, cfg, [q.view(B, H, D), kv, kv, bt, seq, torch.ones(2), out])
    assert _rel(out, _reference(q, kv, bt, seq, DV, D ** -0.5)[:, 0]) < 1e-5


def test_a_latent_cache_needs_narrower_values():
    with pytest.raises(ValueError, match="latent cache needs values narrower"):
        mla.mla_kernel(1, 16, 64, 64, 16, "bfloat16", 4, 0.125, latent=True)


def test_mla_decode_refuses_bad_arguments():
    q = torch.zeros(2, 1, 4, 72)
    kv = torch.zeros(3, 16, 1, 72)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    seq = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\[num_blocks, block_size, 1, d\]"):
        ops.mla_decode(q, kv.expand(3, 16, 2, 72), bt, seq, head_dim_v=64)
    with pytest.raises(ValueError, match="head_dim_v 100"):
        ops.mla_decode(q, kv, bt, seq, head_dim_v=100)
    with pytest.raises(TypeError, match="expected q's"):
        ops.mla_decode(q, kv.half(), bt, seq, head_dim_v=64)


def test_mla_custom_op_passes_opcheck():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 72, generator=g)
    kv = torch.randn(3, 16, 1, 72, generator=g)
    bt = torch.randint(0, 3, (2, 2), generator=g, dtype=torch.int32)
    seq = torch.tensor([5, 32], dtype=torch.int32)
    torch.library.opcheck(torch.ops.tiled.mla_decode.default, (q, kv, bt, seq, 64))


def test_mla_kernels_compile_for_sm90a():
    """DeepSeek-V3: 128 heads (two 64-head row tiles), d 576, values 512, block 64."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    c = compile_program(mla.mla_kernel(64, 128, 576, 512, 64, "bfloat16", 256, 576 ** -0.5,
                                       BN=16, threads=256, splits=4), target="cuda:sm_90a")
    assert c.manifest.grid[0] == 2  # 128 heads over one latent head, 64 a block
