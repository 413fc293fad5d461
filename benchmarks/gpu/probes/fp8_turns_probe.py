"""Probe (issue 13's block-scaled fp8 GEMM): tiled.ops.fp8's block-scaled kernel built under
labels (subfolders of the bundle, each at its own checkout and compile options) and timed
with torch._scaled_mm per-tensor at the same shape, 7 rounds in rotated order (do_bench
medians).

Each K step the kernel builds a fresh partial product (clear_accum) that the step rescales
into its running sum. The labels measure two changes to that loop:
- zero-init: the partial product starts from the first wgmma's zero scale-d rather than 64
  register stores a thread (`a_before` at the commit before, `b_zero` after);
- turns: the two consumer warpgroups take turns issuing their wgmmas (`c_turns`, compile
  option pingpong=True), so that one's rescale meets the other's MMA instead of both
  rescaling while the tensor cores idle;
- blocks that do not walk the grid (`d_blocks`, persistent=1): the one-warpgroup config
  (c2) then keeps two blocks on an SM, whose rescales and MMAs can meet the same way.

Here, once per label (PROBE_ROOT: that commit's checkout; PINGPONG=1 for the turns):
    LABEL=a_before PROBE_ROOT=/tmp/oldtree python benchmarks/gpu/probes/fp8_turns_probe.py \
        build .gpu/fp8turns
    LABEL=b_zero python benchmarks/gpu/probes/fp8_turns_probe.py build .gpu/fp8turns
    LABEL=c_turns PINGPONG=1 python benchmarks/gpu/probes/fp8_turns_probe.py build .gpu/fp8turns
    LABEL=d_blocks PERSISTENT=1 python benchmarks/gpu/probes/fp8_turns_probe.py build .gpu/fp8turns
There: python3 benchmarks/gpu/probes/fp8_turns_probe.py run .gpu/fp8turns $OUT/fp8turns.json
"""

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(os.environ.get("PROBE_ROOT", Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
NK = [(7168, 2048), (7168, 18432)]
CONFIGS = {"c0": dict(BM=128, BN=128, threads=256, stages=4),
           "c1": dict(BM=128, BN=256, threads=256, stages=3),
           "c2": dict(BM=64, BN=128, threads=128, stages=4)}
MS = (512, 2048, 4096)


def build(out: Path) -> None:
    from bundle_cli import compile_into, labelled_dir

    from tiled.ops import fp8

    label, where, commit = labelled_dir(out, "LABEL", os.environ["LABEL"])  # LABEL required
    options = {"pingpong": True} if os.environ.get("PINGPONG") == "1" else {}
    if os.environ.get("PERSISTENT"):
        options["persistent"] = int(os.environ["PERSISTENT"])
    index = {}
    for N, K in NK:
        for c, cfg in CONFIGS.items():
            name = f"bs_{N}x{K}_{c}"
            kernel = fp8.scaled_gemm_kernel(128, N, K, "bfloat16", True, **cfg)
            compile_into(where, name, kernel, "cuda:sm_90a", **options)
            index[name] = {"N": N, "K": K, "config": cfg}
            print(label, name, flush=True)
    (where / "index.json").write_text(json.dumps(
        {"commit": commit, "options": options, "kernels": index}, indent=1))


def _operands(torch, M, N, K):
    """Block-scaled e4m3 operands, their dequantized product, and per-tensor ones for
    torch._scaled_mm at the same shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sa = torch.rand(M, K // 128, device="cuda", generator=g) / K ** 0.5 + 1e-3
    sb = torch.rand(-(-N // 128), K // 128, device="cuda", generator=g) + 0.5
    ad = (a.float().view(M, -1, 128) * sa[..., None]).view(M, K)
    bd = (b.float().view(-1, 128, K // 128, 128) * sb[:, None, :, None]).view(N, K)
    one = torch.ones((), device="cuda")
    s = torch.full((1,), K ** -0.5, device="cuda")

    def scaled_mm():
        return torch._scaled_mm(a, b.t(), scale_a=s.reshape(()) * one,
                                scale_b=one, out_dtype=torch.bfloat16)
    return (a, b, sa, sb), ad @ bd.T, scaled_mm


def _row(torch, do_bench, load_kernel, bundle: Path, labels: dict, name: str, M: int) -> dict:
    meta = next(iter(labels.values()))["kernels"][name]
    N, K = meta["N"], meta["K"]
    args, ref, scaled_mm = _operands(torch, M, N, K)
    calls, errs = {"torch._scaled_mm per-tensor": scaled_mm}, {}
    for label in labels:
        kernel = load_kernel(bundle / label, name)
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        kernel(*args, y)
        torch.cuda.synchronize()
        errs[label] = float((y.float() - ref).norm() / ref.norm())
        calls[label] = (lambda fn, dst: lambda: fn(*args, dst))(kernel, y)
    samples = {c: [] for c in calls}
    order = list(calls)
    for r in range(7):
        for c in order[r % len(order):] + order[:r % len(order)]:
            samples[c].append(do_bench(calls[c], warmup=25, rep=60))
    ms = {c: statistics.median(v) for c, v in samples.items()}
    base = ms["torch._scaled_mm per-tensor"]
    return {"kernel": name, "M": M, "N": N, "K": K, "config": meta["config"], "ms": ms,
            "tflops": {c: round(2 * M * N * K / (v * 1e-3) / 1e12, 1) for c, v in ms.items()},
            "vs_scaled_mm_per_tensor": {c: round(base / v, 3) for c, v in ms.items()},
            "rel_err_vs_dequantized": errs}


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import labelled_indexes, load_kernel, write_labelled_rows
    from triton.testing import do_bench

    labels = labelled_indexes(bundle)
    rows = []
    for name in next(iter(labels.values()))["kernels"]:
        for M in MS:
            rows.append(_row(torch, do_bench, load_kernel, bundle, labels, name, M))
            print(name, M, rows[-1]["vs_scaled_mm_per_tensor"], rows[-1]["rel_err_vs_dequantized"],
                  flush=True)
            torch.cuda.empty_cache()
    write_labelled_rows(out, labels, rows)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
