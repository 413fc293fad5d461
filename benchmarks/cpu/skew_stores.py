"""Row-skewed stores on the cpu backend (tiled/compiler/targets/cpu/skew.py), on and off, in one
process: tiled.ops' softmax as its CPU path builds it (four rows per block), built as the
backend does (`skewed`), with skew.ENABLED off (`unskewed`), and skewed with the reduction's
partial sums in two vector registers (`two_vectors`: reduce.py's ReduceLowering.lanes as it
was before it kept one for long math), over X [rows, cols] -> Y [rows, cols]. X and Y come
two ways: as numpy allocates them (16 bytes past a 64-byte boundary) and 64-byte aligned (as
torch allocates). Each round calls the plain copy (membound.py's reference: the direct copy
kernel, `stream_stores=False`) and the builds, in an order shuffled per round (the machine's
bandwidth drifts); per build the best time, the median over rounds of its bandwidth over the
round's plain copy, and the medians over rounds of the unskewed and the two-vector times over
the skewed one. The builds' outputs are checked against numpy first.

    python benchmarks/cpu/skew_stores.py [--dtypes float32 bfloat16] [--repeat 30]
        [--out benchmarks/results/cpu_skew_stores.json]

(`--repeat`: rounds.)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import rows_cols_main, shuffled_round_times
from membound import copy_kernel, inputs, np_dtype, reference
from stream_stores import _aligned

ROOT = Path(__file__).resolve().parents[2]


def _build(cols: int, dtype: str, skewed: bool, two_vectors: bool = False):
    import tiled
    from tiled.compiler.targets.cpu import reduce, skew
    from tiled.ops import kernels

    saved = skew.ENABLED, reduce.ReduceLowering.lanes
    skew.ENABLED = skewed
    if two_vectors:
        reduce.ReduceLowering.lanes = lambda self, r, acc: self.reduce_lanes
    try:
        return tiled.compile(kernels.softmax(cols, dtype, blk_m=4), "cpu", cache=False)
    finally:
        skew.ENABLED, reduce.ReduceLowering.lanes = saved


def bench(rows: int, cols: int, dtype: str, rounds: int) -> dict:
    import tiled

    dt = np_dtype(dtype)
    x0 = inputs(rows, cols, dtype)[0]
    builds = {"skewed": _build(cols, dtype, True), "unskewed": _build(cols, dtype, False),
              "two_vectors": _build(cols, dtype, True, two_vectors=True)}
    copy = tiled.compile(copy_kernel(cols, dtype), "cpu", stream_stores=False)
    want = reference("softmax", x0, None, None)
    tol = 1e-5 if dtype == "float32" else 1e-2
    moved = 2 * x0.nbytes
    out = {}
    for layout in ("numpy", "aligned64"):
        if layout == "numpy":
            x, y = x0, np.empty((rows, cols), dt)
        else:
            x, y = _aligned((rows, cols), dt, 64), _aligned((rows, cols), dt, 64)
            x[...] = x0
        for name, k in builds.items():
            y[...] = 0
            k(x, y)
            err = float(np.abs(y.astype(np.float64) - want).max() / np.abs(want).max())
            assert err < tol, (name, layout, err)
        calls = {"copy": lambda x=x, y=y: copy(x, y),
                 **{n: (lambda k=k, x=x, y=y: k(x, y)) for n, k in builds.items()}}
        times = shuffled_round_times(calls, rounds)
        row = {"x_y_mod_64": [x.ctypes.data % 64, y.ctypes.data % 64],
               "copy_best_gbs": round(moved / min(times["copy"]) / 1e9, 2)}
        for n in builds:
            row[n] = {"best_ms": round(min(times[n]) * 1e3, 3),
                      "of_copy_median_of_rounds": round(statistics.median(
                          c / t for c, t in zip(times["copy"], times[n], strict=True)), 3)}
        for other in ("unskewed", "two_vectors"):
            row[f"{other}_over_skewed_median"] = round(statistics.median(
                u / s for u, s in zip(times[other], times["skewed"], strict=True)), 3)
        out[layout] = row
        print(f"{dtype:8s} softmax {layout:9s} skewed {row['skewed']['best_ms']:6.2f} ms "
              f"({row['skewed']['of_copy_median_of_rounds']:.2f} of copy) unskewed "
              f"{row['unskewed']['best_ms']:6.2f} ms "
              f"({row['unskewed']['of_copy_median_of_rounds']:.2f}) speedup "
              f"{row['unskewed_over_skewed_median']:.2f}x; over two vectors "
              f"{row['two_vectors_over_skewed_median']:.2f}x (copy {row['copy_best_gbs']} GB/s)",
              flush=True)
    return out


def main() -> None:
    rows_cols_main(__doc__, bench, ROOT / "benchmarks/results/cpu_skew_stores.json")


if __name__ == "__main__":
    main()
