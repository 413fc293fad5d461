"""Probe (issue 12): a GEMM whose A tile is gathered through a row-index table, the form
tests/compiler/test_ws_loop.py checks only as source (a gather ring copy on the producer
warpgroup that loads the indices itself, `ring_gathered`): does it compute the right thing on
sm_90a, and how fast is it beside torch's index_select + matmul?

    C = where(idx < bound, X[idx], 0) @ B    X (rows, K), idx (M,), B (K, N), fp16, fp32 C

Kernels: the test's own (one 128 x 128 block, K = 256) and an MoE-like size (M = 4096
gathered rows of X 16384 x 4096, N = 4096, 128 x 128 x 64 tiles, 3 stages), each lowered as
`ring` (the default: the gather on a producer warpgroup) and `pipeline`
(warp_specialize=False: a cp.async pipeline of the block's own threads).

Here:  python benchmarks/gpu/probes/gather_table_probe.py build .gpu/gather_probe
There: python3 benchmarks/gpu/probes/gather_table_probe.py run .gpu/gather_probe \
           $OUT/gather_probe.json
"""

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))

SHAPES = {"test": dict(rows=512, K=256, M=128, N=128, bm=128, bn=128, bk=64, stages=2,
                       bound=500),
          "moe": dict(rows=16384, K=4096, M=4096, N=4096, bm=128, bn=128, bk=64, stages=3,
                      bound=16000)}
VARIANTS = {"ring": {}, "pipeline": {"warp_specialize": False}}


def gathered(rows, K, M, N, bm, bn, bk, stages, bound):
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def gather_gemm(X: T.Tensor((rows, K), "float16"), Idx: T.Tensor((M,), "int32"),
                    B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                for i, c in T.Parallel(bm, bk):
                    A_s[i, c] = T.if_then_else(Idx[by * bm + i] < bound,
                                               X[Idx[by * bm + i], k * bk + c], 0)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * bm, bx * bn])

    return gather_gemm


def build(out: Path) -> None:
    from bundle_cli import compile_into

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for s, shape in SHAPES.items():
        for v, opts in VARIANTS.items():
            c, secs = compile_into(out, f"{s}_{v}", gathered(**shape), "cuda:sm_90a", **opts)
            index[f"{s}_{v}"] = {"shape": s, "variant": v, "options": opts,
                                 "block": str(c.manifest.block), "cold_compile_s": round(secs, 2)}
            print(f"{s}_{v}", index[f"{s}_{v}"], flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


def _shape_rows(torch, do_bench, load_kernel, bundle: Path, index: dict, s: str,
                shape: dict) -> dict:
    """Checks and times the bundle's kernels of shape `s` beside torch; their rows."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape["rows"], shape["K"], device="cuda", dtype=torch.float16, generator=g)
    idx = torch.randint(0, shape["rows"], (shape["M"],), device="cuda", dtype=torch.int32,
                        generator=g)
    b = torch.randn(shape["K"], shape["N"], device="cuda", dtype=torch.float16, generator=g)
    keep = (idx < shape["bound"]).unsqueeze(1)

    def reference():
        return torch.matmul(torch.where(keep, x.index_select(0, idx), 0), b)

    ref = torch.where(keep, x.index_select(0, idx), 0).float() @ b.float()
    rows, calls = {}, {"torch": reference}
    for name, meta in index.items():
        if meta["shape"] != s:
            continue
        k, c = load_kernel(bundle, name), torch.empty(shape["M"], shape["N"], device="cuda")
        k(x, idx, b, c)
        torch.cuda.synchronize()
        err = float((c - ref).abs().max() / ref.abs().max())
        rows[name] = {**meta, "rel_err": err, "ok": err < 2e-3}
        calls[name] = (lambda k=k, c=c: k(x, idx, b, c))
    times = {n: [] for n in calls}
    for r in range(5):  # rotated order, do_bench medians
        for n in list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]:
            times[n].append(do_bench(calls[n], warmup=10, rep=40))
    flop = 2 * shape["M"] * shape["N"] * shape["K"]
    t_ref = statistics.median(times["torch"])
    rows[f"{s}_torch"] = {"ms": t_ref, "tflops": flop / t_ref / 1e9}
    for n in calls:
        if n != "torch":
            t = statistics.median(times[n])
            rows[n].update({"ms": t, "tflops": flop / t / 1e9, "vs_torch": t_ref / t})
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import load_kernel, machine
    from triton.testing import do_bench

    index = json.loads((bundle / "index.json").read_text())
    rows = {}
    for s, shape in SHAPES.items():
        rows.update(_shape_rows(torch, do_bench, load_kernel, bundle, index, s, shape))
    for n, r in rows.items():
        print(n, r, flush=True)
    out.write_text(json.dumps({"command": " ".join(["python3", *sys.argv]),
                               "device": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
