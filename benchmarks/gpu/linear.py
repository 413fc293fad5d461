"""y = x @ W^T (bf16, F.linear's layout: W is [N, K]) on the H200 at the sizes issue 12 names:
W 4096x4096, 14336x4096 and 4096x14336, M = 1, 16, 64, 128, 1024, 4096; each size with the
candidate kernels a by-shape choice would pick among, beside F.linear in the same process.

Candidates, all written in the DSL as a TileLang author would (the kernels of tiled.ops.linear,
tiled/ops/gemm.py, whose token count is symbolic; benchmarks/results/linear_h200.json was made
at commit 73d750a, when this script's kernels had a static M):
- `tile`: the plain tile GEMM, x and W tiles copied per 64-wide K step, T.gemm with
  transpose_B (the whole-kernel warp-specialized GEMM path takes it: persistent, TMA, wgmma);
- `swap`: for small M, the same product as y^T = W @ x^T, so that W's rows fill wgmma's M
  (64 per warpgroup) and the tokens its N (64 or 128, the rows past M read as zeros); the
  epilogue stores the tile transposed;
- `swap` with `splits` > 1: split-K over a third grid axis for sizes whose output tiles
  cannot fill the SMs; each split writes its float32 partial into P[s] of a [splits, M, N]
  workspace, summed and cast to bf16 after (here by torch; tiled.ops.linear uses its
  splitk_sum kernel). The timed call is the kernel and that sum;
- `per_op_*` (with `LINEAR_PER_OP=1`): every candidate above compiled again with
  whole_kernel_paths=False (the generic TMA-fed loop, ws_loop.py, instead of the whole-kernel
  GEMM path, which takes all of them by default): whether the generic path can replace the
  recognizer at these sizes.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/linear.py build --out .gpu/linear
(`LINEAR_MS=1024,4096` builds those token counts only, `LINEAR_CANDIDATES=tile_128,per_op`
the candidates whose names start so; `run` times the sizes the bundle holds.)
There (device tool, carry=[".gpu"]; thin runtime only):
    python3 benchmarks/gpu/linear.py run --bundle .gpu/linear --out $OUT/linear_h200.json

Every call is captured GRAPH_CALLS times in a CUDA graph and the replay timed (do_bench,
medians of ROUNDS interleaved rounds): at decode sizes a launch costs more host time than
the kernel runs, and serving engines replay graphs there too. Each candidate is checked
against F.linear first (relative error); a size's choice is its fastest correct candidate.
Each size is timed in its own child process (a faulting kernel costs that size's row).

benchmarks/results/linear_h200.json (2026-12-01): the best candidate reaches >= 0.95x
F.linear at 11 of the 18 sizes (all of M >= 1024: 0.95-1.03x); the decode sizes fall short
(M <= 128 at K = 4096: 0.73-0.96x; M = 1 at K = 14336: 0.85x).
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    build_command,
    compile_into,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    smoke_order,
    write_results,
)
from bundle_cli import graphed as graph_replay

TARGET = "cuda:sm_90a"
DTYPE = "bfloat16"
WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K)
MS = (1, 16, 64, 128, 1024, 4096)
ROUNDS = 3
GRAPH_CALLS = 20


def tile_kernel(M, N, K, BM, BN, threads, stages=4):
    from tiled.ops.gemm import linear_kernel

    return linear_kernel(M, N, K, DTYPE, DTYPE, kind="tile", BM=BM, BN=BN, threads=threads,
                         stages=stages)


def swap_kernel(M, N, K, BW, BX, threads, splits, stages=4):
    from tiled.ops.gemm import linear_kernel

    return linear_kernel(M, N, K, DTYPE, DTYPE, kind="swap", BM=BX, BN=BW, threads=threads,
                         splits=splits, stages=stages)


def candidates(M, N, K) -> dict:
    """name -> (kind, kernel factory arguments, compile options)."""
    out = {}
    tiles = [(128, 256, 256), (128, 128, 256), (64, 128, 128), (64, 256, 128)]
    for BM, BN, threads in tiles:
        if M >= 64 or BM == 64:
            out[f"tile_{BM}x{BN}_t{threads}"] = ("tile", (BM, BN, threads), {})
    if M <= 128:
        BX = 64 if M <= 64 else 128
        for BW, threads in ((128, 256), (64, 128)):
            for splits in (1, 2, 4, 8) if K >= 8192 else (1, 2, 4):
                out[f"swap_{BW}x{BX}_t{threads}_s{splits}"] = (
                    "swap", (BW, BX, threads, splits), {})
    if os.environ.get("LINEAR_PER_OP"):  # each through the per-op path too
        out.update({f"per_op_{name}": (kind, args, {"whole_kernel_paths": False})
                    for name, (kind, args, _) in list(out.items())})
    return out


def sizes():
    """Every size, or those whose M is in $LINEAR_MS (a comma list) when it is set."""
    ms = [int(m) for m in os.environ["LINEAR_MS"].split(",")] if os.environ.get("LINEAR_MS") \
        else MS
    return [(M, N, K) for N, K in WEIGHTS for M in ms]


def wanted(cname: str) -> bool:
    """Whether candidate `cname` is built: all, or those starting with a prefix in
    $LINEAR_CANDIDATES (a comma list) when it is set."""
    prefixes = os.environ.get("LINEAR_CANDIDATES")
    return not prefixes or cname.startswith(tuple(prefixes.split(",")))


def size_name(M, N, K) -> str:
    return f"m{M}_n{N}_k{K}"


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for M, N, K in sizes():
        for cname, (kind, args, options) in candidates(M, N, K).items():
            if not wanted(cname):
                continue
            name = f"{size_name(M, N, K)}__{cname}"
            factory = tile_kernel if kind == "tile" else swap_kernel
            try:
                compiled, seconds = compile_into(out, name, factory(M, N, K, *args), TARGET,
                                                 **options)
                index[name] = {"M": M, "N": N, "K": K, "candidate": cname, "kind": kind,
                               "args": list(args), "options": options,
                               "block": list(compiled.manifest.block),
                               "cold_compile_s": round(seconds, 3)}
            except Exception as e:  # recorded: the run skips it
                index[name] = {"M": M, "N": N, "K": K, "candidate": cname,
                               "error": f"{type(e).__name__}: {e}"[:500]}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": build_command("linear.py", out,
                                 ("LINEAR_MS", "LINEAR_CANDIDATES", "LINEAR_PER_OP")),
        "machine": machine(), "target": TARGET, "kernels": index}, indent=1))


def graphed(torch, fn):
    return graph_replay(torch, fn, GRAPH_CALLS)


def caller(torch, kern, meta, x, w):
    """(the zero-argument call a user of this candidate runs, its output tensor)."""
    M, N = meta["M"], meta["N"]
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    if meta["kind"] == "swap" and meta["args"][3] > 1:  # float32 partials per split
        partials = torch.empty(meta["args"][3], M, N, device="cuda", dtype=torch.float32)

        def call():
            kern(x, w, partials)
            y.copy_(partials.sum(0))
        return call, y
    return (lambda: kern(x, w, y)), y


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name in smoke_order(n for n, m in index["kernels"].items() if "error" not in m):
        meta = index["kernels"][name]
        x = torch.randn(meta["M"], meta["K"], device="cuda", dtype=torch.bfloat16)
        w = torch.randn(meta["N"], meta["K"], device="cuda", dtype=torch.bfloat16)
        call, _ = caller(torch, load_kernel(bundle, name), meta, x, w)
        call()
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


ONE_SIZE_ENV = "LINEAR_ONE_SIZE"  # set by run() for the child that times one size


def time_size(bundle: Path, index: dict, M: int, N: int, K: int) -> dict:
    """One size's row: every correct candidate and F.linear, graph-replayed, interleaved."""
    import torch
    from triton.testing import do_bench

    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    ref = torch.nn.functional.linear(x, w)
    calls, errs = {"F.linear": graphed(torch, lambda: torch.nn.functional.linear(x, w))}, {}
    for name, meta in index["kernels"].items():
        if (meta["M"], meta["N"], meta["K"]) != (M, N, K) or "error" in meta:
            continue
        call, y = caller(torch, load_kernel(bundle, name), meta, x, w)
        y.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        errs[meta["candidate"]] = float((y.float() - ref.float()).norm() /
                                        ref.float().norm())
        if errs[meta["candidate"]] < 1e-2:
            calls[meta["candidate"]] = graphed(torch, call)
    samples = {c: [] for c in calls}
    for _ in range(ROUNDS):
        for c, fn in calls.items():
            samples[c].append(do_bench(fn) / GRAPH_CALLS)
    us = {c: statistics.median(v) * 1e3 for c, v in samples.items()}
    best = min((c for c in us if c != "F.linear"), key=us.get, default=None)
    return {"M": M, "N": N, "K": K, "us": us, "rel_err_vs_F.linear": errs, "choice": best,
            "ratio": us["F.linear"] / us[best] if best else None}


