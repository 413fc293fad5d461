"""Streaming (non-temporal) stores on the cpu backend, on and off, in one process: tiled.ops'
RMSNorm, softmax and LayerNorm (their CPU launch: four rows per block), SiLU-and-mul (X [rows,
2 cols]; its element loop stores Y) and the tiled copy
through a tile (membound.py's copy_kernel(tile=True)), each built with the default
(`stream_stores`: outputs of twice the last-level cache or more stream) and with
`stream_stores=False`, over X [rows, cols] -> Y [rows, cols]. Y comes two ways: as numpy
allocates it (16-byte aligned: the streaming loop's 32-byte vectors go out as two 16-byte
stores) and 64-byte aligned (as torch allocates). Rounds interleave (plain copy, op streaming,
op plain) for every op and output; per build the best time and the median over rounds of its
bandwidth over the round's plain copy (membound.py's reference: the direct copy kernel,
`stream_stores=False`). Outputs of the two builds are checked equal first.

    python benchmarks/cpu/stream_stores.py [--dtypes float32 bfloat16] [--repeat 30]
        [--out benchmarks/results/cpu_stream_stores.json]

(`--repeat`: rounds; the results under benchmarks/results were taken with 20.)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import rows_cols_main
from membound import copy_kernel, inputs, np_dtype

ROOT = Path(__file__).resolve().parents[2]


def _aligned(shape, dt, align: int) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dt).itemsize
    raw = np.zeros(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dt).reshape(shape)


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(rows: int, cols: int, dtype: str, rounds: int) -> dict:
    import tiled
    from tiled.ops import _launch_config, kernels

    dt = np_dtype(dtype)
    x, x2, w, b = inputs(rows, cols, dtype)
    outputs = {"numpy": np.empty((rows, cols), dt), "aligned64": _aligned((rows, cols), dt, 64)}
    builds = {
        "copy_tile": lambda **o: (tiled.compile(copy_kernel(cols, dtype, tile=True), "cpu", **o),
                                  lambda y: (x, y)),
        "silu_and_mul": lambda **o: (tiled.compile(kernels.gated_activation(
            cols, dtype, "silu", **_launch_config("gated_activation", "cpu", N=cols)), "cpu",
            **o), lambda y: (x2, y)),
        "rms_norm": lambda **o: (tiled.compile(kernels.rms_norm(cols, dtype, 1e-6, blk_m=4),
                                               "cpu", **o), lambda y: (x, w, y)),
        "softmax": lambda **o: (tiled.compile(kernels.softmax(cols, dtype, blk_m=4), "cpu", **o),
                                lambda y: (x, y)),
        "layer_norm": lambda **o: (tiled.compile(kernels.layer_norm(cols, dtype, 1e-5, True,
                                                                    blk_m=4), "cpu", **o),
                                   lambda y: (x, w, b, y)),
    }
    copy = tiled.compile(copy_kernel(cols, dtype), "cpu", stream_stores=False)
    moved = 2 * x.nbytes
    out = {"outputs_mod_64": {k: v.ctypes.data % 64 for k, v in outputs.items()}, "ops": {}}
    for name, build in builds.items():
        (on, args), (off, _) = build(), build(stream_stores=False)
        op_bytes = x2.nbytes + x.nbytes if name == "silu_and_mul" else moved
        for yname, y in outputs.items():
            on(*args(y))
            first = y.copy()
            off(*args(y))
            assert np.array_equal(first.view(np.uint8), y.view(np.uint8)), (name, yname)
            times = {"copy": [], "streaming": [], "plain": []}
            calls = {"copy": lambda yy=y: copy(x, yy),
                     "streaming": lambda yy=y, k=on, a=args: k(*a(yy)),
                     "plain": lambda yy=y, k=off, a=args: k(*a(yy))}
            for _ in range(rounds):
                for k, call in calls.items():
                    times[k].append(_seconds(call))
            row = {}
            for k in ("streaming", "plain"):
                row[k] = {"best_ms": round(min(times[k]) * 1e3, 3),
                          "of_copy_median_of_rounds": round(statistics.median(
                              (op_bytes / t) / (moved / c)
                              for c, t in zip(times["copy"], times[k], strict=True)), 3)}
            row["copy_best_gbs"] = round(moved / min(times["copy"]) / 1e9, 2)
            row["plain_over_streaming_median"] = round(statistics.median(
                p / s for p, s in zip(times["plain"], times["streaming"], strict=True)), 3)
            out["ops"][f"{name}/{yname}"] = row
            on_row, off_row = row["streaming"], row["plain"]
            print(f"{dtype:8s} {name:10s} Y {yname:9s} streaming {on_row['best_ms']:6.2f} ms "
                  f"({on_row['of_copy_median_of_rounds']:.2f} of copy) plain "
                  f"{off_row['best_ms']:6.2f} ms ({off_row['of_copy_median_of_rounds']:.2f}) "
                  f"speedup {row['plain_over_streaming_median']:.2f}x", flush=True)
    return out


def main() -> None:
    rows_cols_main(__doc__, bench, ROOT / "benchmarks/results/cpu_stream_stores.json")


if __name__ == "__main__":
    main()
