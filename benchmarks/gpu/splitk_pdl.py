"""Issue 12, y = x W^T at 4096 x 4096 with split-K (the 0.82x size at 64 tokens): does
programmatic dependent launch (tiled.lang.pdl) hide the gap between the GEMM kernel and the
splitk_sum kernel that adds up its float32 partials? Each probed split-K config of
tiled.ops.linear's CUDA space is built twice, as tiled.ops runs it (`plain`) and with
T.pdl_trigger after the GEMM's main loop and T.pdl_sync at the top of the sum (`pdl`: the
sum's manifest says "pdl", so the runtime launches it programmatically), then at 16, 64 and
128 tokens both pairs are checked against F.linear and graph-timed beside it (3 rounds of 20
calls, interleaved; bundle_cli.time_graphed).

Here (the CPU machine, with TVM):
    python benchmarks/gpu/splitk_pdl.py build --out .gpu/splitk_pdl
There (device tool, carry=[".gpu/splitk_pdl"]):
    python3 benchmarks/gpu/splitk_pdl.py run --bundle .gpu/splitk_pdl \\
        --out $OUT/splitk_pdl_h200.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import build_command, compile_into, load_kernel, machine, main, write_results

N = K = 4096
DTYPE = "bfloat16"
# (kind, BM, BN, threads, splits, stages): the split-K configs the tuner picked or nearly
# picked at 16 / 64 / 128 tokens (benchmarks/results/linear_h200_issue12.json)
CONFIGS = [("swap", 16, 64, 128, 2, 8), ("swap", 64, 64, 128, 2, 8), ("swap", 64, 64, 128, 4, 4),
           ("swap", 128, 64, 128, 4, 4)]
TOKENS = (16, 64, 128)


def _name(cfg, pdl: bool) -> str:
    kind, bm, bn, t, s, st = cfg
    return f"{kind}_{bm}x{bn}_t{t}_s{s}_st{st}_{'pdl' if pdl else 'plain'}"


def build(out: Path) -> None:
    from tiled.ops import kernels
    from tiled.ops.gemm import linear_kernel

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for cfg in CONFIGS:
        kind, bm, bn, t, s, st = cfg
        for pdl in (False, True):
            k = linear_kernel(bm, N, K, DTYPE, DTYPE, kind=kind, BM=bm, BN=bn, threads=t,
                              splits=s, stages=st, trigger=pdl)
            compiled, sec = compile_into(out, _name(cfg, pdl), k)
            index[_name(cfg, pdl)] = {"config": list(cfg), "pdl": pdl,
                                      "manifest_pdl": compiled.manifest.pdl,
                                      "cold_compile_s": round(sec, 3)}
    for s in sorted({c[4] for c in CONFIGS}):
        for pdl in (False, True):
            name = f"sum_s{s}_{'pdl' if pdl else 'plain'}"
            compiled, sec = compile_into(out, name, kernels.splitk_sum(N, s, DTYPE, pdl=pdl))
            index[name] = {"splits": s, "pdl": pdl, "manifest_pdl": compiled.manifest.pdl,
                           "cold_compile_s": round(sec, 3)}
    (out / "index.json").write_text(json.dumps({
        "command": build_command("splitk_pdl.py", out), "machine": machine(),
        "kernels": index}, indent=1))


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import time_graphed

    built = json.loads((bundle / "index.json").read_text())
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(N, K, device="cuda", generator=g) / 64).to(torch.bfloat16)
    rows = []
    for M in TOKENS:
        x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        ref = torch.nn.functional.linear(x, w).float()
        for cfg in CONFIGS:
            if cfg[1] < M:
                continue
            s = cfg[4]
            parts = torch.empty(s, M, N, device="cuda", dtype=torch.float32)
            calls, err = {"F.linear": lambda x=x: torch.nn.functional.linear(x, w)}, {}
            for label in ("plain", "pdl"):
                gemm = load_kernel(bundle, _name(cfg, label == "pdl"))
                total = load_kernel(bundle, f"sum_s{s}_{label}")
                y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                calls[label] = (lambda gemm=gemm, total=total, x=x, y=y, parts=parts:
                                (gemm(x, w, parts), total(parts, y)))
                y.fill_(float("nan"))
                calls[label]()
                torch.cuda.synchronize()
                err[label] = ((y.float() - ref).norm() / ref.norm()).item()
            us = time_graphed(torch, calls, 3, 20)
            row = {"M": M, "config": list(cfg), "rel_err_vs_F.linear": err, "us": us,
                   "ratio_vs_F.linear": {k: us["F.linear"] / us[k] for k in ("plain", "pdl")}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    write_results(out, "splitk_pdl.py", bundle, built, rows=rows)


def smoke(bundle: Path) -> None:
    print(sorted(p.name for p in bundle.iterdir()), flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "splitk_pdl"))
