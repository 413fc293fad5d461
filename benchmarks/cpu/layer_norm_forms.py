"""LayerNorm on the cpu backend written two ways, same process: tiled.ops' kernel (the centred
values computed twice: once squared into the variance's sum, once in the output pass) and the
form it had before (the centred values stored back into the tile, the squares into a second
tile, then summed), beside the tiled copy kernel of benchmarks/cpu/membound.py in interleaved
rounds (copy, ops, stored). On a CPU the second form is two more passes over the block: its
store ends the fold of X's copy into the tile (tiled/compiler/targets/cpu/forward.py), and a
loop with two stores does not fold into the reduction after it.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/layer_norm_forms.py [--rounds 30]
        [--out benchmarks/results/cpu_layer_norm_forms.json]
"""

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, round_times, start, write_result
from membound import copy_kernel, np_dtype, reference

ROOT = Path(__file__).resolve().parents[2]
ROWS = COLS = 4096


def stored_form(N: int, dtype: str, eps: float, blk_m: int):
    """tiled.ops.kernels.layer_norm (affine) as it was before the centred values were
    recomputed."""
    import tiled
    import tiled.lang as T

    M = T.dyn("M")

    @tiled.kernel
    def layer_norm_stored(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype),
                          B: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x = T.alloc_fragment((blk_m, N), "float32")
            d2 = T.alloc_fragment((blk_m, N), "float32")
            mean = T.alloc_fragment((blk_m,), "float32")
            var = T.alloc_fragment((blk_m,), "float32")
            T.copy(X[bx * blk_m, 0], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(blk_m):
                mean[i] = mean[i] / N
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] - mean[i]
                d2[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(d2, var, dim=1)
            for i in T.Parallel(blk_m):
                var[i] = T.rsqrt(var[i] / N + eps)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] * var[i] * T.cast(W[j], "float32") + T.cast(B[j], "float32")
            T.copy(x, Y[bx * blk_m, 0])
    return layer_norm_stored


def measure(dtype: str, rounds: int) -> dict:
    import tiled
    from tiled.ops import _launch_config, kernels

    dt = np_dtype(dtype)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((ROWS, COLS), dtype=np.float32) * 2 + 1).astype(dt)
    w = rng.standard_normal(COLS, dtype=np.float32).astype(dt)
    b = rng.standard_normal(COLS, dtype=np.float32).astype(dt)
    y = np.empty_like(x)
    cfg = _launch_config("rms_norm", "cpu", N=COLS, dtype=dtype)
    copy = tiled.compile(copy_kernel(COLS, dtype), "cpu", stream_stores=False)
    forms = {"ops": tiled.compile(kernels.layer_norm(COLS, dtype, 1e-5, True, **cfg), "cpu"),
             "stored": tiled.compile(stored_form(COLS, dtype, 1e-5, cfg["blk_m"]), "cpu")}
    want = reference("layer_norm", x, w, b)
    errs = {}
    for label, k in forms.items():
        k(x, w, b, y)
        errs[label] = float(np.abs(y.astype(np.float64) - want).max() / np.abs(want).max())
        assert errs[label] < (1e-5 if dtype == "float32" else 1e-2), (label, errs[label])
    calls = {"copy": lambda: copy(x, y)}
    calls.update({label: (lambda k=k: k(x, w, b, y)) for label, k in forms.items()})
    times = round_times(calls, rounds)
    nbytes = 2 * x.nbytes
    row = {"copy_gbs": round(nbytes / min(times["copy"]) / 1e9, 2), "max_rel_err": errs}
    for label in forms:
        row[label] = {"best_ms": round(min(times[label]) * 1e3, 3),
                      "of_copy": round(min(times["copy"]) / min(times[label]), 3),
                      "of_copy_median_of_rounds": round(statistics.median(
                          times["copy"][r] / times[label][r] for r in range(rounds)), 3)}
    row["ops_speedup_median_of_rounds"] = round(statistics.median(
        times["stored"][r] / times["ops"][r] for r in range(rounds)), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks/results/cpu_layer_norm_forms.json")
    args = ap.parse_args()
    from tiled import config

    head = start(sys.argv)
    threads = blas_threads()
    with config.override(cpu_threads=threads):
        results = {}
        for dtype in args.dtypes:
            results[dtype] = row = measure(dtype, args.rounds)
            print(dtype, row, flush=True)
    write_result(args.out, head, {"threads": threads, "rows": ROWS, "cols": COLS,
                                  "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
