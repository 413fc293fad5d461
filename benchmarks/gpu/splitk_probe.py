"""Where split-K's time goes for y = x W^T, W 4096 x 4096 (issue 12): graph-timed (3 rounds
of 20 calls), the GEMM kernel alone into preallocated float32 partials, the splitk_sum kernel
alone, both (as tiled.ops.linear runs them), and F.linear, at M = 16, 64, 128.

Here: AUTOTUNE_LINEAR_SHAPES=8b_q_o,8b_gate_up,8b_down AUTOTUNE_LINEAR_MS=1,16,64,128,1024,4096
    python benchmarks/gpu/autotune_linear.py build --out .gpu/linear12
There (carry .gpu/linear12): python3 benchmarks/gpu/splitk_probe.py
(results/splitk_probe_h200.json was made by this probe run from .gpu/, before it was committed
here in this form.)
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BUNDLE = Path(".gpu/linear12")
N = K = 4096
# (kind, BM, BN, threads, splits, stages) of the configs probed
PROBED = [("swap", 64, 64, 128, 2, None), ("swap", 64, 64, 128, 4, None),
          ("swap", 64, 64, 128, 2, 8), ("swap", 128, 64, 128, 4, None),
          ("swap", 16, 64, 128, 2, 8), ("swap", 64, 64, 128, 1, None),
          ("swap", 64, 64, 128, 1, 8)]


def probe(torch, ops, kernel, config: dict, M: int, w) -> dict:
    """Graph-timed microseconds of one config's pieces at M tokens."""
    from bundle_cli import time_graphed

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    s = config.get("splits", 1)
    parts = torch.empty(s, M, N, device="cuda", dtype=torch.float32) if s > 1 else y
    calls = {"F.linear": lambda: torch.nn.functional.linear(x, w),
             "gemm_only": lambda: kernel(x, w, parts)}
    if s > 1:
        total = ops._kernel("splitk_sum", y, N=N, splits=s, dtype="bfloat16")
        calls["sum_only"] = lambda: total(parts, y)
        calls["gemm_then_sum"] = lambda: (kernel(x, w, parts), total(parts, y))
    return time_graphed(torch, calls, 3, 20)


def main() -> None:
    import torch
    from bundle_cli import load_kernel

    import tiled.ops as ops

    index = json.loads((BUNDLE / "index.json").read_text())["kernels"]
    for name, v in index.items():
        if v.get("op") == "splitk_sum":
            ops.install("splitk_sum", "cuda:sm_90a", load_kernel(BUNDLE, name), **v["params"])
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64
    rows = []
    for M in (16, 64, 128):
        for name, v in index.items():
            c = v.get("config")
            if v.get("N") != N or v.get("K") != K or c is None:
                continue
            key = (c["kind"], c["BM"], c["BN"], c["threads"], c.get("splits", 1),
                   c.get("stages"))
            if key not in PROBED or c["BM"] < M:
                continue
            row = {"M": M, "config": c,
                   "us": probe(torch, ops, load_kernel(BUNDLE, name), c, M, w)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(os.environ["OUT"], "splitk_probe_h200.json").write_text(json.dumps({
        "command": "python3 benchmarks/gpu/splitk_probe.py (bundle .gpu/linear12)",
        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
