"""The sm_90a warp-specialized GEMM (examples/gemm.py's kernel, compiled for cuda:sm_90a) against
cuBLAS (torch.matmul) and a Triton GEMM, on the H200.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/hopper_gemm.py build --out .gpu/hopper
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/hopper_gemm.py run --bundle .gpu/hopper --out $OUT/hopper_gemm.json

`build` compiles one kernel per (dtype, tile config) with symbolic M, N, K and records each cold
compile time; `run` checks every (kernel, shape) against torch (outputs poisoned with NaN first,
compared with a float32 torch reference) and times the kernels, cuBLAS and the Triton GEMM with
triton.testing.do_bench in the same process.
"""


import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_bundle, load_kernel, machine, main, smoke_in_child

# name -> (block_M, block_N, num_stages, threads). BK is 64 (one 128-byte swizzle row).
# (Configs ending in c2, two-CTA clusters with multicast TMA, were the retired whole-kernel
# GEMM path's option `cluster=2`: results/hopper_gemm_h200_cluster.json.)
CONFIGS = {
    "128x256": (128, 256, 4, 256),
    "256x128": (256, 128, 4, 256),
    "128x128": (128, 128, 6, 128),
    "64x128": (64, 128, 8, 128),
}
DTYPES = ("float16", "bfloat16")
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (16, 14336, 4096),
          (32, 14336, 4096), (64, 14336, 4096), (128, 14336, 4096), (1000, 1000, 1000),
          (4095, 4104, 4096)]


def variant_kernels():
    """Kernels that check the path's generality (numerics only): B given as N x K (K-major B),
    a float32 output (the generic fragment epilogue) and a fused epilogue (bias + ReLU computed
    on the accumulator in a T.Parallel nest before the store)."""
    import tiled
    import tiled.lang as T

    M, N, K = T.dyn("M"), T.dyn("N"), T.dyn("K")

    def make(b_nk: bool, out_dtype: str, fused: bool):
        @tiled.kernel
        def gemm_variant(A: T.Tensor((M, K), "bfloat16"),
                         B: T.Tensor((N, K) if b_nk else (K, N), "bfloat16"),
                         bias: T.Tensor((N,), "float32"), C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(T.ceildiv(N, 256), T.ceildiv(M, 128), threads=256) as (bx, by):
                A_s = T.alloc_shared((128, 64), "bfloat16")
                B_s = T.alloc_shared((256, 64) if b_nk else (64, 256), "bfloat16")
                acc = T.alloc_fragment((128, 256), "float32")
                T.clear(acc)
                for k in T.Pipelined(T.ceildiv(K, 64), num_stages=4):
                    T.copy(A[by * 128, k * 64], A_s)
                    if b_nk:
                        T.copy(B[bx * 256, k * 64], B_s)
                    else:
                        T.copy(B[k * 64, bx * 256], B_s)
                    T.gemm(A_s, B_s, acc, transpose_B=b_nk)
                if fused:
                    for i, j in T.Parallel(128, 256):
                        acc[i, j] = T.max(acc[i, j] + bias[bx * 256 + j], 0.0)
                T.copy(acc, C[by * 128, bx * 256])

        return gemm_variant

    return {"variant_nt_bf16": make(True, "bfloat16", False),
            "variant_out_fp32": make(False, "float32", False),
            "variant_bias_relu": make(False, "bfloat16", True)}


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import gemm

    import tiled.lang as T

    out.mkdir(parents=True, exist_ok=True)
    index, variants = {}, {}
    only = [x for x in os.environ.get("TILED_GEMM_CONFIGS", "").split(",") if x]
    for dtype in DTYPES:
        for cfg, (bm, bn, stages, threads) in CONFIGS.items():
            if only and cfg not in only:
                continue
            name = f"ws_{dtype}_{cfg}"
            kernel = gemm.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), bm, bn, 64, stages, dtype,
                                 threads=threads)
            compiled, seconds = compile_into(out, name, kernel)
            index[name] = {"dtype": dtype, "config": cfg, "cold_compile_s": round(seconds, 3),
                           "stages": {k: round(v, 3) for k, v in compiled.stages.items()},
                           "threads": compiled.manifest.block[0],
                           "dynamic_smem_bytes": compiled.manifest.dynamic_smem_bytes}
            print(f"{name}: {seconds:.2f} s", flush=True)
    for name, kernel in variant_kernels().items():
        compiled, seconds = compile_into(out, name, kernel)
        variants[name] = {"cold_compile_s": round(seconds, 3),
                          "warp_specialized": compiled.manifest.block[0] == 384}
        print(f"{name}: {seconds:.2f} s, warp specialized: {variants[name]['warp_specialized']}",
              flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/hopper_gemm.py build --out {out}",
        "machine": machine(),
        "kernels": index, "variants": variants}, indent=1))


