"""tiled.ops' paged decode attention kernel on the cpu backend: bandwidth over the KV cache
beside a plain copy of as many bytes, same process, same threads.

    python benchmarks/cpu/paged.py [--batch 8 --heads 32 --kv-heads 8 --dim 128
        --block-size 16 --blocks 128 --repeat 7] [--out benchmarks/results/cpu_paged.json]

bf16 q [B, H, D] over bf16 caches of B sequences of `blocks` x `block_size` tokens each
(tiled/ops/paged.py's cache_problem: random distinct pages), one kernel per config: the
op's CPU space (paged.py's CPU_SPACE), wider token steps and the 16-row tile. GB/s count the cache
bytes read (keys and values); the reference is torch's copy_ of as many bytes (read and
written, so its GB/s count both). Outputs are checked against the first config's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import blas_threads, start, write_result

ROOT = Path(__file__).resolve().parents[2]
# Wider token steps, and the 16-row tile (one MMA's, the CPU space's until 2026-12-04) that a
# group of 4 heads fills a quarter of.
EXTRA = [*({"BN": bn, "threads": 32, "splits": 1, "rows": r}
           for bn in (32, 64, 128) for r in (16, "group")),
         *({"BN": 16, "threads": 32, "splits": s, "rows": 16} for s in (1, 2))]


def best_s(fn, repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_paged.json")
    a = p.parse_args()

    import torch

    import tiled
    from tiled import config
    from tiled.ops import paged

    threads = blas_threads()
    torch.set_num_threads(threads)
    head = start(sys.argv)
    B, H, KVH, D, bs, MB = a.batch, a.heads, a.kv_heads, a.dim, a.block_size, a.blocks
    args = paged.cache_problem(B, H, KVH, D, bs, "bfloat16", "bfloat16", MB)
    cache_bytes = 2 * B * MB * bs * KVH * D * 2
    src = torch.empty(cache_bytes // 2, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    rows, ref = [], None
    with config.override(cpu_threads=threads):
        copy_gbs = 2 * cache_bytes / best_s(lambda: dst.copy_(src), a.repeat) / 1e9
        print(f"copy {copy_gbs:.1f} GB/s", flush=True)
        for cfg in paged.CPU_SPACE + EXTRA:
            kernel = tiled.compile(paged.decode_kernel(B, H, KVH, D, bs, "bfloat16", "bfloat16",
                                                       MB, D ** -0.5, **cfg), "cpu")
            out = paged._run(kernel, cfg, args).float().clone()
            ref = out if ref is None else ref
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (cfg, err)
            t = best_s(lambda k=kernel, c=cfg: paged._run(k, c, args), a.repeat)
            rows.append({"config": cfg, "in_space": cfg in paged.CPU_SPACE, "ms": round(t * 1e3, 3),
                         "cache_gbs": round(cache_bytes / t / 1e9, 2),
                         "of_copy": round(cache_bytes / t / 1e9 / copy_gbs, 3),
                         "rel_err_vs_first": err})
            print(f"{cfg}: {rows[-1]['cache_gbs']} GB/s of cache read "
                  f"({rows[-1]['of_copy']} of copy)", flush=True)
    write_result(a.out, head, {"threads": threads, "shape": {
        "B": B, "H": H, "KVH": KVH, "D": D, "block_size": bs, "blocks": MB},
        "cache_bytes": cache_bytes, "copy_gbs": round(copy_gbs, 2), "rows": rows})


if __name__ == "__main__":
    main()
