"""Issues 12 / 14: which MLA decode kernel form is fastest on the H200? DeepSeek-V3's decode
shape (128 heads over one latent kv head, d 576, values 512, block 64, bf16) at batch 64 /
128 x context 4096 / 16384, each form run directly (not through the tuner) on the same
inputs, checked against float SDPA on the gathered cache, and timed together (graph-replayed,
rounds interleaved: bundle_cli.time_graphed), with the in-place 512 MiB stream beside them.

The forms (tiled.ops.mla configs, splits 1, 64 heads a block on 256 threads):
- `mma`: the FullRow form on mma.sync (what mla_h200.json's tuner chose every time);
- `cols`: both gemms FullCol, so the two warpgroups split the columns and take wgmma, K and V
  copied as two tiles by a cp.async pipeline (compile option ring_tables=1);
- `latent32x3` / `latent64`: FullCol with the cache rows copied once per step (value and rope
  lanes), 32-token steps on 3 stages or 64-token steps on 2 (ring_tables=1);
- `*_tma`: the same as built by default since 2026-12-05 (ring_tables=0: a TMA producer
  warpgroup feeds a loop whose gemms all take wgmma; the gemms stay in flight:
  wgmma_waits.py; before, the option ring_tables=True asked for it);
- `tl_example` / `tl_example64`: examples/mla_decode.py (TileLang's deepseek_mla form, block_N
  32 / 64) on the same tokens laid out contiguously per sequence (no block table: its loop
  takes the TMA ring by default), as a reference for what the paged forms lose to the table.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/mla_paths.py build --out .gpu/mla_paths
There (device tool, carry=[".gpu/mla_paths"]):
    python3 benchmarks/gpu/mla_paths.py run --bundle .gpu/mla_paths --out $OUT/mla_paths_h200.json
"""

import itertools
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
CASES = [(64, 4096), (64, 16384), (128, 4096), (128, 16384)]
# The example's forms: block_N 64 fits only with the output tile over the ring's bytes
# (the pool's overlay of tiles whose lifetimes do not meet).
EXAMPLES = {"tl_example": 32, "tl_example64": 64}
BUILD_MB = 1024
ROUNDS = 3
GRAPH_CALLS = 10
RW_FLOATS = 128 << 20
BASE = {"threads": 256, "rows": 64, "splits": 1}
FORMS = {
    "mma": ({"BN": 32, "stages": 2}, {}),
    "cols": ({"BN": 32, "stages": 2, "cols": True}, {"ring_tables": 1}),
    "latent32x3": ({"BN": 32, "stages": 3, "cols": True, "latent": True}, {"ring_tables": 1}),
    "latent64": ({"BN": 64, "stages": 2, "cols": True, "latent": True}, {"ring_tables": 1}),
    "latent32x3_tma": ({"BN": 32, "stages": 3, "cols": True, "latent": True}, {}),
    "latent64_tma": ({"BN": 64, "stages": 2, "cols": True, "latent": True}, {}),
}


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mla_example",
                                                  ROOT / "examples" / "mla_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(out: Path) -> None:
    from tiled.ops import mla

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for (B, ctx), (form, block_n) in itertools.product(CASES, EXAMPLES.items()):
        name = f"{form}_b{B}_s{ctx}"  # the example's sizes are static: one kernel per case
        compiled, seconds = compile_into(out, name, _example().mla_decode(
            B, H, ctx, DV, D - DV, block_N=block_n), TARGET)
        index[name] = {"example": form, "block_N": block_n, "batch": B, "context": ctx,
                       "cold_compile_s": round(seconds, 3),
                       "block": list(compiled.manifest.block)}
        print(name, index[name], flush=True)
    for name, (cfg, options) in FORMS.items():
        config = {**BASE, **cfg}
        compiled, seconds = compile_into(out, name, mla.mla_kernel(
            1, H, D, DV, BLOCK, DTYPE, BUILD_MB, D ** -0.5, **config), TARGET, **options)
        index[name] = {"config": config, "options": options, "cold_compile_s": round(seconds, 3),
                       "block": list(compiled.manifest.block)}
        print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/mla_paths.py build --out {out}",
        "machine": machine(), "target": TARGET, "kernels": index}, indent=1))


