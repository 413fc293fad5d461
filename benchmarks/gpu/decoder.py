"""A Llama-3-8B decoder block end to end on the H200 from tiled.ops (issue 15's GPU check of
what the vLLM and SGLang plugins' layers call), beside the same block in plain torch, in the
same process: RMSNorm, the fused QKV linear, the rotary embedding (neox), causal prefill
attention (GQA 32 / 8 heads, d 128), the output linear, the fused residual add + RMSNorm, the
fused gate / up linear, SiluAndMul, the down linear and the residual (bf16, hidden 4096, MLP
14336, one sequence of T = 16, 256, 2048 tokens). Each block is captured in a CUDA graph at
every token count and replayed; numerics of both against the block in float32 torch, and each
tiled op's (also the rotary with the float32 cos / sin cache the SGLang plugin passes) against
torch.

Here (the CPU machine, with TVM): the norm / activation / rotary kernels, linear's configs
for the four weight shapes at these token counts, attention's configs, and split-K sums
    python benchmarks/gpu/decoder.py build --out .gpu/decoder
There (device tool, carry=[".gpu"]; thin runtime only)
    python3 benchmarks/gpu/decoder.py run --bundle .gpu/decoder --out $OUT/decoder_h200.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    compile_into,
    compile_sums,
    load_kernel,
    machine,
    main,
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
DTYPE = "bfloat16"
HIDDEN, INTER, HEADS, KV, D = 4096, 14336, 32, 8, 128
EPS, THETA, MAX_POS = 1e-5, 500000.0, 8192
TOKENS = (16, 256, 2048)
LINEARS = {"qkv": ((HEADS + 2 * KV) * D, HIDDEN), "o": (HIDDEN, HEADS * D),
           "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}  # (N, K)
ROUNDS = 3
GRAPH_CALLS = 5


def _op_specs():
    return [("rms_norm", "rms_norm", {"N": HIDDEN, "dtype": DTYPE, "eps": EPS}),
            ("fused_add_rms_norm", "fused_add_rms_norm", {"N": HIDDEN, "dtype": DTYPE,
                                                          "eps": EPS}),
            ("silu_and_mul", "gated_activation", {"N": INTER, "dtype": DTYPE, "act": "silu"}),
            ("rotary", "rotary_embedding", {"heads": HEADS, "kv_heads": KV, "head_size": D,
                                            "rot_dim": D, "dtype": DTYPE, "cache_dtype": DTYPE,
                                            "is_neox": True}),
            # SGLang's plugin passes the float32 cos / sin cache SGLang keeps on GPUs
            ("rotary_f32cache", "rotary_embedding", {
                "heads": HEADS, "kv_heads": KV, "head_size": D, "rot_dim": D, "dtype": DTYPE,
                "cache_dtype": "float32", "is_neox": True})]


def build(out: Path) -> None:
    import tiled.ops as ops
    from tiled.ops import gemm, prefill

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, op, params in _op_specs():
        _, s = compile_into(out, name, ops.kernel_factory(op, TARGET, **params), TARGET)
        index[name] = {"op": op, "params": params, "cold_compile_s": round(s, 3)}
    splits = set()
    for lin, (N, K) in LINEARS.items():
        for i, cfg in enumerate(gemm.CUDA_SPACE):
            m = next((t for t in TOKENS if gemm._fits(cfg, t)), None)
            if m is None:
                continue
            name = f"linear_{lin}__c{i}"
            _, s = compile_into(out, name, gemm.linear_kernel(m, N, K, DTYPE, DTYPE, **cfg),
                                TARGET)
            index[name] = {"tuned": "linear", "config": cfg, "cold_compile_s": round(s, 3)}
            if cfg.get("splits", 1) > 1:
                splits.add((N, cfg["splits"]))
    index.update(compile_sums(out, splits, DTYPE, TARGET))
    for i, cfg in enumerate(prefill.CUDA_SPACE):
        name = f"attention__c{i}"
        k = prefill.prefill_kernel(HEADS, KV, D, DTYPE, "bshd", True, 0, 0.0, D ** -0.5, False,
                                   False, **cfg)
        _, s = compile_into(out, name, k, TARGET)
        index[name] = {"tuned": "attention", "config": cfg, "cold_compile_s": round(s, 3)}
    print(len(index), "kernels", flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/decoder.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _weights(torch):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)

    def w(n, k):
        return (torch.randn(n, k, device=dev, generator=g) / k ** 0.5).to(torch.bfloat16)
    W = {lin: w(N, K) for lin, (N, K) in LINEARS.items()}
    W["norm1"] = (1 + 0.1 * torch.randn(HIDDEN, device=dev, generator=g)).bfloat16()
    W["norm2"] = (1 + 0.1 * torch.randn(HIDDEN, device=dev, generator=g)).bfloat16()
    inv = 1.0 / THETA ** (torch.arange(0, D, 2, device=dev).float() / D)
    f = torch.outer(torch.arange(MAX_POS, device=dev).float(), inv)
    W["cos_sin_f32"] = torch.cat([f.cos(), f.sin()], -1)  # [max_pos, D]: cos | sin
    W["cos_sin"] = W["cos_sin_f32"].bfloat16()
    return W


def _rope_torch(pos, x, cos_sin, heads):
    """vLLM's native neox rotary on [T, heads * D]."""
    import torch

    cos, sin = cos_sin[pos].float().chunk(2, -1)
    x = x.reshape(-1, heads, D).float()
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    c, s = cos[:, None], sin[:, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(1)


def block_torch(torch, x, pos, W, dtype):
    """The block in plain torch (dtype bf16 or float32 for the reference)."""
    import torch.nn.functional as F

    Wd = {k: v.to(dtype) for k, v in W.items()}
    T = x.shape[0]
    h = F.rms_norm(x, (HIDDEN,), Wd["norm1"], EPS)
    q, k, v = F.linear(h, Wd["qkv"]).split([HEADS * D, KV * D, KV * D], -1)
    q = _rope_torch(pos, q, W["cos_sin"], HEADS).to(dtype)
    k = _rope_torch(pos, k, W["cos_sin"], KV).to(dtype)
    a = F.scaled_dot_product_attention(q.view(1, T, HEADS, D).transpose(1, 2),
                                       k.view(1, T, KV, D).transpose(1, 2),
                                       v.reshape(1, T, KV, D).transpose(1, 2), is_causal=True,
                                       enable_gqa=True)
    x = x + F.linear(a.transpose(1, 2).reshape(T, HEADS * D), Wd["o"])
    h = F.rms_norm(x, (HIDDEN,), Wd["norm2"], EPS)
    gu = F.linear(h, Wd["gate_up"])
    return x + F.linear(F.silu(gu[:, :INTER]) * gu[:, INTER:], Wd["down"])


def block_tiled(x, pos, W):
    """The block from tiled.ops (what the plugin's layers and tiled's attention / linear
    call)."""
    import tiled.ops as ops

    T = x.shape[0]
    h = ops.rms_norm(x, W["norm1"], EPS)
    qkv = ops.linear(h, W["qkv"])
    q, k, v = (t.contiguous() for t in qkv.split([HEADS * D, KV * D, KV * D], -1))
    ops.rotary_embedding(pos, q, k, D, W["cos_sin"], True)
    a = ops.attention(q.view(1, T, HEADS, D), k.view(1, T, KV, D), v.view(1, T, KV, D),
                      causal=True)
    o = ops.linear(a.view(T, HEADS * D), W["o"])
    res = x.clone()
    ops.fused_add_rms_norm(o, res, W["norm2"], EPS)  # res = x + o, o = rms_norm(res)
    gu = ops.linear(o, W["gate_up"])
    return res + ops.linear(ops.silu_and_mul(gu), W["down"])


def stage_errors(torch, x, pos, W) -> dict:
    """Each tiled op of the block against its torch counterpart on the same inputs (float32
    references): which stage an end-to-end error comes from."""
    import torch.nn.functional as F

    import tiled.ops as ops

    T = x.shape[0]

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()
    out = {"rms_norm": rel(ops.rms_norm(x, W["norm1"], EPS),
                           F.rms_norm(x.float(), (HIDDEN,), W["norm1"].float(), EPS))}
    h = ops.rms_norm(x, W["norm1"], EPS)
    qkv = ops.linear(h, W["qkv"])
    out["linear_qkv"] = rel(qkv, h.float() @ W["qkv"].float().T)
    q, k, v = (t.contiguous() for t in qkv.split([HEADS * D, KV * D, KV * D], -1))
    rq, rk = _rope_torch(pos, q, W["cos_sin"], HEADS), _rope_torch(pos, k, W["cos_sin"], KV)
    q32, k32 = q.clone(), k.clone()  # SGLang's float32 cache
    ops.rotary_embedding(pos, q32, k32, D, W["cos_sin_f32"], True)
    rq32 = _rope_torch(pos, q, W["cos_sin_f32"], HEADS)
    rk32 = _rope_torch(pos, k, W["cos_sin_f32"], KV)
    out["rotary_q_f32cache"], out["rotary_k_f32cache"] = rel(q32, rq32), rel(k32, rk32)
    ops.rotary_embedding(pos, q, k, D, W["cos_sin"], True)
    out["rotary_q"], out["rotary_k"] = rel(q, rq), rel(k, rk)
    a = ops.attention(q.view(1, T, HEADS, D), k.view(1, T, KV, D), v.view(1, T, KV, D),
                      causal=True)
    ra = F.scaled_dot_product_attention(*(t.view(1, T, -1, D).transpose(1, 2).float()
                                          for t in (q, k, v)), is_causal=True,
                                        enable_gqa=True).transpose(1, 2)
    out["attention"] = rel(a, ra)
    o = ops.linear(a.view(T, HEADS * D), W["o"])
    out["linear_o"] = rel(o, a.view(T, -1).float() @ W["o"].float().T)
    res = x.clone()
    want_res = x.float() + o.float()
    want_h = F.rms_norm(want_res, (HIDDEN,), W["norm2"].float(), EPS)
    ops.fused_add_rms_norm(o, res, W["norm2"], EPS)
    out["fused_add_residual"], out["fused_add_norm"] = rel(res, want_res), rel(o, want_h)
    gu = ops.linear(o, W["gate_up"])
    out["linear_gate_up"] = rel(gu, o.float() @ W["gate_up"].float().T)
    act = ops.silu_and_mul(gu)
    out["silu_and_mul"] = rel(act, F.silu(gu[:, :INTER].float()) * gu[:, INTER:].float())
    out["linear_down"] = rel(ops.linear(act, W["down"]), act.float() @ W["down"].float().T)
    return out


def _row(torch, T: int, W: dict) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, HIDDEN, device="cuda", generator=g).bfloat16()
    pos = torch.arange(T, device="cuda")
    ref = block_torch(torch, x.float(), pos, W, torch.float32)
    got = block_tiled(x, pos, W)  # tunes the linears and attention for T
    stages = stage_errors(torch, x, pos, W)
    eager = block_torch(torch, x, pos, W, torch.bfloat16)
    us = time_graphed(torch, {"tiled": lambda: block_tiled(x, pos, W),
                              "torch": lambda: block_torch(torch, x, pos, W, torch.bfloat16)},
                      ROUNDS, GRAPH_CALLS)
    replay = torch.cuda.CUDAGraph()  # one more capture, its replay's output checked
    with torch.cuda.graph(replay):
        graphed_out = block_tiled(x, pos, W)
    replay.replay()
    torch.cuda.synchronize()

    def rel(a):
        return ((a.float() - ref).norm() / ref.norm()).item()
    row = {"tokens": T, "us": us, "vs_torch": us["torch"] / us["tiled"],
           "tokens_per_s": {k: T / (v * 1e-6) for k, v in us.items()},
           "rel_err_vs_float32": {"tiled": rel(got), "tiled_graph_replay": rel(graphed_out),
                                  "torch_bf16": rel(eager)},
           "stage_rel_err": stages}
    err = row["rel_err_vs_float32"]
    print(f"decoder block T={T:5d}: tiled {us['tiled']:8.1f} us, torch {us['torch']:8.1f} us "
          f"({row['vs_torch']:.2f}x), err tiled {err['tiled']:.1e} (graph "
          f"{err['tiled_graph_replay']:.1e}), torch bf16 {err['torch_bf16']:.1e}; stages "
          + ", ".join(f"{k} {v:.1e}" for k, v in stages.items()), flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    import tiled.ops as ops
    from tiled import tuning

    index = json.loads((bundle / "index.json").read_text())
    for name, v in index["kernels"].items():
        if "op" in v:
            ops.install(v["op"], TARGET, load_kernel(bundle, name), **v["params"])
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
             for n, v in index["kernels"].items() if "tuned" in v]
    W = _weights(torch)
    rows = []
    with tuning.prebuilt(pairs):
        for T in TOKENS:
            rows.append(_row(torch, T, W))
            write_results(out, "decoder.py", bundle, index, rounds=ROUNDS,
                          graph_calls=GRAPH_CALLS, rows=rows, tuning_stats=dict(tuning.STATS))


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels")


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "decoder"))