# -- on the GPU machine ------------------------------------------------------------------------

def triton_gemm():
    """A Triton GEMM (C = A @ B, row-major, fp32 accumulate), autotuned over a few configs."""
    import triton
    import triton.language as tl

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "G": 8}, num_warps=w, num_stages=s)
               for bm, bn, bk, w, s in [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4),
                                        (64, 128, 64, 4, 4), (128, 128, 64, 8, 3),
                                        (64, 256, 64, 4, 4)]]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        group = pid // (G * tiles_n)
        first = group * G
        rows = min(tiles_m - first, G)
        tm = first + (pid % (G * tiles_n)) % rows
        tn = (pid % (G * tiles_n)) // rows
        rm = tm * BM + tl.arange(0, BM)
        rn = tn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ka = k0 + rk
            x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak,
                        mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
            y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn,
                        mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(a, b, c):
        M, K = a.shape
        N = b.shape[1]
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1))

    return run


def smoke(bundle: Path) -> None:
    """One small launch of every kernel (run in a child with a timeout: a hang costs seconds)."""
    import torch


    for manifest in sorted(bundle.glob("ws_*.manifest.json")):
        name = manifest.name.removesuffix(".manifest.json")
        k = load_kernel(bundle, name)
        dt = getattr(torch, json.loads(manifest.read_text())["params"][0]["dtype"])
        a = torch.randn(300, 256, device="cuda", dtype=dt)
        b = torch.randn(256, 264, device="cuda", dtype=dt)
        c = torch.full((300, 264), float("nan"), device="cuda", dtype=dt)
        k(a, b, c)
        torch.cuda.synchronize()
        err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
        print(f"smoke {name}: rel err {err:.2e}", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    import triton
    from triton.testing import do_bench


    smoke_in_child(__file__, bundle, 240)
    index, kernels = load_bundle(bundle)
    tri = triton_gemm()
    rows = []
    for dtype in DTYPES:
        dt = getattr(torch, dtype)
        for M, N, K in SHAPES:
            torch.manual_seed(0)
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b = torch.randn(K, N, device="cuda", dtype=dt)
            ref = a.float() @ b.float()
            flop = 2 * M * N * K
            tflops = lambda ms, flop=flop: flop / ms / 1e9  # noqa: E731
            row = {"dtype": dtype, "M": M, "N": N, "K": K}
            c_ref = torch.matmul(a, b)
            row["cublas_err"] = ((c_ref.float() - ref).norm() / ref.norm()).item()
            row["cublas_tflops"] = tflops(do_bench(lambda: torch.matmul(a, b)))  # noqa: B023
            c_tri = torch.empty(M, N, device="cuda", dtype=dt)
            tri(a, b, c_tri)
            row["triton_err"] = ((c_tri.float() - ref).norm() / ref.norm()).item()
            row["triton_tflops"] = tflops(do_bench(lambda: tri(a, b, c_tri)))  # noqa: B023
            row["tiled"] = {}
            for name, meta in index["kernels"].items():
                if meta["dtype"] != dtype:
                    continue
                k = kernels[name]
                c = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                k(a, b, c)
                torch.cuda.synchronize()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                ms = do_bench(lambda: k(a, b, c))  # noqa: B023
                row["tiled"][meta["config"]] = {"err": err, "tflops": tflops(ms),
                                                "nan": bool(torch.isnan(c).any().item())}
            best = max(row["tiled"].items(), key=lambda kv: kv[1]["tflops"])
            row["tiled_best"] = {"config": best[0], "tflops": best[1]["tflops"]}
            row["ratio_to_cublas"] = best[1]["tflops"] / row["cublas_tflops"]
            row["ratio_to_triton"] = best[1]["tflops"] / row["triton_tflops"]
            rows.append(row)
            print(f"{dtype} {M}x{N}x{K}: cuBLAS {row['cublas_tflops']:.0f}, Triton "
                  f"{row['triton_tflops']:.0f}, tiled {best[1]['tflops']:.0f} ({best[0]}) "
                  f"= {row['ratio_to_cublas']:.2f}x cuBLAS; errs "
                  + ", ".join(f"{c}:{v['err']:.1e}" for c, v in row["tiled"].items()),
                  flush=True)
    fair = interleaved(kernels, index, rows)
    variants = check_variants(bundle, index.get("variants", {}))
    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/hopper_gemm.py run --bundle {bundle} --out {out}",
        "build": index, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
        "variants": variants, "interleaved": fair}, indent=1))


