"""tiled.ops on CPU tensors (the cpu target) against torch, and as torch.ops.tiled.* custom
ops: opcheck, torch.compile(fullgraph=True, dynamic=True)."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops

F = torch.nn.functional


def _close(a, b, dtype):
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    err = ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()
    assert err < tol, (err, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_serves_every_token_count_with_one_compile(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, generator=g).to(dtype)
    before = None
    for m in (5, 1, 0, 33):
        x = torch.randn(m, 96, generator=g).to(dtype)
        y = ops.rms_norm(x, w, 1e-6)
        assert y.shape == x.shape and y.dtype == dtype
        if m:
            _close(y, F.rms_norm(x.float(), (96,), w.float(), 1e-6).to(dtype), dtype)
        before = before or ops.compiled_kernels()
        assert ops.compiled_kernels() == before  # M is symbolic: no second compile
    x3 = torch.randn(2, 3, 96, generator=g).to(dtype)  # leading dims are tokens
    _close(ops.rms_norm(x3, w), F.rms_norm(x3.float(), (96,), w.float(), 1e-6).to(dtype), dtype)


def test_fused_add_rms_norm_updates_both_in_place():
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(7, 64, generator=g), torch.randn(7, 64, generator=g)
    w = torch.randn(64, generator=g)
    want_r = x + r
    want_x = F.rms_norm(want_r, (64,), w, 1e-5)
    ops.fused_add_rms_norm(x, r, w, 1e-5)
    _close(r, want_r, torch.float32)
    _close(x, want_x, torch.float32)


def test_layer_norm_softmax_and_gated_activations_match_torch():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 80, generator=g)
    w, b = torch.randn(80, generator=g), torch.randn(80, generator=g)
    _close(ops.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (80,), w, b, 1e-5), torch.float32)
    _close(ops.layer_norm(x, None, None), F.layer_norm(x, (80,)), torch.float32)
    _close(ops.softmax(x), torch.softmax(x, -1), torch.float32)
    h = torch.randn(4, 3, 64, generator=g)
    _close(ops.silu_and_mul(h), F.silu(h[..., :32]) * h[..., 32:], torch.float32)
    _close(ops.gelu_and_mul(h), F.gelu(h[..., :32]) * h[..., 32:], torch.float32)
    _close(ops.gelu_and_mul(h, "tanh"), F.gelu(h[..., :32], approximate="tanh") * h[..., 32:],
           torch.float32)
    hb = h.to(torch.bfloat16)
    _close(ops.silu_and_mul(hb), (F.silu(hb[..., :32].float()) * hb[..., 32:].float()),
           torch.bfloat16)


def _rotary_ref(pos, q, k, head_size, cache, neox):
    rot = cache.shape[1]
    cos, sin = cache[pos, :rot // 2], cache[pos, rot // 2:]

    def apply(x):
        x = x.view(x.shape[0], -1, head_size).clone()
        r = x[..., :rot]
        if neox:
            a, b = r[..., :rot // 2], r[..., rot // 2:]
        else:
            a, b = r[..., 0::2], r[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        na, nb = a * c - b * s, b * c + a * s
        if neox:
            x[..., :rot] = torch.cat([na, nb], -1)
        else:
            x[..., 0:rot:2], x[..., 1:rot:2] = na, nb
        return x.view(x.shape[0], -1)
    return apply(q), apply(k)


@pytest.mark.parametrize("neox,rot", [(True, 32), (False, 16)])
def test_rotary_embedding_rotates_query_and_key_in_place(neox, rot):
    g = torch.Generator().manual_seed(3)
    t, hs = 6, 32
    q, k = torch.randn(t, 4 * hs, generator=g), torch.randn(t, 2 * hs, generator=g)
    cache = torch.randn(50, rot, generator=g)
    pos = torch.tensor([0, 7, 3, 49, 7, 12])
    wq, wk = _rotary_ref(pos, q, k, hs, cache, neox)
    ops.rotary_embedding(pos, q, k, hs, cache, neox)
    _close(q, wq, torch.float32)
    _close(k, wk, torch.float32)


def test_bad_arguments_are_named():
    x = torch.randn(3, 16)
    with pytest.raises(ValueError, match="weight has shape"):
        ops.rms_norm(x, torch.randn(8))
    with pytest.raises(ValueError, match="must be contiguous"):
        ops.fused_add_rms_norm(x.t(), x.t(), torch.randn(3))
    with pytest.raises(ValueError, match="must be even"):
        ops.silu_and_mul(torch.randn(3, 15))
    with pytest.raises(TypeError, match="dtype float64 is not supported"):
        ops.softmax(x.double())
    with pytest.raises(ValueError, match="only the last dim"):
        ops.softmax(x, dim=0)
    with pytest.raises(ValueError, match="approximate"):
        ops.gelu_and_mul(x, "fast")


def test_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(4)
    x, r, w = (torch.randn(5, 32, generator=g) for _ in range(3))
    w = w[0]
    checks = [
        (torch.ops.tiled.rms_norm, (x, w, 1e-6)),
        (torch.ops.tiled.fused_add_rms_norm, (x.clone(), r.clone(), w, 1e-6)),
        (torch.ops.tiled.layer_norm, (x, w, w, 1e-5)),
        (torch.ops.tiled.layer_norm, (x, None, None, 1e-5)),
        (torch.ops.tiled.silu_and_mul, (x,)),
        (torch.ops.tiled.gelu_and_mul, (x, "tanh")),
        (torch.ops.tiled.softmax, (x, -1)),
        (torch.ops.tiled.rotary_embedding, (torch.tensor([1, 0, 2, 3, 1]), x.clone(), r.clone(),
                                            16, torch.randn(4, 16, generator=g), True)),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args)


def test_a_stack_of_ops_compiles_with_torch_compile_and_matches_eager():
    g = torch.Generator().manual_seed(5)
    w1, w2 = torch.randn(64, generator=g), torch.randn(64, generator=g)

    def block(x, res):
        torch.ops.tiled.fused_add_rms_norm(x, res, w1, 1e-6)
        h = torch.ops.tiled.silu_and_mul(torch.cat([x, x * 0.5], -1))
        return torch.ops.tiled.rms_norm(h, w2, 1e-6) + res

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for m in (3, 17):
        x, res = torch.randn(m, 64, generator=g), torch.randn(m, 64, generator=g)
        want = block(x.clone(), res.clone())
        got = compiled(x.clone(), res.clone())
        _close(got, want, torch.float32)


def test_every_op_kernel_compiles_for_sm90a_and_sm80():
    import tiled
    from tiled.ops import kernels as k

    for target in ("cuda:sm_90a", "cuda:sm_80"):
        for kernel in (k.rms_norm(4096, "bfloat16", 1e-6),
                       k.fused_add_rms_norm(4096, "float16", 1e-6),
                       k.layer_norm(4096, "bfloat16", 1e-5, True),
                       k.gated_activation(14336, "bfloat16", "silu"),
                       k.gated_activation(8192, "float16", "gelu_tanh"),
                       k.softmax(4096, "float32"),
                       k.rotary(32, 8, 128, 128, "bfloat16", "float32", True)):
            c = tiled.compile(kernel, target=target, cache=False)
            assert c.manifest.backend == "cuda" and c.artifact
