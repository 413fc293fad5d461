"""tiled.ops.grouped.grouped_linear (the GEMM of a mixture of experts, one launch) on the H200:
tuned by tiled.autotune from a bundle, then timed against a Python loop over the experts of
F.linear's GEMM and against torch._grouped_mm (when this torch has it), at Mixtral-8x7B-like
(8 experts) and DeepSeek-like (64 experts) expert shapes, bf16.

Here (the CPU machine, with TVM): every config of the CUDA space per expert shape (T is
symbolic: one program per shape and config serves every token count)
    python benchmarks/gpu/grouped.py build --out .gpu/grouped
There (device tool, carry=[".gpu"]; no compiler: tiled.tuning.prebuilt hands the tuner the
bundle's kernels): a smoke child launches every kernel once on a ragged routing (experts
without tokens, tails off the tile) against the loop, then a child tunes and times
    python3 benchmarks/gpu/grouped.py run --bundle .gpu/grouped --out $OUT/grouped_h200.json

Routings of ROWS routed rows (tokens x top-k): `balanced`, rows / E each; `skewed`, counts
proportional to 1 / (e + 1) with the last expert given none. The loop is handed the offsets
on the host (a model reads them from the device: a sync its timing leaves out) and writes
each expert's rows in place (torch.mm into y's rows, F.linear's GEMM without the copy of a
torch.cat). torch._grouped_mm takes bf16 only, mat_b [E, K, N] column-major in its last two
dims (w.transpose(1, 2) of F.linear's weights: no copy) and the int32 group ends
offsets[1:]. Timing: each call captured GRAPH_CALLS times in a CUDA graph, the replay timed
by do_bench, medians of ROUNDS interleaved rounds.

Runs on the H200 (torch 2.11): grouped_h200_before_swap.json (tiles only): against the loop
0.70-0.74x (Mixtral w1) and 0.89-0.90x (w2) at 256 rows, 1.13-1.59x over 64 experts.
grouped_h200.json (2026-12-02, with the swapped tiles): at 256 rows Mixtral w1 0.80-0.87x,
w2 0.82-0.95x, 64 experts 1.27-1.70x the loop (swaps chosen everywhere there); at 8192 and
32768 rows (tiles) 0.83-0.94x over 8 experts, 0.88-1.56x over 64; against
torch._grouped_mm 0.86-1.34x.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    compile_into,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    smoke_order,
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
SHAPES = {  # name: (E, N, K) of y = x @ w[e].T, and the routed row counts timed
    "mixtral_w1": ((8, 14336, 4096), (256, 8192)),
    "mixtral_w2": ((8, 4096, 14336), (256, 8192)),
    "deepseek_w1": ((64, 2048, 7168), (256, 8192, 32768)),
    "deepseek_w2": ((64, 7168, 2048), (256, 8192, 32768)),
}
SMOKE_ROWS = 5000  # E = 8: full and partial tiles of every BM; E = 64: some full too
ROUNDS = 3
GRAPH_CALLS = 10
PHASE_ENV = "GROUPED_PHASE"
TIME_LIMIT_S = 380


def build(out: Path) -> None:
    from tiled.ops.grouped import COMPILE_OPTIONS, CUDA_SPACE, grouped_kernel

    out.mkdir(parents=True, exist_ok=True)
    index, t0 = {}, time.perf_counter()
    for shape, ((E, N, K), rows) in SHAPES.items():
        for i, cfg in enumerate(CUDA_SPACE):
            name = f"{shape}__c{i}"
            kernel = grouped_kernel(rows[0], E, N, K, "bfloat16", **cfg)
            compiled, seconds = compile_into(out, name, kernel, TARGET, **COMPILE_OPTIONS)
            index[name] = {"E": E, "N": N, "K": K, "config": cfg,
                           "block": list(compiled.manifest.block),
                           "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    build_s = time.perf_counter() - t0
    print(f"built {len(index)} kernels in {build_s:.1f} s", flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/grouped.py build --out {out}", "machine": machine(),
        "target": TARGET, "build_s": round(build_s, 1), "kernels": index}, indent=1))


def _pairs(bundle: Path):
    index = json.loads((bundle / "index.json").read_text())
    return [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
            for n in index["kernels"]]


def routing(rows: int, E: int, kind: str) -> list[int]:
    """Rows per expert: `balanced`, `skewed` (module docstring) or `ragged` (the smoke's:
    every third expert none, the rest uneven)."""
    if kind == "balanced":
        return [(e + 1) * rows // E - e * rows // E for e in range(E)]
    if kind == "skewed":
        weights = [1 / (e + 1) for e in range(E - 1)] + [0.0]
    else:
        weights = [0.0 if e % 3 == 1 else 1 + (7 * e) % 5 for e in range(E)]
    counts = [int(rows * w / sum(weights)) for w in weights]
    counts[0] += rows - sum(counts)
    return counts


def _tensors(torch, E: int, N: int, K: int, counts: list[int]):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(sum(counts), K, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
    ends = [0]
    for c in counts:
        ends.append(ends[-1] + c)
    return x, w, ends, torch.tensor(ends, device="cuda", dtype=torch.int32)


def _loop(torch, x, w, ends: list[int]):
    """y by one GEMM per expert, into its rows of y."""
    y = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
    for e in range(w.shape[0]):
        if ends[e] < ends[e + 1]:
            torch.mm(x[ends[e]:ends[e + 1]], w[e].t(), out=y[ends[e]:ends[e + 1]])
    return y


def _rel_err(y, ref) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def smoke(bundle: Path) -> None:
    """Every kernel once, by hand (its tile table, no tuner), on a ragged routing."""
    import torch

    from tiled.ops.grouped import tile_table

    index = json.loads((bundle / "index.json").read_text())
    made = {}
    for name in smoke_order(index["kernels"]):
        meta = index["kernels"][name]
        E, N, K = meta["E"], meta["N"], meta["K"]
        if (E, N, K) not in made:
            made.clear()  # one shape's weights at a time
            x, w, ends, offsets = _tensors(torch, E, N, K, routing(SMOKE_ROWS, E, "ragged"))
            made[(E, N, K)] = x, w, ends, offsets, _loop(torch, x, w, ends)
        x, w, ends, offsets, ref = made[(E, N, K)]
        y = torch.full_like(ref, float("nan"))
        load_kernel(bundle, name)(x, w.view(E * N, K),
                                  tile_table(offsets, x.shape[0], meta["config"]["BM"]), y)
        torch.cuda.synchronize()
        err = _rel_err(y, ref)
        if not err < 2e-2:  # NaN too: a row left unwritten
            raise SystemExit(f"smoke {name}: wrong result (rel err {err:.2e})")
        same = _overlap_identical(torch, load_kernel(bundle, name), x, w, ends,
                                  meta["config"]["BM"])
        print(f"smoke {name}: rel err {err:.1e}, overlapping rows bitwise equal: {same}",
              flush=True)


def _overlap_identical(torch, kernel, x, w, ends: list[int], BM: int) -> bool | None:
    """Whether the rows an expert's last tile shares with the tile before it come out the same
    from both tiles (each launched alone), for the first expert that has such rows."""
    E, N, K = w.shape
    for e in range(E):
        count = ends[e + 1] - ends[e]
        if count > BM and count % BM:
            last, before = ends[e + 1] - BM, ends[e] + (count // BM - 1) * BM
            break
    else:
        return None
    out = []
    for first in (before, last):
        y = torch.full((x.shape[0], N), float("nan"), device=x.device, dtype=x.dtype)
        table = torch.tensor([[e, first, BM]], device=x.device, dtype=torch.int32)
        kernel(x, w.view(E * N, K), table, y)
        out.append(y[last:before + BM])
    return bool(torch.equal(*out))


def _phase(bundle: Path) -> dict:
    """Every (shape, rows, routing) through grouped_linear inside tiled.tuning.prebuilt (the
    first call of a bucket tunes), timed beside the loop and torch._grouped_mm."""
    import torch

    from tiled import tuning
    from tiled.ops import grouped

    grouped_mm = getattr(torch, "_grouped_mm", None)
    rows_out = []
    with tuning.prebuilt(_pairs(bundle)):
        for shape, ((E, N, K), row_counts) in SHAPES.items():
            for rows in row_counts:
                for kind in ("balanced", "skewed"):
                    x, w, ends, offsets = _tensors(torch, E, N, K, routing(rows, E, kind))
                    t0 = time.perf_counter()
                    y = grouped.grouped_linear(x, w, offsets)
                    torch.cuda.synchronize()
                    first_call_s = time.perf_counter() - t0
                    ref = _loop(torch, x, w, ends)
                    tuned = grouped.GROUPED.chosen[(TARGET, grouped.token_bucket(
                        rows, E, N, K, "bfloat16"))]
                    row = {"shape": shape, "E": E, "N": N, "K": K, "rows": rows,
                           "routing": kind, "config": tuned.config,
                           "first_call_s": round(first_call_s, 3),
                           "rel_err_vs_loop": _rel_err(y, ref)}
                    calls = {"tiled": lambda x=x, w=w, o=offsets: grouped.grouped_linear(x, w, o),
                             "loop": lambda x=x, w=w, ends=ends: _loop(torch, x, w, ends)}
                    if grouped_mm is not None:
                        wt, o = w.transpose(1, 2), offsets[1:]
                        try:
                            row["rel_err_grouped_mm"] = _rel_err(grouped_mm(x, wt, offs=o), ref)
                            calls["torch._grouped_mm"] = lambda x=x, wt=wt, o=o: grouped_mm(
                                x, wt, offs=o)
                        except RuntimeError as e:  # its layout or dtype requirements
                            row["grouped_mm_error"] = str(e)[:300]
                    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS)
                    flops = 2 * rows * N * K
                    row.update(us=us, tflops={k: flops / (t * 1e6) for k, t in us.items()},
                               speedup_vs_loop=us["loop"] / us["tiled"])
                    if "torch._grouped_mm" in us:
                        row["speedup_vs_grouped_mm"] = us["torch._grouped_mm"] / us["tiled"]
                    print(f"{shape:12s} rows={rows:6d} {kind:8s}: "
                          + ", ".join(f"{k} {t:8.1f} us" for k, t in us.items())
                          + f"; config {tuned.config}, err {row['rel_err_vs_loop']:.1e}",
                          flush=True)
                    print("ROW " + json.dumps(row), flush=True)  # kept if the child times out
                    rows_out.append(row)
                    del x, w, offsets, y, ref, calls
                    torch.cuda.empty_cache()
    return {"rows": rows_out, "stats": dict(tuning.STATS),
            "has_grouped_mm": grouped_mm is not None}


def run(bundle: Path, out: Path) -> None:
    if os.environ.get(PHASE_ENV):
        print("RESULT " + json.dumps(_phase(bundle)), flush=True)
        return
    hung = smoke_in_child(__file__, bundle, timeout_s=150, stall_s=30)
    if hung:
        raise SystemExit(f"kernels hung in the smoke run: {hung}; not timing")
    log = out.with_suffix(".log")
    with log.open("w") as f:  # streamed to a file: a child that runs out of time leaves its
        try:                  # finished rows behind
            subprocess.run([sys.executable, __file__, "run", "--bundle", str(bundle)],
                           env=dict(os.environ, **{PHASE_ENV: "time"}), stdout=f,
                           stderr=subprocess.STDOUT, timeout=TIME_LIMIT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    lines = log.read_text().splitlines()
    print("\n".join(lines[-60:]), flush=True)
    result = next((json.loads(line[7:]) for line in lines if line.startswith("RESULT ")), None)
    if result is None:
        result = {"error": f"timed out after {TIME_LIMIT_S} s" if timed_out else "no result",
                  "rows": [json.loads(line[4:]) for line in lines if line.startswith("ROW ")]}
    write_results(out, "grouped.py", bundle, json.loads((bundle / "index.json").read_text()),
                  rounds=ROUNDS, graph_calls=GRAPH_CALLS, **result)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "grouped"))
