"""Which reductions on the cpu backend gain from prefetching the next block's rows while
they compute on their own block's (tiled/compiler/targets/cpu/prefetch.py, next_block_line:
a reduction that reads the block's rows a second time)? tiled.ops' softmax (exponentials in
that pass), LayerNorm (plain arithmetic: its sum of squares) and RMSNorm (no second pass: a
control) over X [rows, cols], their CPU launch, each built three ways in one process: as
compiled by default (`math`: only passes with a long math function prefetch), prefetching in
any such pass (`any`) and never (`off`), beside the tiled copy kernel of
benchmarks/cpu/membound.py, in interleaved rounds (copy, math, any, off). The builds' outputs
are checked equal. Reports each build's best and per-round median bandwidth over the copy's,
and `off`'s time over each other build's per round.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/next_block_prefetch.py \\
        [--rounds 30] [--ops softmax layer_norm rms_norm] [--dtypes float32 bfloat16]
        [--out benchmarks/results/cpu_next_block_prefetch_spread.json]
"""

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, round_times, start, write_result
from membound import copy_kernel, np_dtype

ROOT = Path(__file__).resolve().parents[2]
ROWS = COLS = 4096
MODES = ("math", "any", "off")  # prefetch.NEXT_BLOCK


def build(op: str, dtype: str, mode: str):
    import tiled
    from tiled.compiler.targets.cpu import prefetch
    from tiled.ops import _launch_config, kernels

    cfg = _launch_config("rms_norm", "cpu")  # the row-block ops' CPU launch
    kernel = {"softmax": lambda: kernels.softmax(COLS, dtype, **cfg),
              "rms_norm": lambda: kernels.rms_norm(COLS, dtype, 1e-6, **cfg),
              "layer_norm": lambda: kernels.layer_norm(COLS, dtype, 1e-5, True, **cfg)}[op]()
    saved, prefetch.NEXT_BLOCK = prefetch.NEXT_BLOCK, mode
    try:
        return tiled.compile(kernel, "cpu", cache=False)
    finally:
        prefetch.NEXT_BLOCK = saved


def measure(op: str, dtype: str, copy, x, w, b, y, rounds: int) -> dict:
    calls = {"copy": lambda: copy(x, y)}
    ref = None
    for label in MODES:
        k = build(op, dtype, label)
        args = {"softmax": (x, y), "rms_norm": (x, w, y), "layer_norm": (x, w, b, y)}[op]
        calls[label] = lambda k=k, args=args: k(*args)
        calls[label]()
        out = y.astype(np.float32)
        if ref is None:
            ref = out
        assert np.array_equal(out, ref), (op, dtype, label)  # the same values
    times = round_times(calls, rounds)
    nbytes = 2 * x.nbytes
    copy_best = min(times["copy"])
    row = {"copy_gbs": round(nbytes / copy_best / 1e9, 2)}
    for label in MODES:
        per_round = [times["copy"][r] / times[label][r] for r in range(rounds)]
        row[label] = {"best_ms": round(min(times[label]) * 1e3, 3),
                      "median_ms": round(statistics.median(times[label]) * 1e3, 3),
                      "gbs": round(nbytes / min(times[label]) / 1e9, 2),
                      "of_copy": round(copy_best / min(times[label]), 3),
                      "of_copy_median_of_rounds": round(statistics.median(per_round), 3)}
    for label in MODES[:-1]:
        row[f"{label}_speedup_over_off_median_of_rounds"] = round(statistics.median(
            times["off"][r] / times[label][r] for r in range(rounds)), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--ops", nargs="+", default=["softmax", "layer_norm", "rms_norm"])
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks/results/cpu_next_block_prefetch_spread.json")
    args = ap.parse_args()
    import tiled
    from tiled import config

    head = start(sys.argv)
    threads = blas_threads()
    results = {}
    with config.override(cpu_threads=threads):
        for dtype in args.dtypes:
            dt = np_dtype(dtype)
            rng = np.random.default_rng(0)
            x = (rng.standard_normal((ROWS, COLS), dtype=np.float32) * 2).astype(dt)
            w = rng.standard_normal(COLS, dtype=np.float32).astype(dt)
            b = rng.standard_normal(COLS, dtype=np.float32).astype(dt)
            y = np.empty_like(x)
            copy = tiled.compile(copy_kernel(COLS, dtype), "cpu", stream_stores=False)
            for op in args.ops:
                results[f"{op}_{dtype}"] = row = measure(op, dtype, copy, x, w, b, y,
                                                         args.rounds)
                print(op, dtype, row, flush=True)
    write_result(args.out, head, {"threads": threads, "rows": ROWS, "cols": COLS,
                                  "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
