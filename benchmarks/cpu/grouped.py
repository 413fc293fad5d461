"""tiled.ops.grouped_linear on CPU tensors against loops of torch's F.linear and of numpy's
float32 GEMM over the experts, same process, same threads.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/grouped.py [--tokens 128 512 2048]
        [--experts 8 --n 2048 --k 2048 --repeat 5] [--out benchmarks/results/cpu_grouped.json]

y[r] = x[r] @ w[e].T for the rows of expert e, x [T, K] and w [E, N, K] bfloat16 (float32
accumulation), tokens routed evenly (T / E rows per expert). For each token count: every
config of tiled.ops' grouped CPU space that takes it (tiled/ops/grouped.py's CPU_SPACE),
each compiled and timed by itself, then `tiled.ops.grouped_linear` as a user calls it (tuned
into a fresh cache, then timed). References in the same rounds (linear.py's method): a loop
of F.linear per expert on the bf16 tensors, and a loop of numpy float32 matmuls (OpenBLAS).
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


def bench_tokens(tokens: int, E: int, N: int, K: int, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F

    import tiled
    import tiled.ops as ops
    from tiled.ops.grouped import CPU_SPACE, GROUPED, _fits, _run, grouped_kernel, token_bucket

    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, K, generator=g).bfloat16()
    w = (torch.randn(E, N, K, generator=g) / K ** 0.5).bfloat16()
    bounds = [e * tokens // E for e in range(E + 1)]
    offsets = torch.tensor(bounds, dtype=torch.int32)
    x32 = x.float().numpy()
    w32t = [np.ascontiguousarray(w[e].float().numpy().T) for e in range(E)]
    want = np.concatenate([x32[bounds[e]:bounds[e + 1]] @ w32t[e] for e in range(E)])
    flop = 2.0 * tokens * N * K

    def check(y) -> float:
        err = float(np.abs(y.float().numpy() - want).max() / np.abs(want).max())
        assert err < 1e-2, (tokens, err)
        return err

    def torch_loop():
        for e in range(E):
            F.linear(x[bounds[e]:bounds[e + 1]], w[e])

    def numpy_loop():
        for e in range(E):
            np.matmul(x32[bounds[e]:bounds[e + 1]], w32t[e])

    refs = {"torch_F_linear_loop_bf16": torch_loop, "numpy_fp32_loop": numpy_loop}
    configs = []
    for cfg in (c for c in CPU_SPACE if _fits(c, tokens, E)):
        kernel = tiled.compile(grouped_kernel(tokens, E, N, K, "bfloat16", **cfg), "cpu")
        y = torch.empty(tokens, N, dtype=torch.bfloat16)

        def run(k=kernel, c=cfg, y=y):
            _run(k, c, [x, w.view(E * N, K), offsets, y])
        run()
        err = check(y)
        best = interleaved({"tiled": run, **refs}, repeat)
        configs.append({"config": cfg, "max_rel_err": err, **gflops(best, flop)})
        print(f"T={tokens:5d} {cfg}: {configs[-1]['gflops']}", flush=True)

    t0 = time.perf_counter()
    y = ops.grouped_linear(x, w, offsets)  # the first call tunes
    tune_s = time.perf_counter() - t0
    err = check(y)
    bucket = token_bucket(tokens, E, N, K, "bfloat16")
    chosen = next(t.config for (_, b), t in GROUPED.chosen.items() if b == bucket)
    best = interleaved({"tiled": lambda: ops.grouped_linear(x, w, offsets), **refs}, repeat)
    row = {"tokens": tokens, "E": E, "N": N, "K": K, "dtype": "bfloat16",
           "tuning_s": round(tune_s, 2), "chosen": chosen, "max_rel_err": err,
           **gflops(best, flop), "configs": configs}
    print(f"T={tokens:5d} tiled.ops.grouped_linear (tuned in {tune_s:.1f} s: {chosen}): "
          f"{row['gflops']}, {row['ratio']}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_grouped.json")
    args = p.parse_args()

    run_rows(args.out, "tiled-cpu-grouped-",
             lambda: [bench_tokens(t, args.experts, args.n, args.k, args.repeat)
                      for t in args.tokens])


if __name__ == "__main__":
    main()
