"""bfloat16 rounding by instruction against exact integer rounding on one AVX512-BF16 host:
tiled.ops' RMSNorm, softmax and SiLU-and-mul over bf16 rows x 4096, compiled for
cpu:x86-64-v4+bf16 (float32 -> bfloat16 by vcvtneps2bf16: tiled/compiler/targets/cpu/
native_bf16.py) and for cpu:x86-64-v4 (the same code otherwise), beside membound.py's tiled
copy, in interleaved rounds (each round: copy, then each op at each level; each timing the
best of 3 back-to-back calls). Outputs of the two levels are compared too (they differ only
where a float32 result is subnormal).

    python benchmarks/cpu/bf16_native.py [--out benchmarks/results/cpu_bf16_native.json]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, start, write_result
from membound import copy_kernel, np_dtype

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ("cpu:x86-64-v4", "cpu:x86-64-v4+bf16")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_bf16_native.json")
    args = p.parse_args()
    head = start(sys.argv)

    import tiled
    from tiled import config
    from tiled.ops import _launch_config, kernels
    from tiled.runtime import cpu_levels

    if cpu_levels.host_level().name != "x86-64-v4+bf16":
        sys.exit(f"this host is cpu:{cpu_levels.host_level().name}; the comparison needs "
                 "cpu:x86-64-v4+bf16")
    threads, cols, dt = blas_threads(), 4096, np_dtype("bfloat16")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.rows, cols), dtype=np.float32) * 2).astype(dt)
    x2 = (rng.standard_normal((args.rows, 2 * cols), dtype=np.float32) * 2).astype(dt)
    w = rng.standard_normal(cols, dtype=np.float32).astype(dt)
    y = np.empty((args.rows, cols), dt)
    cfg = _launch_config("rms_norm", "cpu")
    factories = {
        "rms_norm": (lambda: kernels.rms_norm(cols, "bfloat16", 1e-6, **cfg), (x, w, y)),
        "softmax": (lambda: kernels.softmax(cols, "bfloat16", **cfg), (x, y)),
        "silu_and_mul": (lambda: kernels.gated_activation(
            cols, "bfloat16", "silu", **_launch_config("gated_activation", "cpu")), (x2, y)),
    }
    with config.override(cpu_threads=threads):
        plain_copy = tiled.compile(copy_kernel(cols, "bfloat16"), "cpu", stream_stores=False)
        calls = {"copy": (plain_copy, (x, y))}
        compile_s, differ = {}, {}
        for op, (make, a) in factories.items():
            outs = []
            for level in LEVELS:
                t0 = time.perf_counter()
                k = tiled.compile(make(), level, cache=False)
                compile_s[f"{op} {level}"] = round(time.perf_counter() - t0, 2)
                k(*a)
                outs.append(y.view(np.uint16).copy())
                calls[f"{op} {level}"] = (k, a)
            differ[op] = int((outs[0] != outs[1]).sum())
        times = {c: [] for c in calls}
        for _ in range(args.rounds):
            for c, (k, a) in calls.items():
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    k(*a)
                    best = min(best, time.perf_counter() - t0)
                times[c].append(best)
    results = {}
    for op in factories:
        row = {}
        for level in LEVELS:
            c = f"{op} {level}"
            per_round = [times["copy"][r] / times[c][r] for r in range(args.rounds)]
            moved = 1.5 if op == "silu_and_mul" else 1.0  # bytes over the copy's
            row[level] = {"median_ms": round(statistics.median(times[c]) * 1e3, 3),
                          "best_ms": round(min(times[c]) * 1e3, 3),
                          "of_copy_median_of_rounds": round(
                              statistics.median(per_round) * moved, 3),
                          "compile_s": compile_s[c]}
        a, b = (row[lv]["median_ms"] for lv in LEVELS)
        row["v4_over_v4_bf16"] = round(a / b, 3)
        row["elements_that_differ"] = differ[op]
        results[op] = row
        print(f"{op:13s} v4 {a:7.3f} ms  v4+bf16 {b:7.3f} ms  ({a / b:.2f}x; of copy "
              f"{row[LEVELS[0]]['of_copy_median_of_rounds']:.2f} -> "
              f"{row[LEVELS[1]]['of_copy_median_of_rounds']:.2f}); outputs differ in "
              f"{differ[op]} elements", flush=True)
    copy_ms = statistics.median(times["copy"]) * 1e3
    write_result(args.out, head, {"threads": threads, "rows": args.rows, "cols": cols,
                                  "rounds": args.rounds, "copy_median_ms": round(copy_ms, 3),
                                  "results": results})


if __name__ == "__main__":
    main()
