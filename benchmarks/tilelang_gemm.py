"""TileLang 0.1.15 compiling its own GEMM for sm_90a, cold, in this process; prints one JSON
object. Run by cold_compile.py with TileLang's venv python (TileLang bundles its own TVM fork,
so it cannot share an interpreter with tiled):

    /tmp/tl-venv/bin/python benchmarks/tilelang_gemm.py --size 1024

The GEMM is the one examples/gemm.py writes in tiled (fp16 in, fp32 accumulate, 128x128x32
tiles, 3 stages, 128 threads). TileLang's caches (kernel and CUDA binary) are turned off with
TILELANG_DISABLE_CACHE=1 and pointed at a fresh directory with TILELANG_CACHE_DIR, both set
before `import tilelang` (its env module reads them at import). nvcc's share is timed by wrapping
`tilelang.contrib.nvcc.compile_cuda`, which its CUDA backend calls through the module attribute.
No GPU is needed: the target is a dict, {"kind": "cuda", "arch": "sm_90a"}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=1024, help="M = N = K")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--repeat", type=int, default=2,
                   help="compiles in this process; the first one is cold in every sense")
    p.add_argument("--dump-source", metavar="FILE", help="write the generated CUDA C++ here")
    args = p.parse_args()
    cache_dir = tempfile.mkdtemp(prefix="tilelang-cache-")
    os.environ["TILELANG_CACHE_DIR"] = cache_dir
    os.environ["TILELANG_DISABLE_CACHE"] = "1"
    os.environ["TILELANG_PRINT_ON_COMPILATION"] = "0"
    try:
        out = run(args)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(json.dumps(out))


def run(args) -> dict:
    t0 = time.perf_counter()
    import tilelang
    import tilelang.language as T
    from tilelang.contrib import nvcc

    import_s = time.perf_counter() - t0
    nvcc_calls: list[float] = []
    compile_cuda = nvcc.compile_cuda

    def timed_compile_cuda(*a, **kw):
        t = time.perf_counter()
        try:
            return compile_cuda(*a, **kw)
        finally:
            nvcc_calls.append(time.perf_counter() - t)

    nvcc.compile_cuda = timed_compile_cuda
    n = args.size
    block_M, block_N, block_K, stages = 128, 128, 32, 3
    dtype, accum = "float16", "float32"

    t0 = time.perf_counter()

    @T.prim_func
    def gemm(A: T.Tensor((n, n), dtype), B: T.Tensor((n, n), dtype),
             C: T.Tensor((n, n), dtype)):
        with T.Kernel(T.ceildiv(n, block_N), T.ceildiv(n, block_M), threads=128) as (bx, by):
            a_tile = T.alloc_shared((block_M, block_K), dtype)
            b_tile = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), accum)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(n, block_K), num_stages=stages):
                T.copy(A[by * block_M, k * block_K], a_tile)
                T.copy(B[k * block_K, bx * block_N], b_tile)
                T.gemm(a_tile, b_tile, acc)
            T.copy(acc, C[by * block_M, bx * block_N])

    define_s = time.perf_counter() - t0
    target = {"kind": "cuda", "arch": args.arch}
    compiles = []
    for _ in range(args.repeat):
        nvcc_calls.clear()
        t0 = time.perf_counter()
        kernel = tilelang.compile(gemm, out_idx=[2], target=target)
        total = time.perf_counter() - t0
        nvcc_s = sum(nvcc_calls)
        compiles.append({"total_s": total, "nvcc_s": nvcc_s, "nvcc_calls": len(nvcc_calls),
                         "lower_and_rest_s": total - nvcc_s})
    source = kernel.get_kernel_source()
    if args.dump_source:
        with open(args.dump_source, "w") as f:
            f.write(source)
    return {
        "tilelang": tilelang.__version__,
        "python": sys.version.split()[0],
        "size": n, "arch": args.arch,
        "cache_disabled": not tilelang.is_cache_enabled(),
        "import_s": import_s,
        "define_s": define_s,
        "compiles": compiles,
        "nvcc": nvcc.get_nvcc_compiler(),
        "cuda_source_chars": len(source),
        "source_uses": {m: m in source for m in ("tma_load", "wgmma", "mbarrier", "cp_async",
                                                 "__launch_bounds__(256")},
    }


if __name__ == "__main__":
    main()
