"""tiled.ops.attention on the H200 (issue 14's prefill table): bf16 d = 128 at S = 4096 (batch
4) and 16384 (batch 1), 32 heads, BSHD, causal and not, beside F.scaled_dot_product_attention
on the same tensors (viewed as BHSD) with the cuDNN and the flash backends, timed in the same
process; varlen (4 sequences of 4096 packed, cu_seqlens) beside the dense kernel on the same
tokens; and a few rows of other shapes (GQA 32 / 8 heads, d = 64 and 256, BHSD, ragged varlen).

Here (the CPU machine, with TVM): every config of tiled.ops.prefill's CUDA space per variant
    python benchmarks/gpu/attention.py build --out .gpu/attention
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle)
    python3 benchmarks/gpu/attention.py run --bundle .gpu/attention --out $OUT/attention.json

Each call graph-replayed GRAPH_CALLS times; medians of ROUNDS interleaved rounds of do_bench.
TFLOP/s counts 4 * heads * d * (the query-key pairs each sequence computes: Sq * Sk, about
half that when causal). Every kernel is first launched once in a child (hung ones are left
out of tuning) and checked against float SDPA.
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
    tuning_records,
    write_results,
)

TARGET = "cuda:sm_90a"
DTYPE = "bfloat16"
# variant -> (heads, kv heads, d, layout, causal, varlen)
VARIANTS = {
    "mha_d128": (32, 32, 128, "bshd", False, False),
    "mha_d128_causal": (32, 32, 128, "bshd", True, False),
    "varlen_d128": (32, 32, 128, "bshd", False, True),
    "varlen_d128_causal": (32, 32, 128, "bshd", True, True),
    "gqa8_d128_causal": (32, 8, 128, "bshd", True, False),
    "mha_d64": (32, 32, 64, "bshd", False, False),
    "mha_d256": (32, 32, 256, "bshd", False, False),
    "bhsd_d128_causal": (32, 32, 128, "bhsd", True, False),
}
# (variant, sequence lengths: one per batch entry; dense rows have equal lengths)
ROWS = [
    *((v, (s,) * b) for v in ("mha_d128", "mha_d128_causal") for s, b in ((4096, 4),
                                                                        (16384, 1))),
    *((v, (4096,) * 4) for v in ("varlen_d128", "varlen_d128_causal")),
    *((v, (1024, 2048, 3072, 4096, 6144)) for v in ("varlen_d128", "varlen_d128_causal")),
    ("gqa8_d128_causal", (4096,) * 4), ("mha_d64", (4096,) * 4), ("mha_d256", (4096,) * 4),
    ("bhsd_d128_causal", (4096,) * 4),
]
ROUNDS = 3
GRAPH_CALLS = 5


def _kernel(variant: str, cfg: dict):
    from tiled.ops import prefill

    H, KVH, D, layout, causal, varlen = VARIANTS[variant]
    return prefill.prefill_kernel(H, KVH, D, DTYPE, layout, causal, 0, 0.0, D ** -0.5, varlen,
                                  False, **cfg)


def build(out: Path) -> None:
    from tiled.errors import CompileError
    from tiled.ops import prefill

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for variant in VARIANTS:
        for i, cfg in enumerate(prefill.CUDA_SPACE):
            name = f"{variant}__c{i}"
            try:
                c, seconds = compile_into(out, name, _kernel(variant, cfg), TARGET)
            except CompileError as e:  # (d = 256's larger tiles outgrow shared memory)
                print(name, "does not compile:", e, flush=True)
                continue
            index[name] = {"variant": variant, "config": cfg, "cold_compile_s": round(seconds, 3),
                           "ws_path": "WsAttn<" in c.source}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/attention.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _problem(torch, variant: str, lens: tuple):
    """(q, k, v, cu_seqlens or None) in the variant's layout; varlen packs `lens`."""
    H, KVH, D, layout, _, varlen = VARIANTS[variant]
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)

    if varlen:
        total = sum(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                          dtype=torch.int32)
        return rand(total, H, D), rand(total, KVH, D), rand(total, KVH, D), cu
    B, S = len(lens), lens[0]
    if layout == "bshd":
        return rand(B, S, H, D), rand(B, S, KVH, D), rand(B, S, KVH, D), None
    return rand(B, H, S, D), rand(B, KVH, S, D), rand(B, KVH, S, D), None


def _bhsd(variant, t):
    return t.transpose(1, 2) if VARIANTS[variant][3] == "bshd" else t


