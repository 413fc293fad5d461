"""tiled.ops.paged_attention on the H200 (issue 14's paged decode table): GB/s of KV cache
read beside the device's streaming bandwidth measured in the same run, and beside
F.scaled_dot_product_attention on the cache gathered into contiguous [batch, kv_heads, S, d]
tensors (the gather not timed), for Llama-3-8B (32 query heads over 8 kv heads) and -70B (64
over 8), d = 128, block size 16, bf16; batch 1 .. 256 x context 512 .. 32768 (at most 1M
tokens a call), every sequence full length, its blocks a random permutation of the cache;
then a few rows with 64-token blocks and with float8 e4m3 caches (VARIANTS; PAGED_PARTS=quick,
at build and run, takes only those float8 rows and the same rows with bf16 caches).

Here (the CPU machine, with TVM): every decode config of tiled.ops.paged's CUDA space per
head config, and the split combine kernels
    python benchmarks/gpu/paged.py build --out .gpu/paged
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle)
    python3 benchmarks/gpu/paged.py run --bundle .gpu/paged --out $OUT/paged_h200.json

Each call graph-replayed GRAPH_CALLS times; medians of ROUNDS interleaved rounds of do_bench.
The bandwidth reference is an in-place neg_ over 512 MiB (read and written: past the L2).
Every decode kernel is first launched once in a child (hung ones are left out of tuning).
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    compile_into,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    smoke_order,
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
HEADS = {"llama3_8b": (32, 8), "llama3_70b": (64, 8)}
D, DTYPE = 128, "bfloat16"
BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXTS = (512, 2048, 8192, 32768)
# (model, block size, cache dtype) -> the (batch, context) rows it runs: the full table for
# block size 16 and bf16 caches, a few rows for 64-token blocks and float8 e4m3 caches.
VARIANTS = {("llama3_8b", 16, DTYPE): None, ("llama3_70b", 16, DTYPE): None,
            ("llama3_8b", 64, DTYPE): [(8, 8192), (64, 2048), (64, 8192)],
            ("llama3_8b", 16, "float8_e4m3"): [(8, 8192), (64, 2048), (64, 8192)]}
if os.environ.get("PAGED_PARTS") == "quick":  # bf16 beside float8 caches on a few rows
    VARIANTS = {("llama3_8b", 16, DTYPE): VARIANTS[("llama3_8b", 16, "float8_e4m3")],
                ("llama3_8b", 16, "float8_e4m3"): VARIANTS[("llama3_8b", 16, "float8_e4m3")]}
MAX_TOKENS = 1 << 20  # (a 2M-token, 8-kv-head cache passes int32 indexing)
BUILD_MB = 4096  # a table width every split count of the space divides into whole steps
ROUNDS = 3
GRAPH_CALLS = 10
RW_FLOATS = 128 << 20


def build(out: Path) -> None:
    from tiled.ops import paged

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for model, block, kv in VARIANTS:
        h, kvh = HEADS[model]
        for i, cfg in enumerate(paged.CUDA_SPACE):
            name = f"{model}_b{block}_{kv}__c{i}"
            kernel = paged.decode_kernel(1, h, kvh, D, block, DTYPE, kv, BUILD_MB,
                                         D ** -0.5, **cfg)
            _, seconds = compile_into(out, name, kernel, TARGET)
            index[name] = {"decode": True, "heads": h, "kv_heads": kvh, "block_size": block,
                           "kv_dtype": kv, "config": cfg, "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    for h in sorted({HEADS[m][0] for m, _, _ in VARIANTS}):
        for s in sorted({c["splits"] for c in paged.CUDA_SPACE} - {1}):
            name = f"combine_h{h}_s{s}"
            _, seconds = compile_into(out, name, paged.combine_kernel(h, D, s, DTYPE), TARGET)
            index[name] = {"combine": True, "H": h, "D": D, "splits": s, "dtype": DTYPE,
                           "cold_compile_s": round(seconds, 3)}
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/paged.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _install_combines(bundle: Path, index: dict) -> None:
    import tiled.ops as ops

    for name, v in index["kernels"].items():
        if v.get("combine"):
            ops.install("paged_combine", TARGET, load_kernel(bundle, name), H=v["H"], D=v["D"],
                        splits=v["splits"], dtype=v["dtype"])


def _problem(torch, B, H, KVH, ctx, block=16, kv=DTYPE):
    g = torch.Generator(device="cuda").manual_seed(0)
    MB = ctx // block
    NB = B * MB
    dt = getattr(torch, DTYPE)
    kvt = torch.float8_e4m3fn if kv == "float8_e4m3" else dt
    q = torch.randn(B, H, D, device="cuda", generator=g, dtype=dt)
    kc = torch.randn(NB, block, KVH, D, device="cuda", generator=g, dtype=dt).to(kvt)
    vc = torch.randn(NB, block, KVH, D, device="cuda", generator=g, dtype=dt).to(kvt)
    bt = torch.randperm(NB, device="cuda", generator=g).to(torch.int32).view(B, MB)
    seq = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    return q, kc, vc, bt, seq


def _row(torch, model, B, ctx, block=16, kv=DTYPE) -> dict:
    import torch.nn.functional as F

    import tiled.ops as ops
    from tiled.ops import paged

    H, KVH = HEADS[model]
    q, kc, vc, bt, seq = _problem(torch, B, H, KVH, ctx, block, kv)
    out = ops.paged_attention(q, kc, vc, bt, seq)  # tunes this bucket
    tuned = paged.PAGED.chosen[(TARGET, paged._bucket(B, H, KVH, D, block, DTYPE, kv,
                                                      ctx // block, D ** -0.5))]
    # the gathered cache, [B, KVH, S, D] in q's dtype, for SDPA (made before timing)
    kg = kc[bt.long()].to(q.dtype).reshape(B, ctx, KVH, D).transpose(1, 2).contiguous()
    vg = vc[bt.long()].to(q.dtype).reshape(B, ctx, KVH, D).transpose(1, 2).contiguous()
    q4 = q.view(B, H, 1, D)
    ref = F.scaled_dot_product_attention(q4.float(), kg.float(), vg.float(),
                                         enable_gqa=True).view(B, H, D)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
    us = time_graphed(torch, {
        "tiled": lambda: ops.paged_attention(q, kc, vc, bt, seq),
        "sdpa_gathered": lambda: F.scaled_dot_product_attention(q4, kg, vg, enable_gqa=True),
        "rw_kernel": rw.neg_}, ROUNDS, GRAPH_CALLS)
    kv_bytes = 2 * B * ctx * KVH * D * kc.element_size()
    gbs = {"tiled": kv_bytes / (us["tiled"] * 1e-6) / 1e9,
           "sdpa_gathered": kv_bytes / (us["sdpa_gathered"] * 1e-6) / 1e9,
           "rw_kernel": 2 * 4 * RW_FLOATS / (us["rw_kernel"] * 1e-6) / 1e9}
    row = {"model": model, "heads": H, "kv_heads": KVH, "block_size": block, "kv_dtype": kv,
           "batch": B, "context": ctx,
           "kv_bytes": kv_bytes, "config": tuned.config, "us": us, "GB/s": gbs,
           "of_bandwidth": gbs["tiled"] / gbs["rw_kernel"],
           "vs_sdpa_gathered": us["sdpa_gathered"] / us["tiled"], "rel_err_vs_sdpa": err}
    print(f"{model} b{block} {kv} B={B:4d} ctx={ctx:6d}: {gbs['tiled']:6.0f} GB/s "
          f"({row['of_bandwidth']:.0%} of {gbs['rw_kernel']:.0f}), "
          f"{row['vs_sdpa_gathered']:.2f}x SDPA gathered, config {tuned.config}, "
          f"err {err:.1e}", flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    from tiled import tuning

    hung = smoke_in_child(__file__, bundle, 240, stall_s=30)
    index = json.loads((bundle / "index.json").read_text())
    _install_combines(bundle, index)
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
             for n, v in index["kernels"].items() if v.get("decode") and n not in hung]
    rows = []
    with tuning.prebuilt(pairs):
        for (model, block, kv), cases in VARIANTS.items():
            for B, ctx in cases or [(B, c) for B in BATCHES for c in CONTEXTS
                                    if B * c <= MAX_TOKENS]:
                rows.append(_row(torch, model, B, ctx, block, kv))
                torch.cuda.empty_cache()
            # after each variant: a run cut short still leaves the rows it measured
            write_results(out, "paged.py", bundle, index, rounds=ROUNDS,
                          graph_calls=GRAPH_CALLS, hung=hung, rows=rows,
                          tuning_stats=dict(tuning.STATS))


def smoke(bundle: Path) -> None:
    """Each decode kernel once on a small problem, against torch's attention."""
    import torch
    import torch.nn.functional as F

    from tiled.ops import paged

    index = json.loads((bundle / "index.json").read_text())
    _install_combines(bundle, index)
    names = [n for n, v in index["kernels"].items() if v.get("decode")]
    for name in smoke_order(names):
        v = index["kernels"][name]
        H, KVH, cfg = v["heads"], v["kv_heads"], v["config"]
        ctx = 1024
        q, kc, vc, bt, seq = _problem(torch, 2, H, KVH, ctx, v["block_size"], v["kv_dtype"])
        seq[0] = 333  # a ragged sequence
        out = torch.zeros_like(q)
        paged._run(load_kernel(bundle, name), cfg,
                   [q, kc, vc, bt, seq, torch.ones(2, device="cuda"), out])
        torch.cuda.synchronize()
        errs = []
        for b in range(2):
            n = int(seq[b])
            k = kc[bt[b].long()].float().reshape(-1, KVH, D)[:n].transpose(0, 1)
            vv = vc[bt[b].long()].float().reshape(-1, KVH, D)[:n].transpose(0, 1)
            ref = F.scaled_dot_product_attention(q[b].view(H, 1, D).float()[None],
                                                 k.float()[None], vv.float()[None],
                                                 enable_gqa=True).view(H, D)
            errs.append(((out[b].float() - ref).norm() / ref.norm()).item())
        print(f"smoke {name}: max rel err {max(errs):.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "paged"))
