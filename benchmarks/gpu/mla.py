"""tiled.ops.mla_decode on the H200 (issue 14's MLA table): DeepSeek-V3's decode shape (128 query
heads over one latent kv head, d = 576, values 512, block size 64, bf16), batch 64 / 128 x
context 4096 .. 16384, q_len 1: GB/s of latent cache read and TFLOP/s beside the in-place
512 MiB stream timed in the same run, and beside F.scaled_dot_product_attention on the cache
gathered into contiguous tensors (gather not timed); numerics against float SDPA.

Here (the CPU machine, with TVM): every config of tiled.ops.mla's CUDA space and the split
combine kernels
    python benchmarks/gpu/mla.py build --out .gpu/mla
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle)
    python3 benchmarks/gpu/mla.py run --bundle .gpu/mla --out $OUT/mla_h200.json
benchmarks/results/mla_h200_vsplit.json was made with a trial space (value columns split over
2 or 4 blocks, a `vsplit` parameter of paged.decode_kernel) that was slower and not kept.
"""

import json
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
H, D, DV, BLOCK, DTYPE = 128, 576, 512, 64, "bfloat16"
CASES = [(b, c) for b in (64, 128) for c in (4096, 8192, 16384)]
BUILD_MB = 1024
ROUNDS = 3
GRAPH_CALLS = 10
RW_FLOATS = 128 << 20


def build(out: Path) -> None:
    from tiled.ops import mla, paged

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for i, cfg in enumerate(mla.CUDA_SPACE):
        name = f"mla__c{i}"
        _, seconds = compile_into(out, name, mla.mla_kernel(1, H, D, DV, BLOCK, DTYPE,
                                                            BUILD_MB, D ** -0.5, **cfg), TARGET)
        index[name] = {"decode": True, "config": cfg, "cold_compile_s": round(seconds, 3)}
        print(name, index[name], flush=True)
    for s in sorted({c["splits"] for c in mla.CUDA_SPACE} - {1}):
        name = f"combine_s{s}"
        _, seconds = compile_into(out, name, paged.combine_kernel(H, DV, s, DTYPE), TARGET)
        index[name] = {"combine": True, "splits": s, "cold_compile_s": round(seconds, 3)}
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/mla.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _install_combines(bundle: Path, index: dict) -> None:
    import tiled.ops as ops

    for name, v in index["kernels"].items():
        if v.get("combine"):
            ops.install("paged_combine", TARGET, load_kernel(bundle, name), H=H, D=DV,
                        splits=v["splits"], dtype=DTYPE)


def _problem(torch, B, ctx):
    g = torch.Generator(device="cuda").manual_seed(0)
    MB = ctx // BLOCK
    q = torch.randn(B, 1, H, D, device="cuda", generator=g, dtype=torch.bfloat16)
    kv = torch.randn(B * MB, BLOCK, 1, D, device="cuda", generator=g, dtype=torch.bfloat16)
    bt = torch.randperm(B * MB, device="cuda", generator=g).to(torch.int32).view(B, MB)
    seq = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    return q, kv, bt, seq


