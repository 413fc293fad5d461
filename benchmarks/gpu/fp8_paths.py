"""Issue 12: may the whole-kernel GEMM path (targets/cuda/sm90_gemm.py) give float8 GEMMs to
the per-op path? tiled.ops.fp8's per-tensor kernel at every config of its CUDA space, built
twice (the default, which sends this loop to the whole-kernel path, and
`whole_kernel_paths=False`, the per-op path), timed beside torch._scaled_mm at 4096^3 and
8192^3 in one process: graph-replayed, rounds interleaved (bundle_cli.time_graphed).

benchmarks/results/fp8_paths_h200.json was built at b027038; fe186b9 retired the whole-kernel
GEMM path, after which both builds are the per-op kernel and `build` stops saying so.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/fp8_paths.py build --out .gpu/fp8_paths
There (device tool, carry=[".gpu"]):
    python3 benchmarks/gpu/fp8_paths.py run --bundle .gpu/fp8_paths --out $OUT/fp8_paths_h200.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, time_graphed, write_results

TARGET = "cuda:sm_90a"
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]  # (M, N, K)
PATHS = {"whole": {}, "per_op": {"whole_kernel_paths": False}}
ROUNDS = 3
GRAPH_CALLS = 10


def build(out: Path) -> None:
    from tiled.ops import fp8

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for _, N, K in SHAPES:
        for i, cfg in enumerate(fp8.CUDA_SPACE):
            sources = {}
            for path, options in PATHS.items():
                name = f"pt_{N}x{K}__c{i}__{path}"
                kernel = fp8.scaled_gemm_kernel(128, N, K, "bfloat16", False, **cfg)
                compiled, seconds = compile_into(out, name, kernel, TARGET, **options)
                sources[path] = compiled.artifact
                index[name] = {"N": N, "K": K, "config": cfg, "path": path,
                               "options": options, "cold_compile_s": round(seconds, 3)}
                print(name, index[name], flush=True)
            if sources["whole"] == sources["per_op"]:
                raise SystemExit(f"config {cfg}: both paths built the same cubin")
    (out / "index.json").write_text(json.dumps({
        "command": "python benchmarks/gpu/fp8_paths.py build --out " + str(out),
        "machine": machine(), "target": TARGET, "kernels": index}, indent=1))


def _shape(torch, bundle: Path, kernels: dict, M: int, N: int, K: int) -> list[dict]:
    """Rows of one shape: every kernel built for it and torch._scaled_mm, timed together."""
    one = torch.ones((), device="cuda", dtype=torch.float32)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
    sa = torch.full((1,), 0.5, device="cuda")
    sb = torch.full((1,), 0.25, device="cuda")
    ref = (a.float() @ b.float().T) * 0.125
    calls = {"torch._scaled_mm": lambda: torch._scaled_mm(
        a, b.t(), scale_a=sa.reshape(()) * one, scale_b=sb.reshape(()) * one,
        out_dtype=torch.bfloat16)}
    errors = {}
    for name, v in kernels.items():
        if (v["N"], v["K"]) != (N, K):
            continue
        kernel = load_kernel(bundle, name)
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        kernel(a, b, sa, sb, y)
        torch.cuda.synchronize()
        errors[name] = float((y.float() - ref).norm() / ref.norm())
        calls[name] = (lambda k, dst: lambda: k(a, b, sa, sb, dst))(kernel, y)
    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS, rep_ms=50)
    rows = []
    for name, t in us.items():
        row = {"M": M, "N": N, "K": K, "kernel": name, "us": round(t, 2),
               "tflops": round(2 * M * N * K / (t * 1e-6) / 1e12, 1),
               "vs_scaled_mm": round(us["torch._scaled_mm"] / t, 3),
               "rel_err": errors.get(name)}
        if name in kernels:
            row.update(path=kernels[name]["path"], config=kernels[name]["config"])
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())
    rows = []
    for M, N, K in SHAPES:
        rows += _shape(torch, bundle, index["kernels"], M, N, K)
    write_results(out, "fp8_paths.py", bundle, index, rounds=ROUNDS, graph_calls=GRAPH_CALLS,
                  rows=rows)


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "fp8_paths"))
