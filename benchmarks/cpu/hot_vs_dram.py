"""Is a memory-bound op on the cpu backend bound by memory or by arithmetic? tiled.ops'
RMSNorm, softmax and SiLU-and-mul (their CPU launch) and the tiled copy of membound.py, each
timed over rows x 4096 twice: `hot`, 136 rows that stay in the L2 caches between calls (less
the time of 8 rows: the launch), and `dram`, 4096 rows streamed from memory. Both in
nanoseconds per element per core: an op whose hot time is near its DRAM time is bound by its
arithmetic, and overlapping its loads better would not make it faster.

    python benchmarks/cpu/hot_vs_dram.py [--out benchmarks/results/cpu_hot_vs_dram.json]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, start, write_result
from membound import copy_kernel, np_dtype

ROOT = Path(__file__).resolve().parents[2]
COLS = 4096


def per_call(kernel, args, calls: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            kernel(*args)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measure(dtype: str, threads: int) -> dict:
    import tiled
    from tiled.ops import _launch_config, kernels

    dt = np_dtype(dtype)
    cfg = _launch_config("rms_norm", "cpu")
    ops = {"copy": tiled.compile(copy_kernel(COLS, dtype), "cpu", stream_stores=False),
           "rms_norm": tiled.compile(kernels.rms_norm(COLS, dtype, 1e-6, **cfg), "cpu"),
           "softmax": tiled.compile(kernels.softmax(COLS, dtype, **cfg), "cpu"),
           "silu_and_mul": tiled.compile(kernels.gated_activation(
               COLS, dtype, "silu", **_launch_config("gated_activation", "cpu")), "cpu")}
    rng = np.random.default_rng(0)
    out = {}
    for name, k in ops.items():
        def args(rows, name=name):
            x = rng.standard_normal((rows, COLS * (2 if name == "silu_and_mul" else 1)),
                                    dtype=np.float32).astype(dt)
            y = np.empty((rows, COLS), dt)
            w = rng.standard_normal(COLS, dtype=np.float32).astype(dt)
            return (x, w, y) if name == "rms_norm" else (x, y)
        small, hot, big = args(8), args(136), args(4096)
        k(*big)
        t_small, t_hot = per_call(k, small, 200), per_call(k, hot, 200)
        t_big = per_call(k, big, 5)
        ns = {"hot": (t_hot - t_small) / (128 * COLS) * threads * 1e9,
              "dram": t_big / (4096 * COLS) * threads * 1e9}
        out[name] = {k2: round(v, 3) for k2, v in ns.items()}
        out[name]["launch_us"] = round(t_small * 1e6, 1)
        print(f"{name:13s} {dtype:8s} hot {ns['hot']:.3f}  dram {ns['dram']:.3f} ns / element / "
              f"core  (8 rows: {t_small * 1e6:.1f} us)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_hot_vs_dram.json")
    args = p.parse_args()
    head = start(sys.argv)
    from tiled import config

    threads = blas_threads()
    with config.override(cpu_threads=threads):
        results = {d: measure(d, threads) for d in ("float32", "bfloat16")}
    write_result(args.out, head, {"threads": threads, "cols": COLS,
                                  "unit": "ns per element per core", "results": results})


if __name__ == "__main__":
    main()