def run(bundle: Path, out: Path) -> None:
    """The smoke run (hung kernels are left out), then each size timed in its own child
    process, so that a kernel that faults costs its size's row, not the run's."""
    index = json.loads((bundle / "index.json").read_text())
    if os.environ.get(ONE_SIZE_ENV):
        index["kernels"] = json.loads(os.environ[ONE_SIZE_ENV])
        M, N, K = next(iter(index["kernels"].values()))["shape"]
        print("ROW " + json.dumps(time_size(bundle, index, M, N, K)), flush=True)
        return
    hung = smoke_in_child(__file__, bundle, 300, stall_s=10)
    for name in hung:
        index["kernels"][name]["error"] = "hung in the smoke run"
    rows = {}
    built = {(m["M"], m["N"], m["K"]) for m in index["kernels"].values()}
    for M, N, K in sorted(built, key=lambda s: (WEIGHTS.index((s[1], s[2])), s[0])):
        mine = {n: dict(m, shape=[M, N, K]) for n, m in index["kernels"].items()
                if (m["M"], m["N"], m["K"]) == (M, N, K)}
        env = dict(os.environ, **{ONE_SIZE_ENV: json.dumps(mine)})
        child = subprocess.run([sys.executable, __file__, "run", "--bundle", str(bundle)],
                               capture_output=True, text=True, env=env, timeout=240)
        row = next((json.loads(line[4:]) for line in child.stdout.splitlines()
                    if line.startswith("ROW ")), None)
        if row is None:
            row = {"M": M, "N": N, "K": K, "error": (child.stderr.strip().splitlines()
                                                     or ["no output"])[-1]}
        rows[size_name(M, N, K)] = row
        print(f"{size_name(M, N, K)}: " + (
            f"F.linear {row['us']['F.linear']:.1f} us, best {row['choice']} "
            f"{row['us'].get(row['choice'], float('nan')):.1f} us ({row['ratio'] or 0:.3f}x)"
            if "error" not in row else f"FAILED: {row['error']}"), flush=True)
        write_results(out, "linear.py", bundle, index, rounds=ROUNDS, graph_calls=GRAPH_CALLS,
                      hung=hung, rows=rows)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "linear"))
