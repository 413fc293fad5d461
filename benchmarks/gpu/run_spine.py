"""Runs on the GPU machine: launches the bundle's kernels through tiled.runtime (no TVM there),
checks them against torch, times GEMM 4096^3 fp16 against torch.matmul (cuBLAS) in the same run,
and writes a JSON result.

    python benchmarks/gpu/run_spine.py --bundle .gpu/bundle --out $OUT/spine.json
"""

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

import op_kernels
import torch
from bundle_cli import load_kernel


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(results, name, ok, err, tol, extra=""):
    results["checks"].append({"kernel": name, "rel_err": err, "tol": tol, "pass": bool(ok)})
    print(f"{'PASS' if ok else 'FAIL'} {name} rel_err={err:.2e} tol={tol:.0e} {extra}", flush=True)


def numerics(bundle, results):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dtype):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dtype)

    for M in (1000, 1024, 17):
        a, b = randn(M, 1024, dtype=torch.float16), randn(1024, 1024, dtype=torch.float16)
        c = torch.full((M, 1024), float("nan"), device=dev, dtype=torch.float16)
        load_kernel(bundle, "gemm_fp16_symM")(a, b, c)
        torch.cuda.synchronize()
        err = rel_err(c, a.double() @ b.double())
        check(results, f"gemm_fp16_symM[M={M}]", err < 2e-3, err, 2e-3)
    for name, dt, odt, tol in (("gemm_fp16_out16_1000", torch.float16, torch.float16, 2e-3),
                               ("gemm_bf16_1000", torch.bfloat16, torch.float32, 1e-3),
                               ("gemm_fp32_1000", torch.float32, torch.float32, 1e-5)):
        a, b = randn(1000, 1000, dtype=dt), randn(1000, 1000, dtype=dt)
        c = torch.full((1000, 1000), float("nan"), device=dev, dtype=odt)
        load_kernel(bundle, name)(a, b, c)
        torch.cuda.synchronize()
        err = rel_err(c, a.double() @ b.double())
        check(results, name, err < tol, err, tol)
    x = randn(1003, 256, dtype=torch.float32) * 4
    y = torch.full_like(x, float("nan"))
    load_kernel(bundle, "softmax_256")(x, y)
    torch.cuda.synchronize()
    err = rel_err(y, torch.softmax(x.double(), dim=1))
    check(results, "softmax_256[M=1003]", err < 1e-5, err, 1e-5)
    a, b = randn(100_003, dtype=torch.float32), randn(100_003, dtype=torch.float32)
    c = torch.full_like(a, float("nan"))
    load_kernel(bundle, "vadd")(a, b, c)
    torch.cuda.synchronize()
    err = rel_err(c, a + b)
    check(results, "vadd[n=100003]", err == 0, err, 0)
    ops(bundle, results, randn)


