"""tiled.ops.linear on CPU tensors against torch's F.linear and numpy's float32 GEMM, same
process, same threads.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/linear.py [--tokens 1 4 16 64 256 1024]
        [--n 4096 --k 4096 --repeat 5] [--out benchmarks/results/cpu_linear.json]

y = x @ w.T with x [M, K] and w [N, K] in bfloat16 (float32 accumulation, bfloat16 y), for
each token count M: first every config of tiled.ops' CPU space that takes M
(tiled/ops/gemm.py's CPU_SPACE, each compiled and timed by itself), then `tiled.ops.linear`
as a user calls it: tuned by tiled.autotune into a fresh cache (the tuning's wall time and
its choice are recorded), then timed. The references, interleaved with the tiled calls (one
call each per round, after a pause: gemm.py's SETTLE_S): torch's F.linear on the same
bfloat16 tensors, and numpy's float32 matmul (OpenBLAS sgemm) of the same values in float32.
Every result is checked against the float32 product first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import gflops, interleaved, run_rows

ROOT = Path(__file__).resolve().parents[2]
def bench_tokens(M: int, N: int, K: int, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F

    import tiled
    import tiled.ops as ops
    from tiled.ops.gemm import CPU_SPACE, LINEAR, _fits, _run, linear_kernel, token_bucket

    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
    x32, w32t = x.float().numpy(), np.ascontiguousarray(w.float().numpy().T)
    want = x32 @ w32t
    y32 = np.empty_like(want)
    flop = 2.0 * M * N * K

    def check(y) -> float:
        err = float(np.abs(y.float().numpy() - want).max() / np.abs(want).max())
        assert err < 1e-2, (M, err)  # a bfloat16 output: 2^-8 of the largest value
        return err

    refs = {"torch_F_linear_bf16": lambda: F.linear(x, w),
            "numpy_fp32": lambda: np.matmul(x32, w32t, out=y32)}
    configs = []
    for cfg in (c for c in CPU_SPACE if _fits(c, M)):
        kernel = tiled.compile(linear_kernel(M, N, K, "bfloat16", "bfloat16", **cfg), "cpu")
        y = torch.empty(M, N, dtype=torch.bfloat16)
        def run(k=kernel, c=cfg, y=y):
            _run(k, c, [x, w, y])
        run()
        err = check(y)
        best = interleaved({"tiled": run, **refs}, repeat)
        configs.append({"config": cfg, "max_rel_err": err, **gflops(best, flop)})
        print(f"M={M:5d} {cfg}: {configs[-1]['gflops']}", flush=True)

    t0 = time.perf_counter()
    y = ops.linear(x, w)  # the first call tunes
    tune_s = time.perf_counter() - t0
    err = check(y)
    bucket = token_bucket(M, N, K, "bfloat16", "bfloat16")
    chosen = next(t.config for (_, b), t in LINEAR.chosen.items() if b == bucket)
    best = interleaved({"tiled": lambda: ops.linear(x, w), **refs}, repeat)
    row = {"M": M, "N": N, "K": K, "dtype": "bfloat16", "tuning_s": round(tune_s, 2),
           "chosen": chosen, "max_rel_err": err, **gflops(best, flop), "configs": configs}
    print(f"M={M:5d} tiled.ops.linear (tuned in {tune_s:.1f} s: {chosen}): {row['gflops']}, "
          f"{row['ratio']}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_linear.json")
    args = p.parse_args()

    run_rows(args.out, "tiled-cpu-linear-",
             lambda: [bench_tokens(m, args.n, args.k, args.repeat) for m in args.tokens])


if __name__ == "__main__":
    main()
