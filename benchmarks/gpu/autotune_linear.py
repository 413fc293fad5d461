"""tiled.ops.linear tuned by tiled.autotune on the H200 (issue 13's autotuner table): Llama-3-8B
and -70B projection shapes (q / k,v / o, gate,up / down) at M = 1 .. 8192, bf16, against
F.linear in the same process; the time each first tuning took; then a second process that
must take every winner from the cache without timing anything (tiled.tuning.STATS).

Here (the CPU machine, with TVM): every config of tiled.ops.linear's CUDA space that some M
uses, per weight shape (the kernels' M is symbolic: one program per shape and config)
    python benchmarks/gpu/autotune_linear.py build --out .gpu/autotune_linear
There (device tool, carry=[".gpu"]; no compiler, no daemon: tiled.tuning.prebuilt hands the
tuner the bundle's kernels instead of compiling)
    python3 benchmarks/gpu/autotune_linear.py run --bundle .gpu/autotune_linear \\
        --out $OUT/autotune_linear_h200.json

Timing of the tuned call against F.linear: each graph-replayed GRAPH_CALLS times, medians of
ROUNDS interleaved rounds (do_bench, 10 ms warm-up, 40 ms of replays each; `us`, `ratio`:
calls back to back, a weight that fits the 50 MiB L2 stays there), and as the tuner times
its candidates, the L2 flushed before each call (`cold_us`, `cold_ratio`: how a serving step
meets its weights).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    build_command,
    compile_into,
    compile_sums,
    install_sums,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    smoke_order,
    write_results,
)
from bundle_cli import graphed as graph_replay

TARGET = "cuda:sm_90a"
SHAPES = {  # (N, K) of x @ W^T
    "8b_q_o": (4096, 4096), "8b_kv": (1024, 4096), "8b_gate_up": (14336, 4096),
    "8b_down": (4096, 14336), "70b_q_o": (8192, 8192), "70b_kv": (1024, 8192),
    "70b_gate_up": (28672, 8192), "70b_down": (8192, 28672)}
MS = (1, 16, 64, 256, 1024, 4096, 8192)
# Build filters (issue 12's table: AUTOTUNE_LINEAR_SHAPES=8b_q_o,8b_gate_up,8b_down
# AUTOTUNE_LINEAR_MS=1,16,64,128,1024,4096); the bundle's index keeps them for the run.
SELECT_ENV = ("AUTOTUNE_LINEAR_SHAPES", "AUTOTUNE_LINEAR_MS", "AUTOTUNE_LINEAR_LAST")
# AUTOTUNE_LINEAR_LAST=1: the bundle also holds tiled.ops.gemm.LAST_SUM_CONFIGS' kernels
# (split-K summed in the GEMM kernel: not in the tuner's space; probes/split_sum_probe.py)
ROUNDS = 3
GRAPH_CALLS = 20
PHASE_ENV = "AUTOTUNE_LINEAR_PHASE"
HUNG_ENV = "AUTOTUNE_LINEAR_HUNG"  # kernels the smoke run found hanging: left out of the tuning
SMOKED_ENV = "AUTOTUNE_LINEAR_SMOKED"  # set (to the hung kernels, or empty): no smoke run here


def build(out: Path) -> None:
    from tiled.ops.gemm import CUDA_SPACE, LAST_SUM_CONFIGS, _fits, linear_kernel

    space = CUDA_SPACE + (LAST_SUM_CONFIGS if os.environ.get(SELECT_ENV[2]) == "1" else [])
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    old = out / "index.json"  # what an earlier build recorded of the kernels it made
    before = json.loads(old.read_text())["kernels"] if old.exists() else {}
    shapes, ms = _selection()
    for shape, (N, K) in shapes.items():
        for i, cfg in enumerate(space):
            m = next((m for m in ms if _fits(cfg, m)), None)
            if m is None:
                continue
            name = f"{shape}__c{i}"
            kernel = linear_kernel(m, N, K, "bfloat16", "bfloat16", **cfg)
            if _built(out, name, kernel):  # an earlier build of this bundle made it
                index[name] = before.get(name, {"N": N, "K": K, "config": cfg})
                continue
            _, seconds = compile_into(out, name, kernel, TARGET)
            index[name] = {"N": N, "K": K, "config": cfg, "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)

    sums = compile_sums(out, _sums(shapes), "bfloat16", TARGET)  # what split-K configs add
    index.update(sums)  # their partials up with
    print(*sums, flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": build_command("autotune_linear.py", out, SELECT_ENV),
        "machine": machine(), "target": TARGET, "shapes": shapes, "ms": ms,
        "kernels": index}, indent=1))


def _selection() -> tuple[dict, list[int]]:
    """(the weight shapes, the token counts) the build's environment selects (SELECT_ENV)."""
    names = os.environ.get(SELECT_ENV[0])
    shapes = {n: SHAPES[n] for n in names.split(",")} if names else dict(SHAPES)
    ms = os.environ.get(SELECT_ENV[1])
    return shapes, [int(m) for m in ms.split(",")] if ms else list(MS)


