"""Issue 12: may the per-op sm_90a path take the 16-row swaps of tiled.ops.linear (x tiles of
16 tokens: wgmma n16) from the whole-kernel GEMM path (targets/cuda/sm90_gemm.py)? Every
16-row swap of tiled.ops.linear's CUDA space that takes wgmma (128 and 256 threads), at
y = x W^T bf16, W 4096x4096 / 14336x4096 / 4096x14336, M = 1 and 16, built twice: by a
commit whose whole-kernel path takes them (label `whole`) and by one whose per-op path does
(label `per_op`), then timed in one process beside F.linear: graph-replayed, rounds
interleaved (bundle_cli.time_graphed). A split kernel is timed alone (its float32 partials;
the sum after is the same for both paths), so its ratio to F.linear is not the op's.

Here (the CPU machine, with TVM), once per commit:
    SIXTEEN_LABEL=whole python benchmarks/gpu/sixteen_paths.py build --out .gpu/sixteen
    SIXTEEN_LABEL=per_op python benchmarks/gpu/sixteen_paths.py build --out .gpu/sixteen
There (device tool, carry=[".gpu/sixteen"]):
    python3 benchmarks/gpu/sixteen_paths.py run --bundle .gpu/sixteen \
        --out $OUT/sixteen_paths_h200.json
"""

import json
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
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K)
MS = (1, 16)
ROUNDS = 3
GRAPH_CALLS = 20


def configs() -> list[dict]:
    from tiled.ops.gemm import CUDA_SPACE

    return [c for c in CUDA_SPACE if c["kind"] == "swap" and c["BM"] == 16
            and c["threads"] >= 128]


def build(out: Path) -> None:
    from tiled.ops.gemm import linear_kernel

    label, where, commit = labelled_dir(out, "SIXTEEN_LABEL", "per_op")
    index = {}
    for N, K in WEIGHTS:
        for M in MS:
            for i, cfg in enumerate(configs()):
                name = f"m{M}_n{N}_k{K}__c{i}"
                kernel = linear_kernel(M, N, K, "bfloat16", "bfloat16", **cfg)
                _, seconds = compile_into(where, name, kernel, TARGET)
                index[name] = {"M": M, "N": N, "K": K, "config": cfg,
                               "cold_compile_s": round(seconds, 3)}
                print(label, name, index[name], flush=True)
    (where / "index.json").write_text(json.dumps({
        "command": f"SIXTEEN_LABEL={label} python benchmarks/gpu/sixteen_paths.py build "
                   f"--out {out}", "commit": commit, "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _size(torch, bundle: Path, labels: dict, M: int, N: int, K: int) -> list[dict]:
    """Rows of one size: each label's kernels and F.linear, timed together."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
    ref = torch.nn.functional.linear(x, w).float()
    calls = {"F.linear": lambda: torch.nn.functional.linear(x, w)}
    meta, errors = {}, {}
    for label, index in labels.items():
        for name, v in index["kernels"].items():
            if (v["M"], v["N"], v["K"]) != (M, N, K):
                continue
            kernel = load_kernel(bundle / label, name)
            s = v["config"].get("splits", 1)
            y = torch.empty((M, N) if s == 1 else (s, M, N), device="cuda",
                            dtype=torch.bfloat16 if s == 1 else torch.float32)
            kernel(x, w, y)
            torch.cuda.synchronize()
            got = y.float() if s == 1 else y.sum(0)
            key = f"{label}:{name}"
            errors[key] = float((got - ref).norm() / ref.norm())
            calls[key] = (lambda k, dst: lambda: k(x, w, dst))(kernel, y)
            meta[key] = {"path": label, "config": v["config"]}
    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS)
    rows = []
    for key, t in us.items():
        row = {"M": M, "N": N, "K": K, "kernel": key, "us": round(t, 2),
               "vs_F.linear": round(us["F.linear"] / t, 3), "rel_err": errors.get(key),
               **meta.get(key, {})}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch

    labels = labelled_indexes(bundle)
    rows = []
    for N, K in WEIGHTS:
        for M in MS:
            rows += _size(torch, bundle, labels, M, N, K)
    write_results(out, "sixteen_paths.py", bundle,
                  {k: {"command": v["command"], "commit": v["commit"]}
                   for k, v in labels.items()},
                  rounds=ROUNDS, graph_calls=GRAPH_CALLS, rows=rows)


def smoke(bundle: Path) -> None:
    print(sorted(p.name for p in bundle.iterdir()), flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "sixteen"))
