"""Launch cost of CPU kernels with the pool's threads spinning between launches against
sleeping at once (TILED_CPU_SPIN_US, tiled/compiler/targets/cpu/shim.c), same process.

    python benchmarks/cpu/launch.py [--out benchmarks/results/cpu_launch.json]

Kernels: a one-block copy of 64 floats (all launch: the Python call, the pool's wake-up and
its wait), and tiled.ops' float32 RMSNorm over rows x 4096 (its CPU launch, 4 rows per
block) at 1, 16, 256 and 4096 rows. Each measurement is the mean of back-to-back calls (as
an engine calls its ops), the spin settings alternating call batch by call batch; the
result is the median over rounds of each, and their ratio.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, start, write_result

ROOT = Path(__file__).resolve().parents[2]
SPINS = (0, 200)  # microseconds: sleep at once, the default


def one_block_copy():
    import tiled
    import tiled.lang as T

    M = T.dyn("M")

    @tiled.kernel
    def one_block(X: T.Tensor((M, 64), "float32"), Y: T.Tensor((M, 64), "float32")):
        with T.Kernel(M, threads=128) as bx:
            for j in T.Parallel(64):
                Y[bx, j] = X[bx, j]
    return one_block


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_launch.json")
    args = p.parse_args()
    head = start(sys.argv)

    import tiled
    from tiled import config
    from tiled.ops import _launch_config, kernels
    from tiled.runtime import cpu as cpu_runtime

    threads = blas_threads()
    rng = np.random.default_rng(0)
    cases = {}
    with config.override(cpu_threads=threads):
        copy = tiled.compile(one_block_copy(), "cpu")
        x = np.ones((1, 64), np.float32)
        cases["one_block_copy"] = (copy, (x, np.empty_like(x)))
        rms = tiled.compile(kernels.rms_norm(4096, "float32", 1e-6,
                                             **_launch_config("rms_norm", "cpu")), "cpu")
        w = rng.standard_normal(4096, dtype=np.float32)
        for rows in (1, 16, 256, 4096):
            x = rng.standard_normal((rows, 4096), dtype=np.float32)
            cases[f"rms_norm_{rows}x4096"] = (rms, (x, w, np.empty_like(x)))
        for k, a in cases.values():
            k(*a)
        set_spin = cpu_runtime.set_pool_spin_us
        times = {(c, s): [] for c in cases for s in SPINS}
        for _ in range(args.rounds):
            for c, (k, a) in cases.items():
                calls = max(1, int(2e-2 / max(1e-5, a[0].size * 2e-10)))
                for s in SPINS:
                    set_spin(s)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        k(*a)
                    times[(c, s)].append((time.perf_counter() - t0) / calls)
        set_spin(int(config.get("cpu_spin_us")))
    results = {}
    for c in cases:
        sleep_us, spin_us = (statistics.median(times[(c, s)]) * 1e6 for s in SPINS)
        results[c] = {"sleep_us": round(sleep_us, 1), "spin_200us_us": round(spin_us, 1),
                      "sleep_over_spin": round(sleep_us / spin_us, 3)}
        print(f"{c:22s} sleeping {sleep_us:9.1f} us  spinning {spin_us:9.1f} us  "
              f"{sleep_us / spin_us:.2f}x", flush=True)
    write_result(args.out, head, {"threads": threads, "rounds": args.rounds,
                                  "results": results})


if __name__ == "__main__":
    main()