def _selected(bundle: Path) -> tuple[dict, list[int]]:
    """(weight shapes, token counts) the bundle was built for (all of them for an older one)."""
    index = json.loads((bundle / "index.json").read_text())
    return ({k: tuple(v) for k, v in index.get("shapes", SHAPES).items()},
            index.get("ms", list(MS)))


def _built(out: Path, name: str, kernel) -> bool:
    """Whether out/NAME holds this very program (same digest), compiled already."""
    m = out / f"{name}.manifest.json"
    if not m.exists() or not (out / f"{name}.cubin").exists():
        return False
    return json.loads(m.read_text()).get("program_digest") == kernel.ir.digest


def _sums(shapes: dict) -> set[tuple[int, int]]:
    """(N, splits) of each splitk_sum kernel the split configs add their partials with."""
    from tiled.ops.gemm import CUDA_SPACE

    splits = {c.get("splits", 1) for c in CUDA_SPACE} - {1}
    return {(n, s) for n, _ in shapes.values() for s in splits}


def _pairs(bundle: Path):
    index = json.loads((bundle / "index.json").read_text())
    hung = set(os.environ.get(HUNG_ENV, "").split(","))
    return [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
            for n, v in index["kernels"].items() if "op" not in v and n not in hung]


def _install_sums(bundle: Path) -> None:

    index = json.loads((bundle / "index.json").read_text())
    install_sums(bundle, index, TARGET)


def _phase(bundle: Path, phase: str) -> dict:
    """One process: every (shape, M) through tiled.ops.linear inside tiled.tuning.prebuilt;
    phase "tune" also times the tuned call against F.linear."""
    import torch
    from triton.testing import do_bench

    import tiled.ops as ops
    from tiled import tuning

    rows = []
    _install_sums(bundle)
    shapes, ms = _selected(bundle)
    with tuning.prebuilt(_pairs(bundle)):
        for shape, (N, K) in shapes.items():
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
            for m in ms:
                x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
                t0 = time.perf_counter()
                y = ops.linear(x, w)
                torch.cuda.synchronize()
                first_call_s = time.perf_counter() - t0
                ref = torch.nn.functional.linear(x, w)
                err = float((y.float() - ref.float()).norm() / ref.float().norm())
                from tiled.ops.gemm import LINEAR, token_bucket

                tuned = LINEAR.chosen[(TARGET, token_bucket(m, N, K, "bfloat16", "bfloat16"))]
                row = {"shape": shape, "M": m, "N": N, "K": K, "config": tuned.config,
                       "from_record": tuned.from_record, "first_call_s": first_call_s,
                       "rel_err_vs_F.linear": err,
                       "candidates": [{"config": c.config, "us": c.us, "skipped": c.skipped}
                                      for c in tuned.candidates
                                      if not (c.skipped or "").endswith(f"M = {m}")]}
                if phase == "tune":
                    calls = {"tiled": graph_replay(torch, lambda x=x, w=w: ops.linear(x, w),
                                                   GRAPH_CALLS),
                             "F.linear": graph_replay(torch, lambda x=x, w=w:
                                                      torch.nn.functional.linear(x, w),
                                                      GRAPH_CALLS)}
                    samples = {k: [] for k in calls}
                    for _ in range(ROUNDS):
                        for k, g in calls.items():
                            samples[k].append(do_bench(g, warmup=10, rep=40) / GRAPH_CALLS)
                    us = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
                    cold = _cold_us(torch, {"tiled": lambda x=x, w=w: ops.linear(x, w),
                                            "F.linear": lambda x=x, w=w:
                                            torch.nn.functional.linear(x, w)})
                    row.update(us=us, ratio=us["F.linear"] / us["tiled"], cold_us=cold,
                               cold_ratio=cold["F.linear"] / cold["tiled"])
                    print(f"{shape:12s} M={m:5d}: {row['ratio']:.3f}x F.linear (L2 flushed: "
                          f"{row['cold_ratio']:.3f}x), config {tuned.config}, tuned in "
                          f"{first_call_s:.1f} s, err {err:.1e}", flush=True)
                print("ROW " + json.dumps(row), flush=True)  # what a timed-out run still keeps
                rows.append(row)
    return {"rows": rows, "stats": dict(tuning.STATS)}


