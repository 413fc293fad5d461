"""Softmax fp32 over 4096 columns on the H200 (issue 12's row): tiled.ops' kernel (one row per
512-thread block) against variants whose blocks walk R rows in a T.Pipelined loop of S stages
(global -> shared copies of the next rows in flight while a row reduces), beside a device copy
and a 512 MiB in-place kernel (the bandwidth reference, as benchmarks/gpu/ops.py), in one
process: CUDA-graph replays of 20 calls, medians of 5 interleaved rounds (do_bench).
    here:  python benchmarks/gpu/softmax_rows.py build --out .gpu/softmax_rows
    there: python3 benchmarks/gpu/softmax_rows.py run --bundle .gpu/softmax_rows \
               --out $OUT/softmax_rows_h200.json
"""
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks/gpu"))

N = 4096
# (name, (rows per block, stages, threads)); "base" is tiled.ops' own launch config.
VARIANTS = [("base", None)] + [
    (f"r{r}s{s}t{t}", (r, s, t))
    for r, s, t in [(8, 2, 512), (16, 2, 512), (16, 3, 512), (32, 3, 512), (16, 2, 1024),
                    (8, 3, 256)]]


def piped(R: int, stages: int, threads: int):
    """tiled.ops' softmax with each block walking R rows, the row staged through shared
    memory so that T.Pipelined can copy the next rows ahead."""
    import tiled
    import tiled.lang as T

    M = T.dyn("M")
    log2e = math.log2(math.e)

    @tiled.kernel
    def softmax_rows(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, R), threads=threads) as bx:
            xs = T.alloc_shared((1, N), "float32")
            x = T.alloc_fragment((1, N), "float32")
            mx = T.alloc_fragment((1,), "float32")
            s = T.alloc_fragment((1,), "float32")
            for r in T.Pipelined(R, num_stages=stages):
                T.copy(X[bx * R + r, 0], xs)
                T.copy(xs, x)
                T.fill(mx, -T.infinity("float32"))
                T.reduce_max(x, mx, dim=1, clear=False)
                for i, j in T.Parallel(1, N):
                    x[i, j] = T.exp2(x[i, j] * log2e - mx[i] * log2e)
                T.reduce_sum(x, s, dim=1)
                for i in T.Parallel(1):
                    s[i] = 1.0 / s[i]
                for i, j in T.Parallel(1, N):
                    x[i, j] = x[i, j] * s[i]
                T.copy(x, Y[bx * R + r, 0])

    return softmax_rows

def build(out: Path) -> None:
    from bundle_cli import compile_into

    from tiled.ops import kernels

    out.mkdir(parents=True, exist_ok=True)
    for name, v in VARIANTS:
        k = kernels.softmax(N, "float32", blk_m=1, threads=512) if v is None else piped(*v)
        compiled, sec = compile_into(out, name, k, "cuda:sm_90a")
        print(name, compiled.manifest.block, f"{sec:.1f} s", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import graphed, load_kernel
    from triton.testing import do_bench

    kernels = {name: load_kernel(bundle, name) for name, _ in VARIANTS}
    res = {"command": "python3 benchmarks/gpu/softmax_rows.py run --bundle .gpu/softmax_rows "
                      "--out $OUT/softmax_rows_h200.json", "device": torch.cuda.get_device_name(),
           "versions": {"torch": torch.__version__}, "rows": []}
    rw_floats = 128 << 20
    for m in (4096, 32768):
        x = torch.randn(m, N, device="cuda")
        y = torch.empty_like(x)
        want = torch.softmax(x, -1)
        calls, errs = {}, {}
        for name, k in kernels.items():
            y.fill_(float("nan"))
            k(x, y)
            torch.cuda.synchronize()
            errs[name] = ((y - want).norm() / want.norm()).item()
            if errs[name] < 1e-5:
                calls[name] = (lambda k=k, x=x, y=y: k(x, y))
        src = torch.empty(m * N * 4, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        calls["copy"] = lambda s=src, d=dst: d.copy_(s)
        calls["rw_kernel"] = torch.empty(rw_floats, device="cuda").neg_
        graphs = {k: graphed(torch, f, 20) for k, f in calls.items()}
        samples = {k: [] for k in graphs}
        for _ in range(5):  # interleaved rounds
            for k, g in graphs.items():
                samples[k].append(do_bench(g) / 20)
        moved = {k: 2 * 4 * (rw_floats if k == "rw_kernel" else m * N) for k in samples}
        gbs = {k: moved[k] / (statistics.median(v) * 1e-3) / 1e9 for k, v in samples.items()}
        best = max(gbs["copy"], gbs["rw_kernel"])
        row = {"M": m, "GB/s": gbs, "of_copy": {k: v / best for k, v in gbs.items()},
               "rel_err_vs_torch": errs}
        print(m, {k: round(v, 3) for k, v in row["of_copy"].items()}, flush=True)
        res["rows"].append(row)
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[sys.argv.index("--out") + 1]))
    else:
        run(Path(sys.argv[sys.argv.index("--bundle") + 1]),
            Path(sys.argv[sys.argv.index("--out") + 1]))
