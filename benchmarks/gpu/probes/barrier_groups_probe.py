"""Probe (issue 12): GEMM kernels of the per-op sm_90a path built at two commits (labels:
subfolders of the bundle) and timed together with the torch op, 7 rounds in rotated order
(do_bench medians): the seed's GEMM, examples/gemm.py at 128x256x64, tiled.ops.linear tiles at
issue 12's sizes and tiled.ops.fp8's per-tensor kernel.

It measured one ring barrier pair per group of adjacent ring copies freed together (a GEMM's
A and B: one wait and one release per stage instead of two), the change in
benchmarks/results/bars_probe_barrier_groups.diff, against the commit before it
(barrier_groups_probe_h200.json: `a_before` at 632eb93, `b_after` with the diff): every
kernel within -3.0..+3.8%, no consistent gain, so it was not kept.

Here, once per commit (PROBE_ROOT: that commit's checkout):
    LABEL=a_before PROBE_ROOT=/tmp/head python benchmarks/gpu/probes/barrier_groups_probe.py \
        build .gpu/bars
    LABEL=b_after python benchmarks/gpu/probes/barrier_groups_probe.py build .gpu/bars
There: python3 benchmarks/gpu/probes/barrier_groups_probe.py run .gpu/bars $OUT/bars.json
(the committed results were made by this script run from .gpu/, before it was committed here)
"""

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(os.environ.get("PROBE_ROOT", Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
LINEAR = [(4096, 4096, 4096, 128, 256, 256), (1024, 14336, 4096, 128, 128, 256),
          (1024, 14336, 4096, 128, 256, 256), (128, 14336, 4096, 64, 128, 128),
          (1024, 4096, 14336, 128, 256, 256)]  # (M, N, K, BM, BN, threads)


def kernels() -> dict:
    """name -> (kind, (M, N, K, dtype), kernel)."""
    import gemm

    from tiled.ops import fp8
    from tiled.ops.gemm import linear_kernel

    out = {}
    for dt in ("float16", "bfloat16"):
        shape = (4096, 4096, 4096, dt)
        out[f"seed_{dt}"] = ("mm", shape, gemm.matmul(*shape[:3], 128, 128, 32, 3, dt,
                                                      threads=128))
        out[f"ex64_{dt}"] = ("mm", shape, gemm.matmul(*shape[:3], 128, 256, 64, 4, dt,
                                                      threads=256))
    for M, N, K, bm, bn, threads in LINEAR:
        out[f"lin_{M}_{N}_{K}_{bm}x{bn}"] = ("lin", (M, N, K, "bfloat16"), linear_kernel(
            M, N, K, "bfloat16", "bfloat16", kind="tile", BM=bm, BN=bn, threads=threads))
    out["fp8_4096_c1"] = ("fp8", (4096, 4096, 4096, "float8_e4m3"), fp8.scaled_gemm_kernel(
        4096, 4096, 4096, "bfloat16", False, BM=128, BN=256, threads=256, stages=3))
    return out


def build(out: Path) -> None:
    from bundle_cli import compile_into, labelled_dir

    label, where, commit = labelled_dir(out, "LABEL", os.environ["LABEL"])  # LABEL required
    index = {}
    for name, (kind, shape, kernel) in kernels().items():
        compile_into(where, name, kernel, "cuda:sm_90a")
        index[name] = {"kind": kind, "shape": shape}
        print(label, name, flush=True)
    (where / "index.json").write_text(json.dumps({"commit": commit, "kernels": index},
                                                 indent=1))


def _operands(torch, kind: str, shape):
    """(the kernel's arguments given its output, torch's call, the output dtype)."""
    M, N, K, dt = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "fp8":
        one = torch.ones((), device="cuda")
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        b = (torch.randn(N, K, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
        sa = torch.full((1,), 0.5, device="cuda")
        sb = torch.full((1,), 0.25, device="cuda")
        return (lambda y: (a, b, sa, sb, y),
                lambda: torch._scaled_mm(a, b.t(), scale_a=sa.reshape(()) * one,
                                         scale_b=sb.reshape(()) * one,
                                         out_dtype=torch.bfloat16), torch.bfloat16)
    t = getattr(torch, dt)
    a = torch.randn(M, K, device="cuda", generator=g, dtype=t)
    if kind == "mm":
        b = torch.randn(K, N, device="cuda", generator=g, dtype=t)
        return lambda y: (a, b, y), lambda: torch.matmul(a, b), t
    w = torch.randn(N, K, device="cuda", generator=g, dtype=t) / 64
    return lambda y: (a, w, y), lambda: torch.nn.functional.linear(a, w), t


def _row(torch, do_bench, load_kernel, bundle: Path, labels: dict, name: str) -> dict:
    meta = next(iter(labels.values()))["kernels"][name]
    args, ref_fn, y_dt = _operands(torch, meta["kind"], meta["shape"])
    M, N = meta["shape"][:2]
    ref = ref_fn().float()
    calls, errs = {"torch": ref_fn}, {}
    for label in labels:
        kernel = load_kernel(bundle / label, name)
        y = torch.empty(M, N, device="cuda", dtype=y_dt)
        kernel(*args(y))
        torch.cuda.synchronize()
        errs[label] = float((y.float() - ref).norm() / ref.norm())
        calls[label] = (lambda fn, dst: lambda: fn(*args(dst)))(kernel, y)
    samples = {c: [] for c in calls}
    order = list(calls)
    for r in range(7):
        for c in order[r % len(order):] + order[:r % len(order)]:
            samples[c].append(do_bench(calls[c], warmup=25, rep=60))
    ms = {c: statistics.median(v) for c, v in samples.items()}
    return {"kernel": name, "shape": meta["shape"], "ms": ms,
            "vs_torch": {c: ms["torch"] / ms[c] for c in ms}, "errs": errs}


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import labelled_indexes, load_kernel, write_labelled_rows
    from triton.testing import do_bench

    labels = labelled_indexes(bundle)
    rows = []
    for name in next(iter(labels.values()))["kernels"]:
        rows.append(_row(torch, do_bench, load_kernel, bundle, labels, name))
        print(name, {c: round(v, 3) for c, v in rows[-1]["vs_torch"].items()}, flush=True)
    write_labelled_rows(out, labels, rows)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