def _problem(torch, B, ctx):
    """mla.py's problem (the same inputs for the same case), q as [B, H, D]."""
    from mla import _problem as problem

    q, kv, bt, seq = problem(torch, B, ctx)
    return q.view(B, H, D), kv, bt, seq


def _case(torch, bundle: Path, kernels: dict, B: int, ctx: int) -> list[dict]:
    import torch.nn.functional as F

    q, kv, bt, seq = _problem(torch, B, ctx)
    rows = kv[bt.long()].reshape(B, 1, ctx, D)
    ref = torch.cat([F.scaled_dot_product_attention(
        q[b:b + 1].view(1, 1, H, D).float(), rows[b:b + 1].float(),
        rows[b:b + 1, ..., :DV].float()) for b in range(B)]).view(B, H, DV)
    scales = torch.ones(2, device="cuda", dtype=torch.float32)
    rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
    calls, errors = {"rw_kernel": rw.neg_}, {}
    flat = rows[:, 0]  # the examples' input: the same tokens, contiguous, lanes split
    lanes = [q[..., :DV].contiguous(), q[..., DV:].contiguous(),
             flat[..., :DV].unsqueeze(2).contiguous(), flat[..., DV:].unsqueeze(2).contiguous()]
    examples = [form for form in EXAMPLES if f"{form}_b{B}_s{ctx}" in kernels]
    for form in examples:
        args = [*lanes, torch.empty(B, H, DV, device="cuda", dtype=torch.bfloat16)]
        kernel = load_kernel(bundle, f"{form}_b{B}_s{ctx}")
        kernel(*args)
        torch.cuda.synchronize()
        errors[form] = float((args[-1].float() - ref).norm() / ref.norm())
        calls[form] = (lambda k, a: lambda: k(*a))(kernel, args)
    forms = [n for n in kernels if not kernels[n].get("example")]
    for name in forms:
        kernel = load_kernel(bundle, name)
        out = torch.empty(B, H, DV, device="cuda", dtype=torch.bfloat16)
        args = [q, kv, kv, bt, seq, scales, out]
        kernel(*args)
        torch.cuda.synchronize()
        errors[name] = float((out.float() - ref).norm() / ref.norm())
        calls[name] = (lambda k, a: lambda: k(*a))(kernel, args)
    del ref
    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS)
    stream = 2 * 4 * RW_FLOATS / (us["rw_kernel"] * 1e-6) / 1e9
    out_rows = []
    for name in forms + examples:
        t = us[name]
        meta = kernels.get(name, {})
        row = {"batch": B, "context": ctx, "form": name, "config": meta.get("config"),
               "options": meta.get("options"), "us": round(t, 2),
               "TFLOP/s": round(2 * B * H * ctx * (D + DV) / (t * 1e-6) / 1e12, 1),
               "GB/s": round(B * ctx * D * 2 / (t * 1e-6) / 1e9, 1),
               "stream_GB/s": round(stream, 1), "vs_mma": round(us["mma"] / t, 3),
               "rel_err_vs_sdpa": errors[name]}
        print(json.dumps(row), flush=True)
        out_rows.append(row)
    return out_rows


def run(bundle: Path, out: Path) -> None:
    import torch

    hung = smoke_in_child(__file__, bundle, 120, stall_s=30)
    index = json.loads((bundle / "index.json").read_text())
    kernels = {n: v for n, v in index["kernels"].items() if n not in hung}
    rows = []
    for B, ctx in CASES:
        rows += _case(torch, bundle, kernels, B, ctx)
        torch.cuda.empty_cache()
        write_results(out, "mla_paths.py", bundle, index, rounds=ROUNDS,
                      graph_calls=GRAPH_CALLS, hung=hung, rows=rows)


def smoke(bundle: Path) -> None:
    """Each form once, launched directly (splits 1): mla.py's smoke_errors."""
    import torch
    from mla import smoke_errors

    index = json.loads((bundle / "index.json").read_text())
    forms = [n for n, v in index["kernels"].items() if not v.get("example")]
    for name in smoke_order(forms):
        kernel = load_kernel(bundle, name)

        def launch(q, kv, bt, seq, out, kernel=kernel):
            kernel(q.view(2, H, D), kv, kv, bt, seq, torch.ones(2, device="cuda"), out)
        print(f"smoke {name}: max rel err {max(smoke_errors(launch)):.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "mla_paths"))
