"""tiled.ops' memory-bound serving ops on the H200 (issue 13's table): GB/s beside the torch op
and beside a device copy of the same bytes, at M = 1, 16, 256, 4096, 32768 tokens and hidden
sizes 4096 and 8192 (bf16); then a 4-layer stack of the ops captured in a CUDA graph and
replayed, against the same stack run eagerly.

Here (the CPU machine, with TVM): the ops' kernels compiled for sm_90a into a bundle
    python benchmarks/gpu/ops.py build --out .gpu/ops
There (device tool, carry=[".gpu"]; thin runtime only): tiled.ops.install takes each loaded
kernel, then the ops run as a serving process calls them (torch tensors, current stream)
    python3 benchmarks/gpu/ops.py run --bundle .gpu/ops --out $OUT/ops_h200.json

Every call is captured GRAPH_CALLS times in a CUDA graph and the replay timed (do_bench,
medians of ROUNDS interleaved rounds: op, torch, copy). Bytes counted: what the op must read
and write (rms_norm 2 M N + N elements, fused_add_rms_norm 4 M N + N, silu_and_mul and
gelu_and_mul (erf) 3 M N for x [M, 2N], layer_norm 2 M N + 2 N, rotary the q and k lanes read
and written). The bandwidth reference is the faster
of a device copy of the same bytes (torch's copy_, a cudaMemcpy) and an in-place elementwise
kernel streaming 512 MiB (neg_, RW_BYTES: past the L2 whatever the op's size), both timed
beside the op. A launch-config sweep of the row norms
(SWEEP) follows, and issue 12's softmax fp32 (4096 columns) and silu_and_mul (14336) rows.
"""

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, smoke_in_child, write_results
from bundle_cli import graphed as graph_replay

TARGET = "cuda:sm_90a"
MS = (1, 16, 256, 4096, 32768)
HIDDEN = (4096, 8192)
DTYPE = "bfloat16"
ROUNDS = 3
GRAPH_CALLS = 20
EPS = 1e-6
# The streaming reference: an in-place neg_ over 512 MiB (ten times the H200's L2), read and
# written: HBM bandwidth whatever the op's size.
RW_FLOATS = 128 << 20
RW_BYTES = 2 * 4 * RW_FLOATS
ROPE = {"heads": 32, "kv_heads": 8, "head_size": 128, "rot_dim": 128}


def specs():
    """(name, op, params) of every kernel the run needs."""
    out = []
    for n in HIDDEN:
        out += [(f"rms_norm_{n}", "rms_norm", {"N": n, "dtype": DTYPE, "eps": EPS}),
                (f"fused_add_rms_norm_{n}", "fused_add_rms_norm",
                 {"N": n, "dtype": DTYPE, "eps": EPS}),
                (f"silu_and_mul_{n}", "gated_activation", {"N": n, "dtype": DTYPE,
                                                           "act": "silu"}),
                (f"gelu_and_mul_{n}", "gated_activation", {"N": n, "dtype": DTYPE,
                                                           "act": "gelu"}),
                (f"layer_norm_{n}", "layer_norm", {"N": n, "dtype": DTYPE, "eps": EPS,
                                                   "affine": True})]
    out.append(("rotary", "rotary_embedding", {**ROPE, "dtype": DTYPE,
                                                "cache_dtype": DTYPE, "is_neox": True}))
    out += [("softmax_fp32_4096", "softmax", {"N": 4096, "dtype": "float32"}),
            ("silu_and_mul_14336", "gated_activation", {"N": 14336, "dtype": DTYPE,
                                                         "act": "silu"})]
    return out


