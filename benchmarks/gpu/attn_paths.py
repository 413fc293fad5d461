"""Issue 12: may the per-op sm_90a path take the repo's own attention example
(examples/flash_attention.py, P handed to the second gemm through shared memory) from the
whole-kernel attention path (targets/cuda/sm90_attn.py)? The example at its fast config
(128 x 128 tiles, 256 threads, 2 stages), d 128, S 4096 (batch 4) and 16384 (batch 1), 32
heads, bf16 and fp16, causal and not, built twice: as compiled by default (label `whole`:
the whole-kernel attention path takes it) and with whole_kernel_paths=False (label `per_op`:
the per-op lowering, P moved back into registers by passes/staging.unstage_register_operands),
then checked against SDPA (cuDNN) and timed in one process beside SDPA's flash and cuDNN
backends, interleaved over ROUNDS rounds (medians of do_bench).

benchmarks/results/attn_paths_h200.json: `whole` built at 5b4f6d9, `per_op` at the commit
that added unstage_register_operands, where it applied by default (the cubins this script's
`per_op` build made then are the same bytes), both of the example as it was then, its
scores scaled by a pass of their own. attn_paths_h200_folded.json: both labels built at the
commit that folded the example's scale into exp2, beside that earlier `whole` build
(`whole_unfolded`, copied into the bundle). attn_paths_h200_heads.json: `per_op` and
`per_op_walk` (the per-op path with min(blocks, SMs) blocks walking the grid: the compile
option persistent=2) built where Q became a head copy the producer loads, beside
`per_op_head` (the per-op path at the commit before: this script run from a worktree of
it, `ATTN_LABEL=per_op_head`) and `whole`.

Here (the CPU machine, with TVM):
    ATTN_LABEL=whole python benchmarks/gpu/attn_paths.py build --out .gpu/attn_paths
    ATTN_LABEL=per_op python benchmarks/gpu/attn_paths.py build --out .gpu/attn_paths
There (device tool, carry=[".gpu/attn_paths"]):
    python3 benchmarks/gpu/attn_paths.py run --bundle .gpu/attn_paths \
        --out $OUT/attn_paths_h200.json
"""

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    compile_into,
    labelled_dir,
    labelled_indexes,
    load_kernel,
    machine,
    main,
    write_results,
)

TARGET = "cuda:sm_90a"
HEADS, DIM = 32, 128
CONFIGS = [(dtype, seq, batch, causal) for dtype in ("bfloat16", "float16")
           for seq, batch in ((4096, 4), (16384, 1)) for causal in (False, True)]
ROUNDS = 3


def _name(dtype, seq, causal) -> str:
    return f"{dtype}_s{seq}{'_causal' if causal else ''}"


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import flash_attention as fa

    label, where, commit = labelled_dir(out, "ATTN_LABEL", "per_op")
    index = {}
    for dtype, seq, batch, causal in CONFIGS:
        kernel = fa.flash_attention(batch, HEADS, HEADS, seq, seq, DIM, causal, dtype,
                                    block_M=128, block_N=128, threads=256, num_stages=2)
        name = _name(dtype, seq, causal)
        options = {}
        if label.startswith("per_op"):  # *walk*: blocks walking the grid; *pp*: pingpong
            options = {"whole_kernel_paths": False, **({"persistent": 2} if "walk" in label
                                                       else {}),
                       **({"pingpong": True} if "pp" in label else {})}
        compiled, seconds = compile_into(where, name, kernel, TARGET, **options)
        index[name] = {"dtype": dtype, "seq": seq, "batch": batch, "causal": causal,
                       "whole_kernel_path": "WsAttn<" in compiled.source,
                       "cold_compile_s": round(seconds, 3)}
        print(label, name, index[name], flush=True)
    (where / "index.json").write_text(json.dumps({
        "command": f"ATTN_LABEL={label} python benchmarks/gpu/attn_paths.py build --out {out}",
        "commit": commit, "machine": machine(), "target": TARGET, "kernels": index},
        indent=1))


def _config(torch, bundle: Path, labels: dict, dtype, seq, batch, causal) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(batch, HEADS, seq, DIM, device="cuda", generator=g, dtype=dt)
               for _ in "qkv")
    o = torch.empty_like(q)
    calls = {}
    for label in labels:
        kern = load_kernel(bundle / label, _name(dtype, seq, causal))
        calls[label] = (lambda fn: lambda: fn(q, k, v, o))(kern)
    for bname, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                           ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        calls[bname] = (lambda which: lambda: _with(sdpa_kernel(which), sdpa, q, k, v,
                                                    causal))(backend)
    ref = calls["sdpa_cudnn"]().float()
    err = {}
    for label in labels:
        o.fill_(float("nan"))
        calls[label]()
        torch.cuda.synchronize()
        err[label] = ((o.float() - ref).norm() / ref.norm()).item()
    samples = {c: [] for c in calls}
    for _ in range(ROUNDS):
        for c, fn in calls.items():
            samples[c].append(do_bench(fn))
    ms = {c: statistics.median(x) for c, x in samples.items()}
    flop = 4 * batch * HEADS * seq * seq * DIM // (2 if causal else 1)
    tflops = {c: flop / t / 1e9 for c, t in ms.items()}
    best = max(("sdpa_flash", "sdpa_cudnn"), key=tflops.get)
    row = {"dtype": dtype, "seq": seq, "batch": batch, "causal": causal, "rel_err": err,
           "ms": ms, "tflops": tflops, "reference": best,
           "ratio": {label: tflops[label] / tflops[best] for label in labels}}
    print(json.dumps(row), flush=True)
    return row


def _with(ctx, fn, q, k, v, causal):
    with ctx:
        return fn(q, k, v, is_causal=causal)


def run(bundle: Path, out: Path) -> None:
    import torch

    labels = labelled_indexes(bundle)
    rows = [_config(torch, bundle, labels, *c) for c in CONFIGS]
    write_results(out, "attn_paths.py", bundle,
                  {k: {"command": v["command"], "commit": v["commit"],
                       "kernels": v["kernels"]} for k, v in labels.items()},
                  rounds=ROUNDS, rows=rows)


def smoke(bundle: Path) -> None:
    print(sorted(p.name for p in bundle.iterdir()), flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "attn_paths"))