def _cold_us(torch, calls: dict) -> dict:
    """Microseconds of each call with the L2 flushed before it (the weights as a serving
    step meets them, after the other layers'), as the tuner times its candidates
    (tiled.tuning_bench._graph_time: GRAPH_CALLS x (flush, call) in a CUDA graph less the
    flushes alone), medians of ROUNDS interleaved rounds."""
    from tiled import tuning_bench as tb

    flush = torch.empty(tb.GRAPH_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    samples = {k: [] for k in calls}
    for _ in range(ROUNDS):
        for k, fn in calls.items():
            samples[k].append(tb._graph_time(torch, fn, flush, 10, 40))
    return {k: statistics.median(v) for k, v in samples.items()}


def run(bundle: Path, out: Path) -> None:
    if os.environ.get(PHASE_ENV):
        print("RESULT " + json.dumps(_phase(bundle, os.environ[PHASE_ENV])), flush=True)
        return
    if os.environ.get(SMOKED_ENV) is not None:  # smoked by an earlier call: its hung list
        hung = [n for n in os.environ[SMOKED_ENV].split(",") if n]
    else:
        hung = smoke_in_child(__file__, bundle, 240, stall_s=20)
    cache = tempfile.mkdtemp(prefix="tiled-autotune-cache-")
    phases = {}
    for phase, limit in (("tune", 400), ("reuse", 100)):
        env = dict(os.environ, **{PHASE_ENV: phase, "TILED_CACHE_DIR": cache,
                                  HUNG_ENV: ",".join(hung)})
        log = out.with_suffix(f".{phase}.log")
        with log.open("w") as f:  # streamed to a file: a child that runs out of time leaves
            try:                  # its finished rows behind
                subprocess.run([sys.executable, __file__, "run", "--bundle", str(bundle)],
                               env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
        lines = log.read_text().splitlines()
        print("\n".join(lines[-40:]), flush=True)
        phases[phase] = next((json.loads(line[7:]) for line in lines
                              if line.startswith("RESULT ")), None) or {
            "error": f"timed out after {limit} s" if timed_out else "no result",
            "rows": [json.loads(line[4:]) for line in lines if line.startswith("ROW ")]}
    reuse = phases["reuse"].get("stats", {})
    summary = {"hung_in_smoke": hung,
               "second_process_timed_candidates": reuse.get("candidates_timed"),
               "second_process_tunings": reuse.get("tunings"),
               "second_process_record_hits": reuse.get("record_hits")}
    print(summary, flush=True)
    write_results(out, "autotune_linear.py", bundle,
                  json.loads((bundle / "index.json").read_text()), rounds=ROUNDS,
                  graph_calls=GRAPH_CALLS, tune=phases["tune"], reuse=phases["reuse"],
                  summary=summary)


def smoke(bundle: Path) -> None:
    """Every candidate kernel launched once (as tiled.ops.linear runs it) at the first M it
    is for, its relative error against F.linear printed: a kernel that hangs is found here
    (smoke_in_child kills it and the tuning never sees it), not inside a tuning."""
    import torch

    from tiled.ops.gemm import _fits, _run

    _install_sums(bundle)
    index = json.loads((bundle / "index.json").read_text())["kernels"]
    names = [n for n, v in index.items() if "op" not in v]
    ms = _selected(bundle)[1]
    for name in smoke_order(names):
        meta = index[name]
        m = next(m for m in ms if _fits(meta["config"], m))
        x = torch.randn(m, meta["K"], device="cuda", dtype=torch.bfloat16)
        w = torch.randn(meta["N"], meta["K"], device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, meta["N"], device="cuda", dtype=torch.bfloat16)
        _run(load_kernel(bundle, name), meta["config"], [x, w, y])
        ref = torch.nn.functional.linear(x, w).float()
        err = float((y.float() - ref).norm() / ref.norm())
        print(f"smoke {name}: M={m} {meta['config']} err {err:.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "autotune_linear"))
