"""Check and time the hand-written sm_90a warp-specialised GEMM (ws_gemm.cu) on an H200.

Runs on the GPU machine with plain Python: torch, triton (do_bench) and cuda-bindings; no
tvm and no tiled compiler.  It loads the cubin built by build.sh, encodes the TMA
descriptors on the host (cuTensorMapEncodeTiled, 128-byte swizzle), launches with
cuLaunchKernel on torch's current stream, checks numerics against a float64 reference
(output poisoned with NaN first) and times every variant against torch.matmul (cuBLAS) in
the same process.

A first pass runs in a child process under a timeout (a wrong mbarrier protocol hangs
the GPU rather than failing), checking every kernel on small and ragged shapes, including
the `_swapB` controls whose MN-major B descriptor has LBO / SBO swapped: exactly one of
each pair must be right, which pins the descriptor convention on real hardware.

    python3 benchmarks/gpu/sm90/run_probe.py --cubin .gpu/sm90/ws_gemm.cubin \
        --out $OUT/sm90_probe.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import subprocess
import sys
import time

import torch
from cuda.bindings import driver as cu

BM, BK = 128, 64
THREADS = 384
CONFIGS = {  # name suffix -> (BN, stages)
    "128x256_s4": (256, 4),
    "128x128_s6": (128, 6),
    "pp128x128_s6": (128, 6),
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
REP_MS = 200  # do_bench repetition window per measurement
TOL = {"f16": 2e-3, "bf16": 1e-2}  # relative Frobenius error vs float64
SMOKE_SHAPES = [
    (256, 512, 128),
    (128, 256, 64),
    (1000, 1000, 1000),
    (333, 200, 72),
    (130, 1001, 136),  # odd ldc: element-wise epilogue
    (200, 260, 64),  # ldc % 8 == 4: paired 32-bit epilogue
]
SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (4096, 14336, 4096),
    (16, 14336, 4096),
    (64, 14336, 4096),
    (128, 14336, 4096),
    (1000, 1000, 1000),
    (4095, 4097, 4100),
]


def check(res, what: str):
    err = res[0] if isinstance(res, tuple) else res
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


def smem_bytes(bn: int, stages: int) -> int:
    return stages * (BM * BK * 2 + BK * bn * 2) + 1024 + 16 * stages + 16


def padded(rows: int, cols: int, dtype) -> torch.Tensor:
    """A [rows, cols] view whose row stride is a multiple of 8 elements (TMA: 16 bytes)."""
    pc = (cols + 7) // 8 * 8
    return torch.empty(rows, pc, dtype=dtype, device="cuda")[:, :cols]


def tensor_map(t: torch.Tensor, box_rows: int):
    """2-D TMA descriptor for row-major t, box = [box_rows rows][64 elements], 128B swizzle."""
    rows, cols = t.shape
    assert t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
    dt = (
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        if t.dtype == torch.float16
        else cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    )
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    return check(
        cu.cuTensorMapEncodeTiled(
            dt,
            2,
            t.data_ptr(),
            [u64(cols), u64(rows)],
            [u64(t.stride(0) * t.element_size())],
            [u32(64), u32(box_rows)],
            [u32(1), u32(1)],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        "cuTensorMapEncodeTiled",
    )


class Kernel:
    def __init__(self, module, name: str, bn: int, stages: int, num_sms: int):
        self.name, self.bn, self.stages, self.num_sms = name, bn, stages, num_sms
        self.fn = check(cu.cuModuleGetFunction(module, name.encode()), f"get {name}")
        self.smem = smem_bytes(bn, stages)
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(self.fn, attr, self.smem), f"smem attr {name}")

    def prepare(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        """Build descriptors and the argument block once; return a zero-arg launcher."""
        m, k = a.shape
        n = b.shape[1]
        tma_a, tma_b = tensor_map(a, BM), tensor_map(b, BK)
        c_ptr = ctypes.c_void_p(c.data_ptr())
        ints = [ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k)]
        ldc = ctypes.c_longlong(c.stride(0))
        keep = [tma_a, tma_b, c_ptr, *ints, ldc]
        ptrs = [tma_a.getPtr(), tma_b.getPtr(), ctypes.addressof(c_ptr)]
        ptrs += [ctypes.addressof(x) for x in ints] + [ctypes.addressof(ldc)]
        params = (ctypes.c_void_p * len(ptrs))(*ptrs)
        tiles = -(-m // BM) * -(-n // self.bn)
        grid = min(tiles, self.num_sms)

        stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)

        def launch():
            check(
                cu.cuLaunchKernel(
                    self.fn,
                    grid,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    self.smem,
                    stream,
                    ctypes.addressof(params),
                    0,
                ),
                f"launch {self.name}",
            )
            _ = keep  # descriptors and scalars must outlive the launch

        return launch


def load(cubin: str):
    torch.cuda.init()
    torch.empty(1, device="cuda")  # make torch's primary context current
    with open(cubin, "rb") as f:
        module = check(cu.cuModuleLoadData(f.read()), "cuModuleLoadData")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    return module, num_sms


def inputs(m: int, n: int, k: int, dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = padded(m, k, dtype)
    b = padded(k, n, dtype)
    a.copy_(torch.randn(m, k, device="cuda", generator=g, dtype=torch.float32))
    b.copy_(torch.randn(k, n, device="cuda", generator=g, dtype=torch.float32))
    return a, b


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("nan")
    o = out.double()
    return float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))


def run_check(kern: Kernel, m: int, n: int, k: int, dtype, seed: int) -> float:
    a, b = inputs(m, n, k, dtype, seed)
    c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    kern.prepare(a, b, c)()
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    return rel_err(c, ref)


def smoke(cubin: str) -> int:
    """Child process: every kernel on small shapes, one `SMOKE_RESULT` line per kernel.

    Primary kernels run first and the `_swapB` controls last, so a control that faults
    or hangs cannot hide the primaries' results from the parent.
    """
    module, num_sms = load(cubin)
    for suffix in ("", "_swapB"):
        for dname, dtype in DTYPES.items():
            for cfg, (bn, st) in CONFIGS.items():
                name = f"ws_gemm_{dname}_{cfg}{suffix}"
                kern = Kernel(module, name, bn, st, num_sms)
                errs = []
                for i, (m, n, k) in enumerate(SMOKE_SHAPES):
                    print(f"smoke {name} {m}x{n}x{k}", file=sys.stderr, flush=True)
                    errs.append(run_check(kern, m, n, k, dtype, seed=100 + i))
                print("SMOKE_RESULT " + json.dumps({name: errs}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubin", default=".gpu/sm90/ws_gemm.cubin")
    ap.add_argument("--out", default="sm90_probe.json")
    ap.add_argument("--smoke", action="store_true", help="(child) small-shape checks only")
    ap.add_argument("--smoke-timeout", type=float, default=120)
    args = ap.parse_args()
    if args.smoke:
        return smoke(args.cubin)

    import cuda.bindings
    import triton
    from triton.testing import do_bench

    check(cu.cuInit(0), "cuInit")

    report = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(0),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda_bindings": cuda.bindings.__version__,
            "driver": check(cu.cuDriverGetVersion(), "cuDriverGetVersion"),
        },
        "tolerance_rel_fro": TOL,
        "timing": f"triton.testing.do_bench median, warmup 25 ms, rep {REP_MS} ms",
    }
    t0 = time.time()
    status = "ok"
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--cubin", args.cubin, "--smoke"],
            capture_output=True,
            text=True,
            timeout=args.smoke_timeout,
        )
        stdout, stderr = proc.stdout, proc.stderr
        if proc.returncode != 0:
            status = f"child rc={proc.returncode}"
    except subprocess.TimeoutExpired as e:

        def text(x):
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")

        stdout, stderr = text(e.stdout), text(e.stderr)
        status = "TIMEOUT (hang)"
    smoke_res = {}
    for ln in stdout.splitlines():
        if ln.startswith("SMOKE_RESULT "):
            smoke_res.update(json.loads(ln[len("SMOKE_RESULT ") :]))
    report["smoke"] = {
        "status": status,
        "seconds": round(time.time() - t0, 1),
        "errors": smoke_res,
        "stderr_tail": stderr[-1500:],
    }
    print(f"smoke status: {status}; stderr tail:\n{stderr[-600:]}", flush=True)
    for name, errs in smoke_res.items():
        print(f"smoke {name:34s} " + " ".join(f"{e:.2e}" for e in errs), flush=True)
    if status == "TIMEOUT (hang)" and not smoke_res:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        return 2

    # Choose, per (dtype, config), the B-descriptor variant that passed the smoke checks.
    module, num_sms = load(args.cubin)
    chosen = {}
    for dname in DTYPES:
        for cfg, (bn, st) in CONFIGS.items():
            for suffix in ("", "_swapB"):
                name = f"ws_gemm_{dname}_{cfg}{suffix}"
                errs = smoke_res.get(name)
                if errs and all(e == e and e < TOL[dname] for e in errs):
                    chosen[(dname, cfg)] = Kernel(module, name, bn, st, num_sms)
                    break
    report["chosen_kernels"] = sorted(k.name for k in chosen.values())

    rows = []
    for dname, dtype in DTYPES.items():
        for i, (m, n, k) in enumerate(SHAPES):
            a, b = inputs(m, n, k, dtype, seed=1000 + i)
            ref = a.double() @ b.double()
            flops = 2.0 * m * n * k
            c_ref = a @ b
            torch.cuda.synchronize()
            ms_cublas = do_bench(
                lambda a=a, b=b: torch.matmul(a, b), warmup=25, rep=REP_MS, return_mode="median"
            )
            ms_cublas_strided = None
            if not (a.is_contiguous() and b.is_contiguous()):
                # Padded (TMA-legal) views send cuBLAS down a slow path; compare
                # against the faster of that and dense copies of the same data.
                ac, bc = a.contiguous(), b.contiguous()
                ms_cublas_strided = ms_cublas
                ms_dense = do_bench(
                    lambda a=ac, b=bc: torch.matmul(a, b),
                    warmup=25,
                    rep=REP_MS,
                    return_mode="median",
                )
                ms_cublas = min(ms_cublas, ms_dense)
            row = {
                "dtype": dname,
                "M": m,
                "N": n,
                "K": k,
                "cublas_ms": ms_cublas,
                "cublas_strided_ms": ms_cublas_strided,
                "cublas_tflops": flops / ms_cublas / 1e9,
                "cublas_rel_err": rel_err(c_ref, ref),
                "kernels": {},
            }
            for cfg in CONFIGS:
                kern = chosen.get((dname, cfg))
                if kern is None:
                    row["kernels"][cfg] = {"status": "no correct variant in smoke"}
                    continue
                c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                launch = kern.prepare(a, b, c)
                launch()
                torch.cuda.synchronize()
                err = rel_err(c, ref)
                ms = do_bench(launch, warmup=25, rep=REP_MS, return_mode="median")
                row["kernels"][cfg] = {
                    "name": kern.name,
                    "rel_err": err,
                    "ok": err == err and err < TOL[dname],
                    "ms": ms,
                    "tflops": flops / ms / 1e9,
                    "ratio_vs_cublas": ms_cublas / ms,
                }
            full = row["kernels"].get("128x256_s4", {})
            if m >= 4096 and "ms" in full:
                # Timing diagnostic: the same kernel with the epilogue's stores dropped.
                diag = Kernel(module, f"ws_gemm_{dname}_128x256_s4_nostore", 256, 4, num_sms)
                c = torch.empty((m, n), dtype=dtype, device="cuda")
                ms = do_bench(diag.prepare(a, b, c), warmup=25, rep=REP_MS, return_mode="median")
                row["diag_128x256_s4_nostore"] = {
                    "ms": ms,
                    "tflops": flops / ms / 1e9,
                    "epilogue_share": 1 - ms / full["ms"],
                }
                print(
                    f"     nostore {flops / ms / 1e9:7.1f} TFLOP/s, epilogue share "
                    f"{1 - ms / full['ms']:.1%}",
                    flush=True,
                )
            del ref
            rows.append(row)
            best = max(
                (v for v in row["kernels"].values() if "tflops" in v),
                key=lambda v: v["tflops"],
                default=None,
            )
            print(
                f"{dname:4s} {m:5d}x{n:5d}x{k:5d} cublas {row['cublas_tflops']:7.1f} | "
                + " | ".join(
                    f"{cfg} {v['tflops']:7.1f} ({v['ratio_vs_cublas']:.2f}x, "
                    f"err {v['rel_err']:.1e}{'' if v['ok'] else ' BAD'})"
                    for cfg, v in row["kernels"].items()
                    if "tflops" in v
                )
                + (f" | best {best['ratio_vs_cublas']:.2f}x" if best else ""),
                flush=True,
            )
    report["rows"] = rows
    report["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    bad = [r for r in rows for v in r["kernels"].values() if not v.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