def interleaved(kernels: dict, index: dict, rows: list) -> list:
    """The square shapes again, cuBLAS and the best tiled config only, timed alternately.

    The first pass times each shape's kernels one after another (cuBLAS first), and the
    H200 runs these GEMMs at its 700 W power cap, where the clock falls as the chip heats:
    whoever runs later in a sequence runs slower. Here (1) burst: do_bench of cuBLAS and
    tiled alternated 5 times, medians; (2) sustained: each run back to back for 2 s after
    the other, at the steady clock, with the SM clock and power nvidia-smi reports."""
    import torch
    from gemm_power_probe import measure
    from triton.testing import do_bench

    out = []
    for row in rows:
        if (row["M"], row["N"], row["K"]) not in ((4096, 4096, 4096), (8192, 8192, 8192)):
            continue
        M, N, K, dtype = row["M"], row["N"], row["K"], row["dtype"]
        dt = getattr(torch, dtype)
        k = kernels[f"ws_{dtype}_{row['tiled_best']['config']}"]
        torch.manual_seed(0)
        a = torch.randn(M, K, device="cuda", dtype=dt)
        b = torch.randn(K, N, device="cuda", dtype=dt)
        c = torch.empty(M, N, device="cuda", dtype=dt)
        c_ref = torch.empty(M, N, device="cuda", dtype=dt)
        cublas = lambda a=a, b=b, c_ref=c_ref: torch.matmul(a, b, out=c_ref)  # noqa: E731
        tiled = lambda k=k, a=a, b=b, c=c: k(a, b, c)  # noqa: E731
        flop = 2 * M * N * K
        burst = {"cublas": [], "tiled": []}
        for _ in range(5):
            burst["cublas"].append(flop / do_bench(cublas) / 1e9)
            burst["tiled"].append(flop / do_bench(tiled) / 1e9)
        med = {x: statistics.median(v) for x, v in burst.items()}
        sustained = {x: measure(fn, flop) for x, fn in (("cublas", cublas), ("tiled", tiled))}
        r = {"dtype": dtype, "M": M, "N": N, "K": K, "config": row["tiled_best"]["config"],
             "burst_tflops": burst, "burst_median": med,
             "burst_ratio": med["tiled"] / med["cublas"], "sustained": sustained,
             "sustained_ratio": sustained["tiled"]["tflops"] / sustained["cublas"]["tflops"]}
        out.append(r)
        print(f"interleaved {dtype} {M}^3 ({r['config']}): burst cuBLAS {med['cublas']:.0f} "
              f"tiled {med['tiled']:.0f} = {r['burst_ratio']:.3f}x; sustained cuBLAS "
              f"{sustained['cublas']['tflops']:.0f} ({sustained['cublas']['sm_clock_mhz']:.0f} "
              f"MHz) tiled {sustained['tiled']['tflops']:.0f} "
              f"({sustained['tiled']['sm_clock_mhz']:.0f} MHz) = {r['sustained_ratio']:.3f}x",
              flush=True)
    return out



def check_variants(bundle: Path, variants: dict) -> dict:
    import torch


    out = {}
    for name, meta in variants.items():
        k = load_kernel(bundle, name)
        for M, N, K in [(1000, 1000, 1000), (4096, 4096, 4096)]:
            torch.manual_seed(0)
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
            bias = torch.randn(N, device="cuda", dtype=torch.float32)
            ref = a.float() @ b.float()
            if name == "variant_bias_relu":
                ref = torch.relu(ref + bias)
            out_dt = torch.float32 if name == "variant_out_fp32" else torch.bfloat16
            c = torch.full((M, N), float("nan"), device="cuda", dtype=out_dt)
            k(a, b.t().contiguous() if name == "variant_nt_bf16" else b, bias, c)
            torch.cuda.synchronize()
            err = ((c.float() - ref).norm() / ref.norm()).item()
            out[f"{name} {M}x{N}x{K}"] = {"err": err, "nan": bool(torch.isnan(c).any().item()),
                                          **meta}
            print(f"{name} {M}x{N}x{K}: rel err {err:.1e}", flush=True)
    return out


if __name__ == "__main__":
    main(build, run, smoke, ".gpu/hopper")
