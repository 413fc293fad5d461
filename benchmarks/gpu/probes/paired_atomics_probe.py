"""Probe: the conformance split-K and stream-K kernels (gemm_splitk, gemm_streamk, their H200
shapes) from two bundles, timed together with torch.matmul, 7 rounds in rotated order: the
`before` bundle built before T.Parallel atomic adds over a wgmma accumulator took paired
float32 reductions (targets/cuda/parallel.py, tiled::atomic_add_f32x2), the `after` one with
them. Each timed call zeroes C first (split-K and stream-K add into it); `zero_only` is that.

Here: python benchmarks/gpu/conformance.py build --out .gpu/conformance (before) and
    CONFORMANCE_CASES=gemm_streamk,gemm_splitk,gemm python benchmarks/gpu/conformance.py \\
        build --out .gpu/conf_sk2 (after)
There: python3 benchmarks/gpu/probes/paired_atomics_probe.py (from the repo root)
(benchmarks/results/paired_atomics_h200.json was made by this script run from .gpu/.)
"""

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks/gpu")
sys.path.insert(0, ".")
SHAPES = {"gemm_splitk_big": (4096, 4096, 16384), "gemm_streamk_big": (4096, 4096, 4096)}
BUNDLES = {"before": Path(".gpu/conformance"), "after": Path(".gpu/conf_sk2")}


def _probe(torch, do_bench, load_kernel, name: str) -> dict:
    M, N, K = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g)
    ref = a.float() @ b.float()
    calls = {"torch": lambda: torch.matmul(a, b)}
    errs = {}
    for label, bundle in BUNDLES.items():
        kernel = load_kernel(bundle, name)
        c = torch.zeros(M, N, device="cuda")
        kernel(a, b, c)
        torch.cuda.synchronize()
        errs[label] = float((c - ref).norm() / ref.norm())

        def call(fn=kernel, dst=c):
            dst.zero_()
            fn(a, b, dst)
        calls[label] = call
    spare = torch.zeros(M, N, device="cuda")
    calls["zero_only"] = spare.zero_
    samples = {n: [] for n in calls}
    order = list(calls)
    for r in range(7):
        for n in order[r % len(order):] + order[:r % len(order)]:
            samples[n].append(do_bench(calls[n], warmup=25, rep=80))
    ms = {n: statistics.median(v) for n, v in samples.items()}
    return {"ms": ms, "errs": errs, "vs_torch_incl_zero": {n: ms["torch"] / ms[n] for n in ms}}


def main() -> None:
    import torch
    from bundle_cli import load_kernel
    from triton.testing import do_bench

    rows = {name: _probe(torch, do_bench, load_kernel, name) for name in SHAPES}
    for name, row in rows.items():
        print(name, {n: round(v, 4) for n, v in row["ms"].items()}, row["errs"], flush=True)
    Path(os.environ["OUT"], "ab_atomics.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
