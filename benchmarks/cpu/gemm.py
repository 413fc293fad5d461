"""GEMM on the cpu backend against numpy (OpenBLAS) in the same process, on the same threads.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/gemm.py [--sizes 1024 2048]
        [--out benchmarks/results/cpu_gemm.json]

examples/gemm.py's kernel, unchanged, compiled for `cpu` (this host's level) with several tile
configs, C = A @ B with float32 accumulation and a float32 C; A and B float32, float16 or
bfloat16. The reference is numpy's float32 matmul of float32 operands (OpenBLAS sgemm; numpy
has no 16-bit GEMM that runs at speed), measured in the same process, interleaved with the
tiled runs (one numpy call, one tiled call, ..., each after a pause: SETTLE_S) so both see
the same machine. Both use the
thread count of numpy's BLAS. Every tiled result is checked against numpy first. `ratio` is
numpy's best time over tiled's best; `ratio_median_of_rounds` the median over rounds of the
two calls of a round, which load that comes and goes (a shared machine) affects less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import SETTLE_S, blas_threads, start, timings, write_result

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

CONFIGS = [(64, 64, 32), (128, 128, 32), (128, 128, 64), (256, 128, 32), (256, 128, 64),
           (256, 256, 64), (512, 128, 64), (256, 128, 128), (128, 256, 128)]


def np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def bench(n: int, dtype: str, cfg: tuple, repeat: int) -> dict:
    from gemm import matmul

    import tiled

    rng = np.random.default_rng(n)
    a32 = rng.standard_normal((n, n), dtype=np.float32)
    b32 = rng.standard_normal((n, n), dtype=np.float32)
    a, b = a32.astype(np_dtype(dtype)), b32.astype(np_dtype(dtype))
    c = np.empty((n, n), np.float32)
    kernel = tiled.compile(matmul(n, n, n, *cfg, num_stages=2, dtype=dtype,
                                  out_dtype="float32"), target="cpu")
    kernel(a, b, c)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    err = float(np.abs(c - ref).max() / np.abs(ref).max())
    assert err < 1e-5, (n, dtype, cfg, err)
    out = np.empty_like(c)
    tiled_t, numpy_t = [], []
    for _ in range(repeat):  # interleaved: one call of each per round, each after a pause
        time.sleep(SETTLE_S)
        numpy_t.append(timings(lambda: np.matmul(a32, b32, out=out), 1, warmup=0)["best_s"])
        time.sleep(SETTLE_S)
        tiled_t.append(timings(lambda: kernel(a, b, c), 1, warmup=0)["best_s"])
    flop = 2.0 * n ** 3
    best_tiled, best_numpy = min(tiled_t), min(numpy_t)
    return {"n": n, "dtype": dtype, "tile": list(cfg), "target": kernel.manifest.target,
            "max_rel_err": err,
            "tiled_ms": round(best_tiled * 1e3, 3), "numpy_fp32_ms": round(best_numpy * 1e3, 3),
            "tiled_gflops": round(flop / best_tiled / 1e9, 1),
            "numpy_fp32_gflops": round(flop / best_numpy / 1e9, 1),
            "ratio": round(best_numpy / best_tiled, 3),
            # Per round (a numpy call, then a tiled call right after): robust to load that
            # comes and goes on a shared machine, since both calls of a round see the same.
            "ratio_median_of_rounds": round(statistics.median(
                n_t / t_t for n_t, t_t in zip(numpy_t, tiled_t, strict=True)), 3),
            "spread": {"tiled": round(max(tiled_t) / best_tiled - 1, 3),
                       "numpy": round(max(numpy_t) / best_numpy - 1, 3)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_gemm.json")
    args = p.parse_args()

    from tiled import config

    threads = blas_threads()
    head = start(sys.argv)  # before this process loads the CPUs
    rows = []
    with config.override(cpu_threads=threads):
        for n in args.sizes:
            for dtype in args.dtypes:
                for cfg in CONFIGS:
                    r = bench(n, dtype, cfg, args.repeat if n <= 1024 else max(3, args.repeat // 3))
                    rows.append(r)
                    print(f"{n}^3 {dtype:8s} {cfg}: tiled {r['tiled_ms']:8.2f} ms "
                          f"{r['tiled_gflops']:6.1f} GFLOP/s | numpy fp32 {r['numpy_fp32_ms']:8.2f}"
                          f" ms | {r['ratio']:.2f}x, per round {r['ratio_median_of_rounds']:.2f}x"
                          f" (spread {r['spread']})", flush=True)
    # Headline per case: tiled's best tile config against numpy's best time at that size (numpy
    # computes the same float32 product in every row of the size).
    best = {}
    for r in rows:
        numpy_best = max(x["numpy_fp32_gflops"] for x in rows if x["n"] == r["n"])
        key = f"{r['n']}_{r['dtype']}"
        if key not in best or r["tiled_gflops"] > best[key]["tiled_gflops"]:
            best[key] = {"tile": r["tile"], "tiled_gflops": r["tiled_gflops"],
                         "numpy_fp32_gflops": numpy_best,
                         "ratio": round(r["tiled_gflops"] / numpy_best, 3),
                         "ratio_median_of_rounds": r["ratio_median_of_rounds"]}
    write_result(args.out, head, {"threads": threads, "best_tile_per_case": best, "rows": rows})


if __name__ == "__main__":
    main()