def _extra_cases(torch, m):
    """Issue 12's other memory-bound rows: softmax fp32 over 4096 columns, silu_and_mul over
    14336 (Llama-3-8B's intermediate size)."""
    import tiled.ops as ops

    F = torch.nn.functional
    x = torch.randn(m, 4096, device="cuda", dtype=torch.float32)
    h = torch.randn(m, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    return {"softmax_fp32_4096": (lambda: ops.softmax(x), lambda: torch.softmax(x, -1),
                                  4 * 2 * m * 4096),
            "silu_and_mul_14336": (lambda: ops.silu_and_mul(h),
                                   lambda: F.silu(h[:, :14336]) * h[:, 14336:],
                                   2 * 3 * m * 14336)}


# Launch configs (rows per block, threads) the row-norm kernels are also timed with at
# M >= 4096, beside the default one tiled.ops picks: what chooses that default.
SWEEP = ((1, 128), (1, 256), (1, 512), (1, 1024), (2, 256), (2, 512), (2, 1024), (4, 512))
SWEEP_MS = (4096, 32768)


GATED_SWEEP = ((4, 1024, 128), (2, 2048, 256), (8, 1024, 256), (1, 4096, 512), (4, 2048, 256),
               (2, 1024, 128), (1, 1024, 128), (1, 2048, 256), (2, 512, 64), (1, 512, 64))


def sweep_specs():
    """(name, op, params, launch) of the launch-config sweep's kernels: the row norms (RMSNorm,
    fused add + RMSNorm, LayerNorm with weight and bias) at both hidden sizes, softmax fp32 and
    silu_and_mul at 4096 columns."""
    out = [(f"sweep_{op}_{n}_b{b}t{t}", op, {"N": n, "dtype": DTYPE, "eps": EPS},
            {"blk_m": b, "threads": t})
           for op in ("rms_norm", "fused_add_rms_norm") for n in HIDDEN for b, t in SWEEP]
    out += [(f"sweep_layer_norm_{n}_b{b}t{t}", "layer_norm",
             {"N": n, "dtype": DTYPE, "eps": EPS, "affine": True}, {"blk_m": b, "threads": t})
            for n in HIDDEN for b, t in SWEEP]
    out += [(f"sweep_softmax_4096_b{b}t{t}", "softmax", {"N": 4096, "dtype": "float32"},
             {"blk_m": b, "threads": t}) for b, t in SWEEP]
    out += [(f"sweep_gated_activation_4096_m{bm}n{bn}t{t}", "gated_activation",
             {"N": 4096, "dtype": DTYPE, "act": "silu"},
             {"block_m": bm, "block_n": bn, "threads": t}) for bm, bn, t in GATED_SWEEP]
    return out


def _sweep_case(torch, op, n, m):
    """(the sweep kernels' arguments, the bytes they move) for op at [m, n]."""
    if op == "softmax":
        x = torch.randn(m, n, device="cuda", dtype=torch.float32)
        return (x, torch.empty_like(x)), 4 * 2 * m * n
    if op == "gated_activation":
        h = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        return (h, h.new_empty(m, n)), 2 * 3 * m * n
    x, r, w, _ = _norm_inputs(torch, n, m)
    if op == "layer_norm":  # X, weight, bias -> Y
        return (x, w, r[0].contiguous(), torch.empty_like(x)), 2 * (2 * m * n + 2 * n)
    if op == "rms_norm":
        return (x, w, torch.empty_like(x)), 2 * (2 * m * n + n)
    return (x, r, w), 2 * (4 * m * n + n)


def build(out: Path) -> None:
    import tiled.ops as ops
    from tiled.ops import kernels

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, op, params in specs():
        compiled, seconds = compile_into(out, name, ops.kernel_factory(op, TARGET, **params),
                                         TARGET)
        index[name] = {"op": op, "params": params, "cold_compile_s": round(seconds, 3),
                       "block": list(compiled.manifest.block)}
        print(name, index[name], flush=True)
    for name, op, params, launch in sweep_specs():
        _, seconds = compile_into(out, name, getattr(kernels, op)(**params, **launch), TARGET)
        index[name] = {"sweep": True, "op": op, "params": params, "launch": launch,
                       "cold_compile_s": round(seconds, 3)}
        print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/ops.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def install(bundle: Path) -> dict:
    import tiled.ops as ops

    index = json.loads((bundle / "index.json").read_text())
    for name, meta in index["kernels"].items():
        if meta.get("sweep"):
            continue
        ops.install(meta["op"], TARGET, load_kernel(bundle, name), **meta["params"])
    return index


def smoke(bundle: Path) -> None:
    import torch

    import tiled.ops as ops

    install(bundle)
    for n in HIDDEN:
        x = torch.randn(3, n, device="cuda", dtype=torch.bfloat16)
        ops.rms_norm(x, torch.ones(n, device="cuda", dtype=torch.bfloat16), EPS)
        torch.cuda.synchronize()
        print(f"smoke rms_norm_{n}: ran", flush=True)


def _norm_inputs(torch, n, m):
    """Fresh bf16 (x [m, n], residual [m, n], weight [n], gate-and-up [m, 2n])."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return (torch.randn(m, n, **bf), torch.randn(m, n, **bf), torch.randn(n, **bf),
            torch.randn(m, 2 * n, **bf))


def _cases(torch, n, m):
    """name -> (tiled call, torch call, bytes moved), on fresh tensors of M = m rows."""
    import tiled.ops as ops

    F = torch.nn.functional
    x, r, w, h = _norm_inputs(torch, n, m)
    e = 2
    return {
        "rms_norm": (lambda: ops.rms_norm(x, w, EPS),
                     lambda: F.rms_norm(x, (n,), w, EPS), e * (2 * m * n + n)),
        "fused_add_rms_norm": (lambda: ops.fused_add_rms_norm(x, r, w, EPS),
                               lambda: F.rms_norm(r.add_(x), (n,), w, EPS),
                               e * (4 * m * n + n)),
        "silu_and_mul": (lambda: ops.silu_and_mul(h),
                         lambda: F.silu(h[:, :n]) * h[:, n:], e * 3 * m * n),
        "gelu_and_mul": (lambda: ops.gelu_and_mul(h),
                         lambda: F.gelu(h[:, :n]) * h[:, n:], e * 3 * m * n),
        "layer_norm": (lambda: ops.layer_norm(x, w, w, EPS),
                       lambda: F.layer_norm(x, (n,), w, w, EPS), e * (2 * m * n + 2 * n)),
    }


def _rope_inputs(torch, m):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    hs = ROPE["head_size"]
    q = torch.randn(m, ROPE["heads"] * hs, **bf)
    k = torch.randn(m, ROPE["kv_heads"] * hs, **bf)
    cache = torch.randn(8192, ROPE["rot_dim"], **bf)
    pos = torch.randint(0, 8192, (m,), device="cuda")
    return pos, q, k, cache


def _rope_native(torch, pos, q, k, cache):
    """vLLM's forward_native, NeoX style, in place."""
    m, hs, rot = pos.numel(), ROPE["head_size"], ROPE["rot_dim"]
    cos, sin = cache[pos].chunk(2, dim=-1)
    for t, heads in ((q, ROPE["heads"]), (k, ROPE["kv_heads"])):
        v = t.view(m, heads, hs)
        a, b = v[..., :rot // 2], v[..., rot // 2:rot]
        c, s = cos[:, None], sin[:, None]
        v[..., :rot] = torch.cat([a * c - b * s, b * c + a * s], -1)


def _rope_case(torch, m):
    import tiled.ops as ops

    pos, q, k, cache = _rope_inputs(torch, m)
    nbytes = 2 * 2 * m * (ROPE["heads"] + ROPE["kv_heads"]) * ROPE["head_size"]
    return (lambda: ops.rotary_embedding(pos, q, k, ROPE["head_size"], cache, True),
            lambda: _rope_native(torch, pos, q, k, cache), nbytes)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    parts = os.environ.get("OPS_PARTS", "ops,sweep").split(",")  # "sweep": the sweep alone
    smoke_in_child(__file__, bundle, 200)
    index = install(bundle)
    rows = []
    shapes = [(n, m) for n in HIDDEN for m in MS] + [(None, 4096), (None, 32768)]
    for n, m in shapes if "ops" in parts else []:
        if n is None:
            cases, errs = _extra_cases(torch, m), {}
        else:
            cases = _cases(torch, n, m)
            if n == HIDDEN[0]:
                cases["rotary_embedding"] = _rope_case(torch, m)
            errs = _check(torch, n, m) if m in (16, 4096) else {}
        for op, (ours, theirs, nbytes) in cases.items():
            src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
            dst = torch.empty_like(src)
            rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
            calls = {"tiled": ours, "torch": theirs, "copy": lambda s=src, d=dst: d.copy_(s),
                     "rw_kernel": rw.neg_}
            graphs = {k: graph_replay(torch, f, GRAPH_CALLS) for k, f in calls.items()}
            samples = {k: [] for k in graphs}
            for _ in range(ROUNDS):
                for k, g in graphs.items():
                    samples[k].append(do_bench(g) / GRAPH_CALLS)
            us = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
            gbs = {k: (RW_BYTES if k == "rw_kernel" else nbytes) / (v * 1e-6) / 1e9
                   for k, v in us.items()}
            row = {"op": op, "M": m, "N": n or int(op.rsplit("_", 1)[1]), "bytes": nbytes,
                   "us": us, "GB/s": gbs,
                   "rel_err_vs_torch": errs.get(op),
                   "vs_torch": us["torch"] / us["tiled"],
                   "of_copy_bandwidth": gbs["tiled"] / max(gbs["copy"], gbs["rw_kernel"])}
            rows.append(row)
            print(f"{op:20s} M={m:6d} N={n}: tiled {gbs['tiled']:7.0f} GB/s, torch "
                  f"{gbs['torch']:7.0f}, copy {gbs['copy']:7.0f} / {gbs['rw_kernel']:7.0f} "
                  f"({row['vs_torch']:.2f}x "
                  f"torch, {row['of_copy_bandwidth']:.0%} of copy)", flush=True)
    graph = _graph_stack(torch) if "ops" in parts else None
    print("graph stack:", graph, flush=True)
    sweep = _sweep(torch, bundle, index) if "sweep" in parts else []
    write_results(out, "ops.py", bundle, index, rounds=ROUNDS, graph_calls=GRAPH_CALLS,
                  rows=rows, graph_stack=graph, launch_sweep=sweep)


def _sweep(torch, bundle: Path, index: dict) -> list:
    """Each sweep kernel called directly at M in SWEEP_MS, GB/s beside a copy of the same
    bytes, interleaved per (op, N, M)."""
    from triton.testing import do_bench

    rows = []
    swept = sorted({(meta["op"], meta["params"]["N"]) for meta in index["kernels"].values()
                    if meta.get("sweep")}, key=str)
    for op, n in swept:
        for m in SWEEP_MS:
            args, nbytes = _sweep_case(torch, op, n, m)
            calls = {}
            for name, meta in index["kernels"].items():
                if meta.get("sweep") and meta["op"] == op and meta["params"]["N"] == n:
                    k = load_kernel(bundle, name)
                    key = name.rsplit("_", 1)[1]  # the launch, as sweep_specs names it
                    calls[key] = lambda k=k, args=args: k(*args)
            errs = {}
            if op == "softmax":  # each kernel's output against torch's
                want = torch.softmax(args[0], -1)
                for key, call in calls.items():
                    args[1].fill_(float("nan"))
                    call()
                    errs[f"{key}_rel_err"] = ((args[1] - want).norm() / want.norm()).item()
            src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
            dst = torch.empty_like(src)
            calls["copy"] = lambda s=src, d=dst: d.copy_(s)
            calls["rw_kernel"] = torch.empty(RW_FLOATS, device="cuda",
                                             dtype=torch.float32).neg_
            graphs = {k: graph_replay(torch, f, GRAPH_CALLS) for k, f in calls.items()}
            samples = {k: [] for k in graphs}
            for _ in range(ROUNDS):
                for k, g in graphs.items():
                    samples[k].append(do_bench(g) / GRAPH_CALLS)
            gbs = {k: (RW_BYTES if k == "rw_kernel" else nbytes) /
                   (statistics.median(v) * 1e-3 * 1e-6) / 1e9 for k, v in samples.items()}
            best = max(gbs["copy"], gbs["rw_kernel"])
            row = {"op": op, "N": n, "M": m, "GB/s": gbs,
                   "of_copy_bandwidth": {k: v / best for k, v in gbs.items()},
                   "rel_err_vs_torch": errs}
            rows.append(row)
            print(f"sweep {op} N={n} M={m}: " + ", ".join(
                f"{k} {v:.0%}" for k, v in row["of_copy_bandwidth"].items()), flush=True)
    return rows


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _check(torch, n, m) -> dict:
    """op -> relative error against torch on fresh inputs (in-place ops on copies)."""
    import tiled.ops as ops

    F = torch.nn.functional
    x, r, w, h = _norm_inputs(torch, n, m)
    x2, r2 = x.clone(), r.clone()
    ops.fused_add_rms_norm(x2, r2, w, EPS)
    want_r = (x.float() + r.float()).to(torch.bfloat16)
    out = {"rms_norm": _rel(ops.rms_norm(x, w, EPS),
                            F.rms_norm(x.float(), (n,), w.float(), EPS)),
           "fused_add_rms_norm": max(_rel(r2, want_r), _rel(x2, F.rms_norm(
               want_r.float(), (n,), w.float(), EPS))),
           "silu_and_mul": _rel(ops.silu_and_mul(h), F.silu(h[:, :n].float()) * h[:, n:].float()),
           "gelu_and_mul": _rel(ops.gelu_and_mul(h), F.gelu(h[:, :n].float()) * h[:, n:].float()),
           "layer_norm": _rel(ops.layer_norm(x, w, w, EPS),
                              F.layer_norm(x.float(), (n,), w.float(), w.float(), EPS))}
    if n == HIDDEN[0]:
        pos, q, k, cache = _rope_inputs(torch, m)
        q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
        ops.rotary_embedding(pos, q1, k1, ROPE["head_size"], cache, True)
        _rope_native(torch, pos, q2, k2, cache)
        out["rotary_embedding"] = max(_rel(q1, q2), _rel(k1, k2))
    return out


def _graph_stack(torch) -> dict:
    """4 layers of fused_add_rms_norm -> silu_and_mul(cat) -> rms_norm, captured and replayed,
    against eager."""
    import tiled.ops as ops

    n, m = HIDDEN[0], 64
    bf = dict(device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(n, **bf) for _ in range(8)]
    x0, r0 = torch.randn(m, n, **bf), torch.randn(m, n, **bf)

    def stack(x, r):
        for layer in range(4):
            ops.fused_add_rms_norm(x, r, ws[2 * layer], EPS)
            x = ops.rms_norm(ops.silu_and_mul(torch.cat([x, x], -1)), ws[2 * layer + 1], EPS)
        return x + r

    want = stack(x0.clone(), r0.clone())
    x, r = x0.clone(), r0.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = stack(x, r)
    x.copy_(x0)
    r.copy_(r0)
    g.replay()
    torch.cuda.synchronize()
    err = float((y.float() - want.float()).norm() / want.float().norm())
    return {"layers": 4, "M": m, "N": n, "rel_err_graph_vs_eager": err, "ok": err < 1e-2}


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "ops"))
