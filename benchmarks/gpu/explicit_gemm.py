"""The explicit path's hand-scheduled GEMM (examples/gemm_ws_explicit.py: T.ws producer /
consumer warpgroups, mbarriers, TMA) on the H200: numerics against torch, time against
cuBLAS (torch.matmul).

Here (the CPU machine, with TVM):
    python benchmarks/gpu/explicit_gemm.py build --out .gpu/explicit
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/explicit_gemm.py run --bundle .gpu/explicit --out $OUT/explicit.json

`build` compiles one kernel per (dtype, stages, block_K) with symbolic M, N, K: the example's
config (block_K 64) and a 128-wide K tile (two swizzled K panels per stage: each T.gemm's wgmma
group, waited for before the stage is released, then holds twice the work). `run` first
launches each kernel once in a child process with a timeout (a barrier protocol bug hangs,
and must cost seconds, not the call), then checks every (kernel, shape) against a float32 torch
reference (outputs poisoned with NaN first; shapes include ragged tails) and times kernel and
cuBLAS.
A kernel that fails to launch or check is recorded with its error, and the others still run.
TMA needs rows of a multiple of 16 bytes, so N and K stay multiples of 8 here.
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_bundle, machine, main, smoke_in_child

DTYPES = ("float16", "bfloat16")
CONFIGS = ((3, 64), (4, 64), (3, 128))  # (stages, block_K)
SHAPES = [(1000, 1000, 1000), (4095, 4104, 4096), (300, 264, 256), (4096, 4096, 4096),
          (8192, 8192, 8192), (64, 14336, 4096)]
TOLERANCE = 1e-2  # relative Frobenius error against the float32 reference


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import gemm_ws_explicit

    import tiled.lang as T

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dtype in DTYPES:
        for stages, block_K in CONFIGS:
            name = f"explicit_{dtype}_s{stages}" + (f"_k{block_K}" if block_K != 64 else "")
            kernel = gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), stages=stages,
                                             block_K=block_K, dtype=dtype)
            compiled, seconds = compile_into(out, name, kernel)
            index[name] = {"dtype": dtype, "stages": stages, "block_K": block_K,
                           "cold_compile_s": round(seconds, 3),
                           "threads": compiled.manifest.block[0],
                           "dynamic_smem_bytes": compiled.manifest.dynamic_smem_bytes}
            print(f"{name}: {seconds:.2f} s", flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/explicit_gemm.py build --out {out}",
        "machine": machine(), "kernels": index}, indent=1))


# -- on the GPU machine ------------------------------------------------------------------------

def rel_err(c, ref) -> float:
    return ((c.float() - ref).norm() / ref.norm()).item()


def smoke(bundle: Path) -> None:
    """One small ragged launch of every kernel (run in a child with a timeout)."""
    import torch

    index, kernels = load_bundle(bundle)
    for name, meta in index["kernels"].items():
        dt = getattr(torch, meta["dtype"])
        a = torch.randn(300, 256, device="cuda", dtype=dt)
        b = torch.randn(256, 264, device="cuda", dtype=dt)
        c = torch.full((300, 264), float("nan"), device="cuda", dtype=dt)
        kernels[name](a, b, c)
        torch.cuda.synchronize()
        print(f"smoke {name}: rel err {rel_err(c, a.float() @ b.float()):.2e}", flush=True)


def bench_ms(fn) -> float:
    """Milliseconds per call: triton's do_bench where present, else CUDA events."""
    try:
        from triton.testing import do_bench
    except ImportError:
        import torch

        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 20
    return do_bench(fn)


def check_and_time(kernel, a, b, ref, dt) -> dict:
    import torch

    c = torch.full(ref.shape, float("nan"), device="cuda", dtype=dt)
    try:
        kernel(a, b, c)
        torch.cuda.synchronize()
    except Exception as e:  # recorded: one kernel's launch error must not hide the others
        return {"error": f"{type(e).__name__}: {e}"}
    err = rel_err(c, ref)
    out = {"err": err, "nan": bool(torch.isnan(c).any().item()), "ok": err < TOLERANCE}
    M, K = a.shape
    out["tflops"] = 2 * M * ref.shape[1] * K / bench_ms(lambda: kernel(a, b, c)) / 1e9
    return out


def run(bundle: Path, out: Path) -> None:
    import torch

    smoke_in_child(__file__, bundle, 240)
    index, kernels = load_bundle(bundle)
    rows = []
    for dtype in DTYPES:
        dt = getattr(torch, dtype)
        for M, N, K in SHAPES:
            torch.manual_seed(0)
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b = torch.randn(K, N, device="cuda", dtype=dt)
            ref = a.float() @ b.float()
            row = {"dtype": dtype, "M": M, "N": N, "K": K,
                   "cublas_tflops": 2 * M * N * K / bench_ms(lambda: torch.matmul(a, b)) / 1e9,  # noqa: B023
                   "tiled": {}}
            for name, meta in index["kernels"].items():
                if meta["dtype"] == dtype:
                    row["tiled"][name] = check_and_time(kernels[name], a, b, ref, dt)
            timed = [(n, r["tflops"]) for n, r in row["tiled"].items() if r.get("ok")]
            if timed:
                best = max(timed, key=lambda x: x[1])
                row["best"] = {"kernel": best[0], "tflops": best[1],
                               "ratio_to_cublas": best[1] / row["cublas_tflops"]}
            rows.append(row)
            print(f"{dtype} {M}x{N}x{K}: cuBLAS {row['cublas_tflops']:.0f} TFLOP/s; "
                  + ", ".join(f"{n}: " + (f"{r['tflops']:.0f} TFLOP/s err {r['err']:.1e}"
                                          if "tflops" in r else r["error"])
                              for n, r in row["tiled"].items()), flush=True)
    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/explicit_gemm.py run --bundle {bundle} --out {out}",
        "build": index, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
        "all_ok": all(r.get("ok") for row in rows for r in row["tiled"].values())}, indent=1))


if __name__ == "__main__":
    main(build, run, smoke, ".gpu/explicit")