def ops(bundle, results, randn):
    """Every DSL op, through op_kernels' kernels and torch references."""
    x = randn(29, 64, dtype=torch.float32)
    out = torch.full((29, 4), float("nan"), device="cuda")
    total = torch.zeros(1, device="cuda")
    load_kernel(bundle, "op_stats")(x, out, total, 0.5, 5)
    torch.cuda.synchronize()
    ref, count = op_kernels.stats_reference(torch, x, 0.5, 5)
    err = rel_err(out, ref)
    ok = err < 1e-5 and total.item() == count
    check(results, "op_stats[M=29]", ok, err, 1e-5, f"total={total.item()} want={count}")
    x = randn(1001, 39, dtype=torch.float32)
    y = torch.full_like(x, float("nan"))
    hist = torch.zeros(16, device="cuda", dtype=torch.int32)
    load_kernel(bundle, "op_copies")(x, y, hist)
    torch.cuda.synchronize()
    err = rel_err(y, 2 * x + 1)
    want = op_kernels.copies_histogram(1001)
    ok = err < 1e-6 and hist.tolist() == want
    check(results, "op_copies[M=1001]", ok, err, 1e-6, f"hist_ok={hist.tolist() == want}")
    M, N, K = 256, 192, 160
    for name in sorted(n.removesuffix(".cubin") for n in
                       (p.name for p in bundle.glob("op_gemm_*.cubin"))):
        ta, tb = "ta1" in name, "tb1" in name
        if "int8" in name:
            a = torch.randint(-8, 8, (K, M) if ta else (M, K), device="cuda", dtype=torch.int8)
            b = torch.randint(-8, 8, (N, K) if tb else (K, N), device="cuda", dtype=torch.int8)
            c = torch.full((M, N), -12345, device="cuda", dtype=torch.int32)
        else:
            dt = torch.bfloat16 if "bf16" in name else torch.float16
            a = randn(*((K, M) if ta else (M, K)), dtype=dt)
            b = randn(*((N, K) if tb else (K, N)), dtype=dt)
            c = torch.full((M, N), float("nan"), device="cuda")
        load_kernel(bundle, name)(a, b, c)
        torch.cuda.synchronize()
        ref = (a.T if ta else a).cpu().double() @ (b.T if tb else b).cpu().double()
        err = rel_err(c.cpu(), ref)
        tol = 0 if "int8" in name else 1e-3
        check(results, name, err <= tol, err, tol)
    x = randn(1001, 96, dtype=torch.float16)
    y = torch.full_like(x, float("nan"))
    load_kernel(bundle, "op_unary_fp16")(x, y)
    torch.cuda.synchronize()
    err = rel_err(y, op_kernels.unary_reference(torch, x))
    check(results, "op_unary_fp16[M=1001]", err < 2e-3, err, 2e-3)


def bench_gemm(bundle, results):
    import triton.testing

    M = N = K = 4096
    flops = 2 * M * N * K
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    ref = (a.float() @ b.float())
    rows = []
    t_cublas = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=100, rep=500,
                                       return_mode="median")
    rows.append(("torch.matmul (cuBLAS)", t_cublas))
    names = sorted(p.name.removesuffix(".cubin") for p in bundle.glob("gemm4096_*.cubin"))
    for name in names:
        k = load_kernel(bundle, name)
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        k(a, b, c)
        torch.cuda.synchronize()
        err = rel_err(c.float(), ref)
        check(results, name, err < 2e-3, err, 2e-3)
        t = triton.testing.do_bench(lambda k=k, c=c: k(a, b, c), warmup=100, rep=500,
                                    return_mode="median")
        rows.append((name, t))
    t_cublas2 = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=100, rep=500,
                                        return_mode="median")
    rows.append(("torch.matmul (cuBLAS, again)", t_cublas2))
    base = flops / (min(t_cublas, t_cublas2) * 1e-3) / 1e12
    out = []
    for name, ms in rows:
        tflops = flops / (ms * 1e-3) / 1e12
        out.append({"impl": name, "ms": ms, "tflops": tflops, "ratio_to_cublas": tflops / base})
        print(f"{name:40s} {ms:8.3f} ms {tflops:7.1f} TFLOP/s {tflops / base:5.2f}x", flush=True)
    results["gemm_4096_fp16"] = out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bundle", default=str(ROOT / ".gpu" / "bundle"))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    bundle = Path(args.bundle)
    results = {
        "command": " ".join(sys.argv),
        "build_command": "python benchmarks/gpu/build_bundle.py --out .gpu/bundle (compiled on the "
                         "CPU machine; the bundle travels with carry=['.gpu'])",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"gpu": torch.cuda.get_device_name(), "host": platform.node(),
                    "python": platform.python_version()},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "compile_index": json.loads((bundle / "index.json").read_text()),
        "checks": [],
    }
    try:
        import triton
        results["versions"]["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        results["versions"]["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        pass
    numerics(bundle, results)
    bench_gemm(bundle, results)
    Path(args.out).write_text(json.dumps(results, indent=1))
    failed = [c for c in results["checks"] if not c["pass"]]
    print(f"{len(results['checks']) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