def _sdpa(torch, variant, q, k, v, backend):
    """SDPA on the dense tensors (as BHSD views), through one backend."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    H, KVH, _, _, causal, _ = VARIANTS[variant]
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(_bhsd(variant, q), _bhsd(variant, k),
                                              _bhsd(variant, v), is_causal=causal,
                                              enable_gqa=H != KVH)


def _pairs(lens, causal) -> int:
    return sum(s * (s + 1) // 2 if causal else s * s for s in lens)


def _row(torch, variant: str, lens: tuple, dense_us: dict) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    import tiled.ops as ops
    from tiled.ops import prefill

    H, KVH, D, layout, causal, varlen = VARIANTS[variant]
    q, k, v, cu = _problem(torch, variant, lens)
    kw = {"causal": causal, "layout": layout}
    if varlen:
        kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                  max_seqlen_k=max(lens))
    out = ops.attention(q, k, v, **kw)  # tunes this bucket
    S_bucket = max(lens)
    tuned = prefill.ATTENTION.chosen[(TARGET, prefill._bucket(
        H, KVH, D, DTYPE, layout, causal, 0, 0.0, D ** -0.5, varlen, False, S_bucket))]
    errs = []  # against float SDPA, per sequence
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    for b, s in enumerate(lens):
        if varlen:
            qs, ks, vs, o = (t[starts[b]:starts[b] + s].transpose(0, 1)[None]
                             for t in (q, k, v, out))
        else:
            qs, ks, vs, o = (_bhsd(variant, t)[b:b + 1] for t in (q, k, v, out))
        ref = F.scaled_dot_product_attention(qs.float(), ks.float(), vs.float(),
                                             is_causal=causal, enable_gqa=H != KVH)
        errs.append(((o.float() - ref).norm() / ref.norm()).item())
    calls = {"tiled": lambda: ops.attention(q, k, v, **kw)}
    if not varlen:
        calls["sdpa_cudnn"] = lambda: _sdpa(torch, variant, q, k, v, SDPBackend.CUDNN_ATTENTION)
        calls["sdpa_flash"] = lambda: _sdpa(torch, variant, q, k, v, SDPBackend.FLASH_ATTENTION)
    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS)
    tflops = 4 * H * D * _pairs(lens, causal) / (us["tiled"] * 1e-6) / 1e12
    row = {"variant": variant, "heads": H, "kv_heads": KVH, "d": D, "layout": layout,
           "causal": causal, "varlen": varlen, "lens": list(lens), "config": tuned.config,
           "us": us, "TFLOP/s": tflops, "max_rel_err_vs_float_sdpa": max(errs)}
    text = ""
    if not varlen:
        best = min(us["sdpa_cudnn"], us["sdpa_flash"])
        row["vs_fastest_sdpa"] = best / us["tiled"]
        row["vs_sdpa_cudnn"] = us["sdpa_cudnn"] / us["tiled"]
        text = f", {row['vs_fastest_sdpa']:.2f}x fastest SDPA ({row['vs_sdpa_cudnn']:.2f}x cuDNN)"
        dense_us[(causal, lens)] = us["tiled"]
    elif (causal, lens) in dense_us:  # the dense kernel on the same sequences, timed before
        row["dense_us"] = dense_us[(causal, lens)]
        row["vs_dense"] = dense_us[(causal, lens)] / us["tiled"]
        text = f", {row['vs_dense']:.2f}x the dense kernel"
    print(f"{variant:20s} lens {lens}: {us['tiled']:8.1f} us, {tflops:4.0f} TFLOP/s{text}, "
          f"config {tuned.config}, err {max(errs):.1e}", flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    from tiled import tuning

    hung = smoke_in_child(__file__, bundle, 300, stall_s=30)
    index = json.loads((bundle / "index.json").read_text())
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
             for n in index["kernels"] if n not in hung]
    rows, dense_us = [], {}
    with tuning.prebuilt(pairs):
        for variant, lens in ROWS:
            rows.append(_row(torch, variant, lens, dense_us))
            torch.cuda.empty_cache()
            write_results(out, "attention.py", bundle, index, rounds=ROUNDS,
                          graph_calls=GRAPH_CALLS, hung=hung, rows=rows,
                          tuning_stats=dict(tuning.STATS), tunings=tuning_records())


def smoke(bundle: Path) -> None:
    """Each kernel once on 2 sequences (varlen: 700 and 300 rows; dense: 2 x 520), against
    float SDPA."""
    import torch
    import torch.nn.functional as F

    index = json.loads((bundle / "index.json").read_text())
    for name in smoke_order(list(index["kernels"])):
        variant = index["kernels"][name]["variant"]
        H, KVH, _, _, causal, varlen = VARIANTS[variant]
        lens = (700, 300) if varlen else (520, 520)
        q, k, v, cu = _problem(torch, variant, lens)
        out = torch.full_like(q, float("nan"))
        unused = torch.empty(1, device="cuda", dtype=torch.int32)
        grid = torch.empty(max(lens), device="cuda", dtype=torch.int8) if varlen else unused
        load_kernel(bundle, name)(q, k, v, cu if varlen else unused, cu if varlen else unused,
                                  out, unused, grid)
        torch.cuda.synchronize()
        errs = []
        for b, s in enumerate(lens):
            if varlen:
                a = sum(lens[:b])
                qs, ks, vs, o = (t[a:a + s].transpose(0, 1)[None] for t in (q, k, v, out))
            else:
                qs, ks, vs, o = (_bhsd(variant, t)[b:b + 1] for t in (q, k, v, out))
            ref = F.scaled_dot_product_attention(qs.float(), ks.float(), vs.float(),
                                                 is_causal=causal, enable_gqa=H != KVH)
            errs.append(((o.float() - ref).norm() / ref.norm()).item())
        print(f"smoke {name}: max rel err {max(errs):.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "attention"))
