"""The seed's example GEMM at its own config (examples/gemm.py: 128x128x32 tiles, 3 stages, 128
threads) on the H200, fp16 and bf16 at 4096^3, beside cuBLAS (torch.matmul) in the same process
(issue 12's target: >= 0.9x cuBLAS).

The kernel takes the per-op TMA + wgmma path (K tiles merged in pairs into 64-wide ring
stages, at least 4 of them: ws_plan.MIN_RING; ws_pairs.py). Measured on the whole-kernel GEMM
path (sm90_gemm.py, the default before 10fc5c4) while choosing that depth (one run, fp16,
interleaved): 3 ring stages 0.76x cuBLAS, 4 stages 0.91x, 6 stages 0.88x; two consumer
warpgroups of 64 rows instead of one of 128 changed nothing (0.92x vs 0.91x at 4).

Here (the CPU machine, with TVM):
    python benchmarks/gpu/seed_gemm.py build --out .gpu/seed_gemm
There (device tool, carry=[".gpu"]; thin runtime only):
    python3 benchmarks/gpu/seed_gemm.py run --bundle .gpu/seed_gemm --out $OUT/seed_gemm_h200.json

`run` checks each kernel against torch.matmul, then times every kernel and cuBLAS interleaved
over ROUNDS rounds (do_bench, medians), since the H200's clock falls as it heats.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from bundle_cli import (
    compile_into,
    load_kernel,
    machine,
    main,
    rotated_medians,
    smoke_in_child,
    smoke_order,
    write_results,
)

TARGET = "cuda:sm_90a"
ROUNDS = 5
SIZE = 4096
DTYPES = ("float16", "bfloat16")


def kernel(dtype: str):
    import gemm

    return gemm.matmul(SIZE, SIZE, SIZE, 128, 128, 32, 3, dtype, threads=128)


# name suffix -> compile options. As compiled by default: the per-op path since 10fc5c4 (two
# 32-wide K tiles per ring stage, ws_pairs.py). benchmarks/results/seed_gemm_h200.json was
# measured at the commit before, where the default ("tiled" rows) was the whole-kernel GEMM
# path and `_per_op` ({"whole_kernel_paths": False}) the per-op one; now both build the same.
VARIANTS = {"": {}}


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dt in DTYPES:
        for suffix, options in VARIANTS.items():
            name = dt + suffix
            compiled, seconds = compile_into(out, name, kernel(dt), TARGET, **options)
            index[name] = {"dtype": dt, "options": options,
                           "threads": compiled.manifest.block[0],
                           "dynamic_smem_bytes": compiled.manifest.dynamic_smem_bytes,
                           "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/seed_gemm.py build --out {out}",
        "machine": machine(), "target": TARGET, "kernels": index}, indent=1))


def _operands(torch, dt):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    b = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    return a, b, torch.empty(SIZE, SIZE, device="cuda", dtype=dt)


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name in smoke_order(index["kernels"]):
        entry = index["kernels"][name]
        a, b, c = _operands(torch, getattr(torch, entry["dtype"]))
        load_kernel(bundle, name)(a, b, c)
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    hung = smoke_in_child(__file__, bundle, 300, stall_s=20)
    index = json.loads((bundle / "index.json").read_text())
    flop = 2 * SIZE ** 3
    rows = []
    for dt_name in DTYPES:
        dt = getattr(torch, dt_name)
        a, b, c = _operands(torch, dt)
        ref = torch.matmul(a, b)
        calls, errs = {"cublas": lambda a=a, b=b: torch.matmul(a, b)}, {}
        for suffix in VARIANTS:
            if dt_name + suffix not in index["kernels"] or dt_name + suffix in hung:
                continue
            k = load_kernel(bundle, dt_name + suffix)
            c.fill_(float("nan"))
            k(a, b, c)
            torch.cuda.synchronize()
            errs["tiled" + suffix] = float((c.float() - ref.float()).norm() /
                                           ref.float().norm())
            calls["tiled" + suffix] = lambda k=k, a=a, b=b, c=c: k(a, b, c)
        ms = rotated_medians(calls, ROUNDS, do_bench)
        tflops = {n: flop / v / 1e9 for n, v in ms.items()}
        row = {"dtype": dt_name, "M": SIZE, "N": SIZE, "K": SIZE,
               "config": "128x128x32, 3 stages, 128 threads",
               "rel_err_vs_cublas": errs, "tflops": tflops,
               "ratio_to_cublas": {n: tflops[n] / tflops["cublas"] for n in errs}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_results(out, "seed_gemm.py", bundle, index, rows=rows, hung=hung)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "seed_gemm"))
