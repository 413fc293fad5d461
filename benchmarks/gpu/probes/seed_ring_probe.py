"""Probe (issue 12, the seed's GEMM at 0.88x cuBLAS bf16): examples/gemm.py at its own config
(128x128x32, 3 stages, 128 threads), 4096^3 fp16 / bf16, with the per-op path's schedule
knobs changed one at a time: ring depth (ws_plan.MIN_RING: 3, which leaves two blocks per
SM, then 4, the default, 5 and 6), the persistent walk off (compile option persistent=1), and
the grouped raster's group (grid_walk.bind_block: 4, 8 the default, 16); timed with cuBLAS in
one process, 7 rounds in rotated order (do_bench medians).

Here:  python benchmarks/gpu/probes/seed_ring_probe.py build .gpu/seed_probe
There: python3 benchmarks/gpu/probes/seed_ring_probe.py run .gpu/seed_probe $OUT/seed_probe.json
(benchmarks/results/seed_ring_probe_h200.json was made by this script run from .gpu/ before it
was committed here, where ROOT was one level up.)
"""

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
SIZE = 4096
VARIANTS = {"base": {}, "ring3": {"ring": 3}, "ring5": {"ring": 5}, "ring6": {"ring": 6},
            "nopers": {"options": {"persistent": 1}}, "group4": {"group": 4},
            "group16": {"group": 16}}


def build(out: Path) -> None:
    import gemm
    from bundle_cli import compile_into

    from tiled.compiler.targets.cuda import grid_walk, ws_plan

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dt in ("float16", "bfloat16"):
        for v, cfg in VARIANTS.items():
            ws_plan.MIN_RING = cfg.get("ring", 4)
            grid_walk.bind_block.__defaults__ = (cfg.get("group", 8),)
            k = gemm.matmul(SIZE, SIZE, SIZE, 128, 128, 32, 3, dt, threads=128)
            c, _ = compile_into(out, f"{dt}_{v}", k, "cuda:sm_90a", **cfg.get("options", {}))
            index[f"{dt}_{v}"] = {"dtype": dt, "smem": c.manifest.dynamic_smem_bytes,
                                  "grid": str(c.manifest.grid)}
            print(f"{dt}_{v}", index[f"{dt}_{v}"], flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


def _dtype_row(torch, do_bench, load_kernel, bundle: Path, index: dict, dt_name: str) -> dict:
    dt = getattr(torch, dt_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    b = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    ref = torch.matmul(a, b).float()
    calls = {"cublas": lambda: torch.matmul(a, b)}
    errs = {}
    for n, m in index.items():
        if m["dtype"] != dt_name:
            continue
        k, c = load_kernel(bundle, n), torch.empty_like(a)
        k(a, b, c)
        torch.cuda.synchronize()
        errs[n] = float((c.float() - ref).norm() / ref.norm())
        calls[n] = (lambda fn, dst: lambda: fn(a, b, dst))(k, c)
    samples = {n: [] for n in calls}
    names = list(calls)
    for r in range(7):
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples[n].append(do_bench(calls[n], warmup=25, rep=100))
    tf = {n: 2 * SIZE ** 3 / statistics.median(v) / 1e9 for n, v in samples.items()}
    return {"dtype": dt_name, "tflops": tf, "ratio": {n: tf[n] / tf["cublas"] for n in tf},
            "errs": errs}


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import load_kernel
    from triton.testing import do_bench

    index = json.loads((bundle / "index.json").read_text())
    rows = []
    for dt_name in ("float16", "bfloat16"):
        rows.append(_dtype_row(torch, do_bench, load_kernel, bundle, index, dt_name))
        print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps({"rows": rows, "index": index}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
