"""Element loops that prefetch the next block's rows on the cpu backend
(tiled/compiler/targets/cpu/prefetch.py, element_plan), on and off, in one process: tiled.ops'
SiLU-and-mul (its CPU launch: 4 rows x 4096 columns a block) over X [rows, 2 cols] -> Y
[rows, cols], built as compiled (`prefetch`) and with prefetch.ELEMENTS off (`plain`), beside
the plain copy of X's first half (membound.py's reference: the direct copy kernel,
`stream_stores=False`), in an order shuffled per round. The builds' outputs are checked
equal. Per build: the best time and the median over rounds of its bandwidth (X and Y bytes)
over the round's copy; and the median over rounds of plain / prefetch.

    python benchmarks/cpu/element_prefetch.py [--dtypes float32 bfloat16] [--repeat 30]
        [--out benchmarks/results/cpu_element_prefetch.json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import rows_cols_main, shuffled_round_times
from membound import copy_kernel, inputs

ROOT = Path(__file__).resolve().parents[2]


def _build(cols: int, dtype: str, on: bool):
    import tiled
    from tiled.compiler.targets.cpu import prefetch
    from tiled.ops import _launch_config, kernels

    saved, prefetch.ELEMENTS = prefetch.ELEMENTS, on
    try:
        return tiled.compile(kernels.gated_activation(
            cols, dtype, "silu", **_launch_config("gated_activation", "cpu", N=cols)), "cpu",
            cache=False)
    finally:
        prefetch.ELEMENTS = saved


def bench(rows: int, cols: int, dtype: str, rounds: int) -> dict:
    import tiled

    x, x2, _, _ = inputs(rows, cols, dtype)
    y = np.empty_like(x)
    builds = {"prefetch": _build(cols, dtype, True), "plain": _build(cols, dtype, False)}
    copy = tiled.compile(copy_kernel(cols, dtype), "cpu", stream_stores=False)
    builds["plain"](x2, y)
    want = y.copy()
    builds["prefetch"](x2, y)
    assert np.array_equal(want.view(np.uint8), y.view(np.uint8))
    calls = {"copy": lambda: copy(x, y),
             **{n: (lambda k=k: k(x2, y)) for n, k in builds.items()}}
    for fn in calls.values():
        fn()
    times = shuffled_round_times(calls, rounds)
    copied, moved = 2 * x.nbytes, x2.nbytes + y.nbytes
    out = {"copy_best_gbs": round(copied / min(times["copy"]) / 1e9, 2)}
    for n in builds:
        out[n] = {"best_ms": round(min(times[n]) * 1e3, 3),
                  "of_copy_median_of_rounds": round(statistics.median(
                      (moved / t) / (copied / c)
                      for c, t in zip(times["copy"], times[n], strict=True)), 3)}
    out["plain_over_prefetch_median"] = round(statistics.median(
        p / q for p, q in zip(times["plain"], times["prefetch"], strict=True)), 3)
    print(f"{dtype:8s} silu_and_mul prefetch {out['prefetch']['best_ms']:6.2f} ms "
          f"({out['prefetch']['of_copy_median_of_rounds']:.2f} of copy) plain "
          f"{out['plain']['best_ms']:6.2f} ms ({out['plain']['of_copy_median_of_rounds']:.2f}) "
          f"speedup {out['plain_over_prefetch_median']:.2f}x (copy {out['copy_best_gbs']} GB/s)",
          flush=True)
    return out


def main() -> None:
    rows_cols_main(__doc__, bench, ROOT / "benchmarks/results/cpu_element_prefetch.json")


if __name__ == "__main__":
    main()
