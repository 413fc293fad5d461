"""Probe (issue 12, the seed's GEMM at 0.88x cuBLAS bf16): how much of a 128 x 128 tile's time
is its epilogue? examples/gemm.py's kernel at its own config (128x128x32, 3 stages, 128
threads; one consumer warpgroup, so nothing overlaps its store with the next tile's MMAs),
4096^3 fp16 / bf16, in three forms:

- `base`: as written (the accumulator stored from registers to C);
- `nostore`: the same, its store under `if F[0] == 1` with F[0] = 0 at run time, so the tiles
  are computed (the store's condition is unknown to the compiler) but never written: the
  time without the epilogue's stores, an upper bound of what overlapping them could win;
- `staged`: the accumulator copied to a shared tile, then the tile to C (TileLang's examples'
  epilogue; 16-byte row stores).

Timed with cuBLAS in one process, 7 rounds in rotated order (do_bench medians).

Here:  python benchmarks/gpu/probes/seed_epilogue_probe.py build .gpu/seed_epilogue
There: python3 benchmarks/gpu/probes/seed_epilogue_probe.py run .gpu/seed_epilogue \\
           $OUT/seed_epilogue_probe.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
SIZE = 4096
FORMS = ("base", "nostore", "staged")


def _kernel(dtype: str, form: str):
    import tiled
    import tiled.lang as T

    M = N = K = SIZE
    bm, bn, bk = 128, 128, 32

    @tiled.kernel
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             C: T.Tensor((M, N), dtype), F: T.Tensor((1,), "int32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_shared = T.alloc_shared((bm, bk), dtype)
            B_shared = T.alloc_shared((bk, bn), dtype)
            C_local = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_shared)
                T.copy(B[k * bk, bx * bn], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            if form == "nostore":
                if F[0] == 1:
                    T.copy(C_local, C[by * bm, bx * bn])
            elif form == "staged":
                C_shared = T.alloc_shared((bm, bn), dtype)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * bm, bx * bn])
            else:
                T.copy(C_local, C[by * bm, bx * bn])

    return gemm


def build(out: Path) -> None:
    from bundle_cli import compile_into

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dt in ("float16", "bfloat16"):
        for form in FORMS:
            c, sec = compile_into(out, f"{dt}_{form}", _kernel(dt, form), "cuda:sm_90a")
            index[f"{dt}_{form}"] = {"dtype": dt, "form": form,
                                     "smem": c.manifest.dynamic_smem_bytes,
                                     "block": c.manifest.block[0], "grid": str(c.manifest.grid),
                                     "compile_s": round(sec, 2)}
            print(f"{dt}_{form}", index[f"{dt}_{form}"], flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


def _dtype_row(torch, do_bench, load_kernel, bundle: Path, index: dict, dt_name: str) -> dict:
    from bundle_cli import rotated_medians

    dt = getattr(torch, dt_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    b = torch.randn(SIZE, SIZE, device="cuda", dtype=dt, generator=g)
    ref = torch.matmul(a, b).float()
    calls = {"cublas": lambda: torch.matmul(a, b)}
    errs = {}
    for n, m in index.items():
        if m["dtype"] != dt_name:
            continue
        k, c = load_kernel(bundle, n), torch.empty_like(a)
        on = torch.ones(1, device="cuda", dtype=torch.int32)
        k(a, b, c, on)  # every form stores when F[0] == 1: checked against cuBLAS
        torch.cuda.synchronize()
        errs[n] = float((c.float() - ref).norm() / ref.norm())
        flag = torch.zeros(1, device="cuda", dtype=torch.int32) if m["form"] == "nostore" \
            else on
        calls[n] = (lambda fn, dst, f: lambda: fn(a, b, dst, f))(k, c, flag)
    ms = rotated_medians(calls, 7, do_bench)  # do_bench's own 25 ms warmup, 100 ms reps
    tf = {n: 2 * SIZE ** 3 / v / 1e9 for n, v in ms.items()}
    return {"dtype": dt_name, "tflops": tf, "ratio": {n: tf[n] / tf["cublas"] for n in tf},
            "errs": errs}


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import load_kernel, machine
    from triton.testing import do_bench

    index = json.loads((bundle / "index.json").read_text())
    rows = []
    for dt_name in ("float16", "bfloat16"):
        rows.append(_dtype_row(torch, do_bench, load_kernel, bundle, index, dt_name))
        print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps({
        "command": "python3 benchmarks/gpu/probes/seed_epilogue_probe.py run " +
                   f"{bundle} {out}", "machine": machine(),
        "device": torch.cuda.get_device_name(), "rows": rows, "index": index}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
