"""The layers the vLLM and SGLang plugins replace, on the H200 (issue 15's GPU check; neither
framework runs there): each tiled op the plugins' layer classes call (RMSNorm, its fused
residual add, SiluAndMul, GeluAndMul erf / tanh, RotaryEmbedding neox / GPT-J / partial
rotary / Llama-3 scaled frequencies, with the cache in the model's dtype as vLLM passes it
and in float32 as SGLang keeps it on GPUs) against the layer's native forward written in
torch (float32), in bf16 and fp16, at T = 1, 7, 16, 256, 2048 tokens. At every T each op is
also captured in a CUDA graph and replayed on new inputs copied into the captured buffers:
the replay must give the bytes an eager call gives on those inputs.

Here (the CPU machine, with TVM): python benchmarks/gpu/layers.py build --out .gpu/layers
There (device tool, carry=[".gpu"]; thin runtime only):
    python3 benchmarks/gpu/layers.py run --bundle .gpu/layers --out $OUT/layers_h200.json
"""

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, write_results

TARGET = "cuda:sm_90a"
TOKENS = (1, 7, 16, 256, 2048)
HIDDEN, INTER, HEADS, KV, D = 4096, 14336, 32, 8, 128
EPS = 1e-5
MAX_POS = 4096
# rotary variants: (name, rot_dim, is_neox, llama3 scaling)
ROTARY = (("neox", D, True, False), ("gptj", D, False, False), ("partial", D // 2, True, False),
          ("llama3", D, True, True))


def _specs(dtype: str):
    """(name, op, params) of every kernel the layers call in `dtype`."""
    norm = {"N": HIDDEN, "dtype": dtype, "eps": EPS}
    out = [("rms_norm", "rms_norm", norm), ("fused_add_rms_norm", "fused_add_rms_norm", norm)]
    for act in ("silu", "gelu", "gelu_tanh"):
        out.append((f"act_{act}", "gated_activation", {"N": INTER, "dtype": dtype, "act": act}))
    for cache in (dtype, "float32"):
        for rot_dim, neox in {(r, n) for _, r, n, _ in ROTARY}:
            out.append((f"rotary_{rot_dim}_{'neox' if neox else 'gptj'}_{cache}",
                        "rotary_embedding", {"heads": HEADS, "kv_heads": KV, "head_size": D,
                                             "rot_dim": rot_dim, "dtype": dtype,
                                             "cache_dtype": cache, "is_neox": neox}))
    return [(f"{dtype}__{n}", op, p) for n, op, p in out]


def build(out: Path) -> None:
    import tiled.ops as ops

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dtype in ("bfloat16", "float16"):
        for name, op, params in _specs(dtype):
            _, s = compile_into(out, name, ops.kernel_factory(op, TARGET, **params), TARGET)
            index[name] = {"op": op, "params": params, "cold_compile_s": round(s, 3)}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/layers.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _cos_sin(torch, rot_dim: int, llama3: bool):
    """[MAX_POS, rot_dim] cos | sin in float32, as vLLM's RotaryEmbedding builds it (and
    Llama3RotaryEmbedding's frequency scaling: factor 8, low / high 1 / 4, original 8192)."""
    inv = 1.0 / 500000.0 ** (torch.arange(0, rot_dim, 2, device="cuda").float() / rot_dim)
    if llama3:
        factor, low, high, old = 8.0, 1.0, 4.0, 8192
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where((wavelen >= old / high) & (wavelen <= old / low), mid, scaled)
    f = torch.outer(torch.arange(MAX_POS, device="cuda").float(), inv)
    return torch.cat([f.cos(), f.sin()], -1)


def _rope_native(torch, pos, x, cache, heads, rot_dim, neox):
    """The rotary layer's forward_native on [T, heads * D], in float32."""
    cos, sin = cache[pos].float().chunk(2, -1)
    x = x.reshape(-1, heads, D).float()
    rot, rest = x[..., :rot_dim], x[..., rot_dim:]
    c, s = cos[:, None], sin[:, None]
    if neox:
        x1, x2 = rot[..., :rot_dim // 2], rot[..., rot_dim // 2:]
        rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    else:  # GPT-J: pairs of neighbouring lanes
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)
    return torch.cat([rot, rest], -1).flatten(1)


def _cases(torch, dtype):
    """(layer name, make inputs(T, gen), tiled call(inputs) -> outputs, native(inputs) ->
    float32 outputs): the op as the plugins' layers call it."""
    import torch.nn.functional as F

    import tiled.ops as ops

    dt = getattr(torch, dtype)
    w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(dt)

    def rnd(g, *shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dt)

    def rms(x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()

    def fused(x, r):
        ops.fused_add_rms_norm(x, r, w, EPS)
        return x, r

    cases = [("RMSNorm", lambda T, g: [rnd(g, T, HIDDEN)],
              lambda x: [ops.rms_norm(x, w, EPS)], lambda x: [rms(x)]),
             ("RMSNorm_fused_add", lambda T, g: [rnd(g, T, HIDDEN), rnd(g, T, HIDDEN)],
              fused, lambda x, r: [rms(x.float() + r.float()), x.float() + r.float()])]
    for layer, call, approx in (("SiluAndMul", ops.silu_and_mul, None),
                                ("GeluAndMul", ops.gelu_and_mul, "none"),
                                ("GeluAndMul_tanh", lambda x: ops.gelu_and_mul(x, "tanh"),
                                 "tanh")):
        act = (lambda a: F.silu(a)) if approx is None else \
            (lambda a, ap=approx: F.gelu(a, approximate=ap))
        cases.append((layer, lambda T, g: [rnd(g, T, 2 * INTER)],
                      lambda x, c=call: [c(x)],
                      lambda x, a=act: [a(x[:, :INTER].float()) * x[:, INTER:].float()]))
    for name, rot_dim, neox, llama3 in ROTARY:
        for cache_dt in (dt, torch.float32):
            cache = _cos_sin(torch, rot_dim, llama3).to(cache_dt)

            def make(T, g):
                return [torch.randint(0, MAX_POS, (T,), device="cuda", generator=g),
                        rnd(g, T, HEADS * D), rnd(g, T, KV * D)]

            def call(pos, q, k, c=cache, n=neox):
                ops.rotary_embedding(pos, q, k, D, c, n)
                return q, k

            def native(pos, q, k, c=cache, r=rot_dim, n=neox):
                return [_rope_native(torch, pos, q, c, HEADS, r, n),
                        _rope_native(torch, pos, k, c, KV, r, n)]
            suffix = "" if cache_dt == dt else "_f32cache"
            cases.append((f"RotaryEmbedding_{name}{suffix}", make, call, native))
    return cases


def _check(torch, case, T: int) -> dict:
    """Eager numerics against the native forward, then a CUDA graph of the op at T replayed
    on new inputs: its outputs against an eager call on the same inputs."""
    name, make, call, native = case
    g = torch.Generator(device="cuda").manual_seed(T)
    xs = make(T, g)
    want = native(*[x.clone() for x in xs])
    got = call(*[x.clone() for x in xs])
    err = max(((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()
              for a, b in zip(got, want, strict=True))
    static = [x.clone() for x in xs]
    call(*[x.clone() for x in static])  # compiled / loaded before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call(*static)
    fresh = make(T, g)
    for s, f in zip(static, fresh, strict=True):
        s.copy_(f)
    graph.replay()
    eager = call(*[f.clone() for f in fresh])
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(outs, eager, strict=True))
    return {"layer": name, "tokens": T, "rel_err_vs_native": err, "graph_replay_equal": same}


def run(bundle: Path, out: Path) -> None:
    import torch

    import tiled.ops as ops

    index = json.loads((bundle / "index.json").read_text())
    for name, v in index["kernels"].items():
        ops.install(v["op"], TARGET, load_kernel(bundle, name), **v["params"])
    rows = []
    for dtype in ("bfloat16", "float16"):
        for case in _cases(torch, dtype):
            for T in TOKENS:
                row = {"dtype": dtype, **_check(torch, case, T)}
                rows.append(row)
                print(f"{dtype:8s} {row['layer']:32s} T={T:5d} rel err "
                      f"{row['rel_err_vs_native']:.1e} graph replay "
                      f"{'equal' if row['graph_replay_equal'] else 'DIFFERS'}", flush=True)
    failed = [r for r in rows if not r["graph_replay_equal"] or r["rel_err_vs_native"] > 1e-2]
    print(f"{len(rows)} checks, {len(failed)} failed (rel err > 1e-2 or replay differs)")
    write_results(out, "layers.py", bundle, index, tokens=list(TOKENS), rows=rows,
                  failed=failed)


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels")


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "layers"))
