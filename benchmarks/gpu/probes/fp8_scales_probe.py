"""Probe (issue 13's block-scaled fp8 GEMM at 0.61-0.80x per-tensor _scaled_mm for M >= 512):
where the block-scaled kernel's time goes beside the per-tensor one of the same tile. Each
variant is tiled.ops.fp8's kernel with one thing changed, all at 128 x 128 x 128 tiles (two
consumer warpgroups, 4 stages) unless named, timed beside torch._scaled_mm per-tensor in one
process, rounds in rotated order:
- `now`: tiled.ops.fp8.scaled_gemm_kernel, block-scaled, as the op runs it;
- `pt`: the per-tensor kernel of the same tile (its MMAs chain on one accumulator, retired a
  step late): what the rescale costs altogether;
- `nosa`: block-scaled structure (a fresh product each step, waited for and added into the
  sum) with the scale loads left out (wrong numbers on purpose): what the loads cost;
- `ahead`: the scales a step ahead (loaded raw at step k for step k + 1, multiplied there);
- `bm192`: three consumer warpgroups (BM = 192, 384 threads): each warpgroup's rescale has
  two others' MMAs to meet instead of one;
- two K steps an iteration, each into its own product (scales of both loaded before the
  first MMA): `seq2` rescales each product right after its MMA (one product's rescale waits
  for its MMA, as in `now`); `dbl` rescales the second product in the next iteration, after
  that one's first MMA (tiled.ops.fp8's `paired` form since); `pair` issues both MMAs before
  the first product's rescale so that it runs beside the second MMA, which the compiler's
  wgmma_waits allowed only with results/wgmma_reads_beside_flight.diff applied (a statement
  may read a retired gemm's product while another is in flight where nothing is carried
  over the back edge; without it `pair` compiles as `seq2`). `*_pp`: compile option
  pingpong (the warpgroups take turns issuing).

- `fresh` / `fresh2`: a fresh product each step that nothing reads in the loop (wrong
  numbers on purpose), one or two an iteration: what waiting for each MMA costs without the
  rescale.

Runs (H100, results/): fp8_scales_probe_h100.json (now, pt, nosa, ahead, bm192; with
fp8_scales_ncu_h100.txt, fp8_scales_sass_stalls_h100.txt), fp8_scales_probe_pair_h100.json
(now, pt, bm192, dbl, pair, pair_pp, and `pair4`: the op's first paired form, pair's code),
fp8_scales_probe_forms_h100.json (now, pt, dbl, pair, pair_pp, dbl_pp, seq2, seq2_pp; pair and
pair_pp built with the diff in both), fp8_scales_probe_fresh_h100.json (now, pt, dbl, fresh,
fresh2). The bundle of each run held only the kernels it timed (index.json edited between
runs).

    python benchmarks/gpu/probes/fp8_scales_probe.py build .gpu/fp8scales
There: python3 benchmarks/gpu/probes/fp8_scales_probe.py run .gpu/fp8scales $OUT/out.json
       python3 benchmarks/gpu/probes/fp8_scales_probe.py ncu .gpu/fp8scales  (under ncu)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

NK = [(7168, 2048), (7168, 18432)]
MS = (512, 2048, 4096)
TILE = dict(BM=128, BN=128, threads=256, stages=4)


def _variant(name: str, N: int, K: int):
    import tiled
    import tiled.lang as T
    from tiled.ops import fp8

    if name == "now":
        return fp8.scaled_gemm_kernel(128, N, K, "bfloat16", True, **TILE)
    if name == "pt":
        return fp8.scaled_gemm_kernel(128, N, K, "bfloat16", False, **TILE)
    if name == "bm192":
        return fp8.scaled_gemm_kernel(128, N, K, "bfloat16", True, BM=192, BN=128,
                                      threads=384, stages=4)
    BM, BN, threads, stages = TILE["BM"], TILE["BN"], TILE["threads"], TILE["stages"]
    BK, E4M3 = fp8.BK, fp8.E4M3
    Md = T.dyn("M")
    G, NB, steps = K // BK, N // 128, K // BK

    if name in ("fresh", "fresh2"):
        return _fresh(Md, N, K, G, NB, steps, two=name == "fresh2")
    if name == "nosa":
        @tiled.kernel
        def fp8_nosa(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                     SA: T.Tensor((Md, G), "float32"), SB: T.Tensor((NB, G), "float32"),
                     Y: T.Tensor((Md, N), "bfloat16")):
            with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
                a_s = T.alloc_shared((BM, BK), E4M3)
                b_s = T.alloc_shared((BN, BK), E4M3)
                part = T.alloc_fragment((BM, BN), "float32")
                acc = T.alloc_fragment((BM, BN), "float32")
                T.clear(acc)
                for k in T.Pipelined(steps, num_stages=stages):
                    T.copy(A[by * BM, k * BK], a_s)
                    T.copy(B[bx * BN, k * BK], b_s)
                    T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(BM, BN):
                        acc[i, j] += part[i, j]
                T.copy(acc, Y[by * BM, bx * BN])
        return fp8_nosa

    if name in ("dbl", "dbl_pp"):  # measured as this probe's own copy; the same source
        return fp8.scaled_gemm_kernel(128, N, K, "bfloat16", True, **TILE, paired=True)
    if name in ("pair", "pair_pp", "seq2", "seq2_pp"):
        return _double(Md, N, K, G, NB, steps, seq=name.startswith("seq2"))
    assert name == "ahead", name

    @tiled.kernel
    def fp8_ahead(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                  SA: T.Tensor((Md, G), "float32"), SB: T.Tensor((NB, G), "float32"),
                  Y: T.Tensor((Md, N), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a_s = T.alloc_shared((BM, BK), E4M3)
            b_s = T.alloc_shared((BN, BK), E4M3)
            part = T.alloc_fragment((BM, BN), "float32")
            acc = T.alloc_fragment((BM, BN), "float32")
            sa = T.alloc_fragment((BM,), "float32")
            nxt = T.alloc_fragment((BM,), "float32")
            nsb = T.alloc_fragment((BM,), "float32")
            T.clear(acc)
            for i in T.Parallel(BM):
                nxt[i] = SA[by * BM + i, 0]
                nsb[i] = SB[bx * BN // 128, 0]
            for k in T.Pipelined(steps, num_stages=stages):
                T.copy(A[by * BM, k * BK], a_s)
                T.copy(B[bx * BN, k * BK], b_s)
                for i in T.Parallel(BM):
                    sa[i] = nxt[i] * nsb[i]
                for i in T.Parallel(BM):
                    nxt[i] = SA[by * BM + i, T.min(k + 1, steps - 1)]
                    nsb[i] = SB[bx * BN // 128, T.min(k + 1, steps - 1)]
                T.gemm(a_s, b_s, part, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += part[i, j] * sa[i]
            T.copy(acc, Y[by * BM, bx * BN])
    return fp8_ahead


def _fresh(Md, N, K, G, NB, steps, two):
    """A fresh product each K step that nothing reads until the loop ends (Y gets the last
    one: wrong numbers on purpose): each MMA waits only for the one before it on the same
    product (clear_accum), never for a rescale. `two`: two products an iteration, so two
    MMA groups of a warpgroup may be in flight."""
    import tiled
    import tiled.lang as T
    from tiled.ops import fp8

    BM, BN, threads, stages = TILE["BM"], TILE["BN"], TILE["threads"], TILE["stages"]
    BK, E4M3 = fp8.BK, fp8.E4M3
    n = 2 if two else 1

    @tiled.kernel
    def fp8_fresh(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                  SA: T.Tensor((Md, G), "float32"), SB: T.Tensor((NB, G), "float32"),
                  Y: T.Tensor((Md, N), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a0 = T.alloc_shared((BM, BK), E4M3)
            b0 = T.alloc_shared((BN, BK), E4M3)
            a1 = T.alloc_shared((BM, BK), E4M3)
            b1 = T.alloc_shared((BN, BK), E4M3)
            pa = T.alloc_fragment((BM, BN), "float32")
            pb = T.alloc_fragment((BM, BN), "float32")
            for k in T.Pipelined(steps // n, num_stages=max(2, stages // n)):
                T.copy(A[by * BM, n * k * BK], a0)
                T.copy(B[bx * BN, n * k * BK], b0)
                if two:
                    T.copy(A[by * BM, (2 * k + 1) * BK], a1)
                    T.copy(B[bx * BN, (2 * k + 1) * BK], b1)
                T.gemm(a0, b0, pa, transpose_B=True, clear_accum=True)
                if two:
                    T.gemm(a1, b1, pb, transpose_B=True, clear_accum=True)
            if two:
                for i, j in T.Parallel(BM, BN):
                    pa[i, j] += pb[i, j]
            T.copy(pa, Y[by * BM, bx * BN])
    return fp8_fresh


def _double(Md, N, K, G, NB, steps, seq):
    """Two K steps an iteration, each into its own product (pa, pb): `seq` (seq2) adds each
    product right after its MMA, else (pair) both MMAs are issued before pa is added (module
    docstring)."""
    import tiled
    import tiled.lang as T
    from tiled.ops import fp8

    BM, BN, threads, stages = TILE["BM"], TILE["BN"], TILE["threads"], 3
    BK, E4M3 = fp8.BK, fp8.E4M3
    assert steps % 2 == 0

    @tiled.kernel
    def fp8_dbl(A: T.Tensor((Md, K), E4M3), B: T.Tensor((N, K), E4M3),
                SA: T.Tensor((Md, G), "float32"), SB: T.Tensor((NB, G), "float32"),
                Y: T.Tensor((Md, N), "bfloat16")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), threads=threads) as (bx, by):
            a0 = T.alloc_shared((BM, BK), E4M3)
            b0 = T.alloc_shared((BN, BK), E4M3)
            a1 = T.alloc_shared((BM, BK), E4M3)
            b1 = T.alloc_shared((BN, BK), E4M3)
            pa = T.alloc_fragment((BM, BN), "float32")
            pb = T.alloc_fragment((BM, BN), "float32")
            acc = T.alloc_fragment((BM, BN), "float32")
            s0 = T.alloc_fragment((BM,), "float32")
            s1 = T.alloc_fragment((BM,), "float32")
            T.clear(acc)
            for k in T.Pipelined(steps // 2, num_stages=stages):
                T.copy(A[by * BM, 2 * k * BK], a0)
                T.copy(B[bx * BN, 2 * k * BK], b0)
                T.copy(A[by * BM, (2 * k + 1) * BK], a1)
                T.copy(B[bx * BN, (2 * k + 1) * BK], b1)
                for i in T.Parallel(BM):
                    s0[i] = SA[by * BM + i, 2 * k] * SB[bx * BN // 128, 2 * k]
                    s1[i] = SA[by * BM + i, 2 * k + 1] * SB[bx * BN // 128, 2 * k + 1]
                T.gemm(a0, b0, pa, transpose_B=True, clear_accum=True)
                if seq:
                    for i, j in T.Parallel(BM, BN):
                        acc[i, j] += pa[i, j] * s0[i]
                T.gemm(a1, b1, pb, transpose_B=True, clear_accum=True)
                if not seq:
                    for i, j in T.Parallel(BM, BN):
                        acc[i, j] += pa[i, j] * s0[i]
                for i, j in T.Parallel(BM, BN):
                    acc[i, j] += pb[i, j] * s1[i]
            T.copy(acc, Y[by * BM, bx * BN])
    return fp8_dbl


VARIANTS = ("now", "pt", "nosa", "ahead", "bm192", "dbl", "pair", "pair_pp", "dbl_pp", "seq2",
            "seq2_pp", "fresh", "fresh2")
OPTIONS = {"pair_pp": {"pingpong": True}, "dbl_pp": {"pingpong": True},
           "seq2_pp": {"pingpong": True}}


def build(out: Path) -> None:
    from bundle_cli import compile_into

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for N, K in NK:
        for v in VARIANTS:
            name = f"{v}_{N}x{K}"
            _, seconds = compile_into(out, name, _variant(v, N, K), **OPTIONS.get(v, {}))
            index[name] = {"variant": v, "N": N, "K": K}
            print(name, f"{seconds:.1f} s", flush=True)
    (out / "index.json").write_text(json.dumps({"kernels": index}, indent=1))


def _operands(torch, M, N, K):
    """(a, b, sa, sb, the dequantized product): fp8_turns_probe's operands."""
    from fp8_turns_probe import _operands as turns_operands

    (a, b, sa, sb), ref, _ = turns_operands(torch, M, N, K)
    return a, b, sa, sb, ref


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import load_kernel, machine, rotated_medians
    from triton.testing import do_bench

    index = json.loads((bundle / "index.json").read_text())["kernels"]
    rows = []
    for N, K in NK:
        names = [n for n, m in index.items() if (m["N"], m["K"]) == (N, K)]
        kernels = {n: load_kernel(bundle, n) for n in names}
        for M in MS:
            a, b, sa, sb, ref = _operands(torch, M, N, K)
            one = torch.ones((), device="cuda")
            s = torch.full((), K ** -0.5, device="cuda")
            s1 = s.reshape(1) * 1.0
            calls = {"torch._scaled_mm per-tensor": lambda a=a, b=b, s=s, one=one: (
                torch._scaled_mm(a, b.t(), scale_a=s, scale_b=one, out_dtype=torch.bfloat16))}
            errs = {}
            for n, k in kernels.items():
                y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                args = (a, b, s1, one.reshape(1), y) if index[n]["variant"] == "pt" else \
                    (a, b, sa, sb, y)
                k(*args)
                torch.cuda.synchronize()
                errs[n] = float((y.float() - ref).norm() / ref.norm())
                calls[n] = (lambda fn, xs: lambda: fn(*xs))(k, args)
            ms = rotated_medians(calls, 7, lambda fn: do_bench(fn, warmup=25, rep=60))
            base = ms["torch._scaled_mm per-tensor"]
            rows.append({"M": M, "N": N, "K": K, "ms": ms,
                         "tflops": {c: round(2 * M * N * K / (v * 1e-3) / 1e12, 1)
                                    for c, v in ms.items()},
                         "vs_scaled_mm_per_tensor": {c: round(base / v, 3) for c, v in ms.items()},
                         "rel_err_vs_block_scaled_ref": errs})
            print(M, N, K, rows[-1]["vs_scaled_mm_per_tensor"], flush=True)
            print("   err", {n: f"{e:.1e}" for n, e in errs.items()}, flush=True)
            torch.cuda.empty_cache()
    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/probes/fp8_scales_probe.py run {bundle} {out}",
        "build": f"python benchmarks/gpu/probes/fp8_scales_probe.py build {bundle}",
        "device": torch.cuda.get_device_name(), "machine": machine(),
        "versions": {"torch": torch.__version__}, "tile": TILE, "rows": rows}, indent=1))


def ncu(bundle: Path) -> None:
    """Launches each variant of NCU_VARIANTS (default now, pair, pair_pp) at M = 4096,
    N = 7168, K = 18432, twice."""
    import os

    import torch
    from bundle_cli import load_kernel

    N, K, M = 7168, 18432, 4096
    a, b, sa, sb, _ = _operands(torch, M, N, K)
    for v in os.environ.get("NCU_VARIANTS", "now,pair,pair_pp").split(","):
        k = load_kernel(bundle, f"{v}_{N}x{K}")
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        one = torch.ones(1, device="cuda")
        args = (a, b, one, one, y) if v == "pt" else (a, b, sa, sb, y)
        for _ in range(2):
            k(*args)
        torch.cuda.synchronize()
        print(v, "launched", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    elif sys.argv[1] == "ncu":
        ncu(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
