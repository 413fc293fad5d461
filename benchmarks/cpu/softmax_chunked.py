"""Softmax over 4096 x 4096 float32 on the cpu backend, written two ways, beside a plain copy
in the same process.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/softmax_chunked.py [--repeat 15]
        [--out benchmarks/results/cpu_softmax_chunked.json]

`rows`: tiled.ops' kernel (its CPU launch config: the row's max pass, then the exponentials on
the cached row, then the normalizing store). `chunked`: one pass over the row in chunks of
`chunk` columns that takes each chunk's max and its exponentials against it while the row
streams in from memory, keeping the chunk maxes and sums; the row's max, sum and each chunk's
rescale factor follow from those, and one store pass writes the row. One exponential per
element either way; the chunked form issues them during the DRAM read instead of after it.
Also the chunked kernel with the exponential replaced by its argument (`chunked_no_exp`: what
the memory traffic and the rest cost). Timed in rounds (copy, rows, chunked, ...), medians of
the per-round ratios to the copy.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, start, write_result
from membound import copy_kernel

ROOT = Path(__file__).resolve().parents[2]


def chunked_softmax(N: int, chunk: int = 64, exp: bool = True):
    import tiled
    import tiled.lang as T

    M = T.dyn("M")
    C = N // chunk
    log2e = math.log2(math.e)

    @tiled.kernel
    def softmax_chunked(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(M, threads=128) as bx:
            e = T.alloc_fragment((1, N), "float32")
            xc = T.alloc_fragment((1, chunk), "float32")
            m1 = T.alloc_fragment((1,), "float32")
            s1 = T.alloc_fragment((1,), "float32")
            cm = T.alloc_fragment((1, C), "float32")
            cs = T.alloc_fragment((1, C), "float32")
            rm = T.alloc_fragment((1,), "float32")
            rs = T.alloc_fragment((1,), "float32")
            for c in T.serial(C):
                T.copy(X[bx, c * chunk], xc)
                T.reduce_max(xc, m1, dim=1)
                for i, j in T.Parallel(1, chunk):
                    v = xc[i, j] * log2e - m1[i] * log2e
                    xc[i, j] = T.exp2(v) if exp else v
                    e[i, c * chunk + j] = xc[i, j]
                T.reduce_sum(xc, s1, dim=1)
                for i in T.Parallel(1):
                    cm[i, c] = m1[i]
                    cs[i, c] = s1[i]
            T.reduce_max(cm, rm, dim=1)
            for i, c in T.Parallel(1, C):
                cm[i, c] = T.exp2(cm[i, c] * log2e - rm[i] * log2e)
                cs[i, c] = cs[i, c] * cm[i, c]
            T.reduce_sum(cs, rs, dim=1)
            for i, c in T.Parallel(1, C):
                cm[i, c] = cm[i, c] / rs[i]
            for i, c, j in T.Parallel(1, C, chunk):
                Y[bx + i, c * chunk + j] = e[i, c * chunk + j] * cm[i, c]

    return softmax_chunked


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--out", type=Path,
                   default=ROOT / "benchmarks/results/cpu_softmax_chunked.json")
    args = p.parse_args()

    import tiled
    from tiled import config
    from tiled.ops import _launch_config, kernels

    threads = blas_threads()
    head = start(sys.argv)
    rows, cols = args.rows, args.cols
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32) * 2
    y = np.empty_like(x)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    with config.override(cpu_threads=threads):
        kernels_ = {
            "copy": tiled.compile(copy_kernel(cols, "float32"), "cpu", stream_stores=False),
            "rows": tiled.compile(kernels.softmax(cols, "float32",
                                                  **_launch_config("softmax", "cpu")), "cpu"),
            "chunked": tiled.compile(chunked_softmax(cols, args.chunk), "cpu"),
            "chunked_no_exp": tiled.compile(chunked_softmax(cols, args.chunk, exp=False), "cpu"),
        }
        errs = {}
        for name in ("rows", "chunked"):
            kernels_[name](x, y)
            errs[name] = float(np.abs(y - want).max() / want.max())
            assert errs[name] < 1e-5, (name, errs[name])
        times = {k: [] for k in kernels_}
        for _ in range(args.repeat):
            for name, k in kernels_.items():
                t = time.perf_counter()
                k(x, y)
                times[name].append(time.perf_counter() - t)
    moved = 2 * x.nbytes
    out = {}
    for name, ts in times.items():
        of_copy = statistics.median(c / t for c, t in zip(times["copy"], ts, strict=True))
        out[name] = {"ms_median": round(statistics.median(ts) * 1e3, 3),
                     "ms_best": round(min(ts) * 1e3, 3),
                     "gbs_best": round(moved / min(ts) / 1e9, 2),
                     "of_copy_median_of_rounds": round(of_copy, 3)}
        print(f"{name:15s} {out[name]}", flush=True)
    write_result(args.out, head, {"threads": threads, "rows": rows, "cols": cols,
                                  "chunk": args.chunk, "max_rel_err": errs, "results": out})


if __name__ == "__main__":
    main()