def _row(torch, B, ctx) -> dict:
    import torch.nn.functional as F

    import tiled.ops as ops
    from tiled.ops import mla

    q, kv, bt, seq = _problem(torch, B, ctx)
    out = ops.mla_decode(q, kv, bt, seq, head_dim_v=DV)  # tunes this bucket
    tuned = mla.MLA.chosen[(TARGET, mla._bucket(B, H, D, DV, BLOCK, DTYPE, ctx // BLOCK,
                                                D ** -0.5))]
    rows = kv[bt.long()].reshape(B, 1, ctx, D)  # the gathered latent cache [B, 1, S, D]
    k, v = rows.contiguous(), rows[..., :DV].contiguous()
    # One latent head: the 128 query heads are 128 query rows of it (no GQA expansion).
    q4 = q.view(B, 1, H, D)
    ref = torch.cat([F.scaled_dot_product_attention(q4[b:b + 1].float(), k[b:b + 1].float(),
                                                    v[b:b + 1].float()) for b in range(B)])
    err = ((out.float() - ref.view(B, 1, H, DV)).norm() / ref.norm()).item()
    del ref
    rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
    us = time_graphed(torch, {
        "tiled": lambda: ops.mla_decode(q, kv, bt, seq, head_dim_v=DV),
        "sdpa_gathered": lambda: F.scaled_dot_product_attention(q4, k, v),
        "rw_kernel": rw.neg_}, ROUNDS, GRAPH_CALLS)
    kv_bytes = B * ctx * D * 2
    flops = 2 * B * H * ctx * (D + DV)
    gbs = kv_bytes / (us["tiled"] * 1e-6) / 1e9
    stream = 2 * 4 * RW_FLOATS / (us["rw_kernel"] * 1e-6) / 1e9
    row = {"batch": B, "context": ctx, "config": tuned.config, "us": us, "GB/s": gbs,
           "TFLOP/s": flops / (us["tiled"] * 1e-6) / 1e12, "stream_GB/s": stream,
           "of_bandwidth": gbs / stream, "vs_sdpa_gathered": us["sdpa_gathered"] / us["tiled"],
           "rel_err_vs_sdpa": err,
           # the tuner's timing of every candidate (L2 flushed, as it times them)
           "candidates": [{"config": c.config, "us": c.us, "skipped": c.skipped}
                          for c in tuned.candidates]}
    print(f"mla B={B:4d} ctx={ctx:6d}: {gbs:6.0f} GB/s ({row['of_bandwidth']:.0%}), "
          f"{row['TFLOP/s']:.0f} TFLOP/s, {row['vs_sdpa_gathered']:.2f}x SDPA gathered, "
          f"config {tuned.config}, err {err:.1e}", flush=True)
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
        for B, ctx in CASES:
            rows.append(_row(torch, B, ctx))
            torch.cuda.empty_cache()
            write_results(out, "mla.py", bundle, index, rounds=ROUNDS,
                          graph_calls=GRAPH_CALLS, hung=hung, rows=rows,
                          tuning_stats=dict(tuning.STATS))


def smoke_errors(launch) -> list[float]:
    """`launch(q, kv, block_tables, seq_lens, out)` on 2 sequences of 1024 tokens (one
    ragged): each sequence's relative error against float SDPA."""
    import torch
    import torch.nn.functional as F

    q, kv, bt, seq = _problem(torch, 2, 1024)
    seq[0] = 333
    out = torch.zeros(2, H, DV, device="cuda", dtype=torch.bfloat16)
    launch(q, kv, bt, seq, out)
    torch.cuda.synchronize()
    errs = []
    for b in range(2):
        n = int(seq[b])
        rows = kv[bt[b].long()].float().reshape(-1, D)[:n]
        ref = F.scaled_dot_product_attention(q[b].float().view(1, H, 1, D),
                                             rows.view(1, 1, n, D),
                                             rows[:, :DV].reshape(1, 1, n, DV),
                                             enable_gqa=True).view(H, DV)
        errs.append(((out[b].float() - ref).norm() / ref.norm()).item())
    return errs


def smoke(bundle: Path) -> None:
    """Each kernel once (smoke_errors)."""
    import torch

    from tiled.ops import paged

    index = json.loads((bundle / "index.json").read_text())
    _install_combines(bundle, index)
    for name in smoke_order([n for n, v in index["kernels"].items() if v.get("decode")]):
        kernel, config = load_kernel(bundle, name), index["kernels"][name]["config"]

        def launch(q, kv, bt, seq, out, kernel=kernel, config=config):
            paged._run(kernel, config, [q.view(2, H, D), kv, kv, bt, seq,
                                        torch.ones(2, device="cuda"), out])
        print(f"smoke {name}: max rel err {max(smoke_errors(launch)):.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "mla"))
