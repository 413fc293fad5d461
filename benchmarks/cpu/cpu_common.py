"""What the CPU benchmarks share: the BLAS numpy runs on (which OpenBLAS kernel, how many
threads), thread counts matched between numpy and tiled, wall-clock timing with its spread,
and the result file.

Run each benchmark with OpenBLAS's own variables unset for that command only, so that numpy
picks the kernel it would pick by itself (`env -u OPENBLAS_CORETYPE ...`); the result records
what was set and which kernel ran (threadpoolctl: `pip install threadpoolctl`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import header, load_average  # benchmarks/common.py

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                  "OPENBLAS_VERBOSE", "GOTO_NUM_THREADS")


def blas_info() -> dict:
    """numpy's BLAS as it runs: threadpoolctl's view (library, version, runtime kernel,
    threads) and the OpenBLAS variables of this process's environment."""
    import threadpoolctl

    pools = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
    return {"libraries": [{k: p.get(k) for k in ("internal_api", "version", "architecture",
                                                 "num_threads", "threading_layer", "filepath")}
                          for p in pools],
            "environment": {v: os.environ.get(v) for v in BLAS_VARIABLES}}


def blas_threads() -> int:
    """The thread count numpy's BLAS uses: run tiled's kernels with as many
    (`config.override(cpu_threads=...)` before the first kernel loads; a process's CPU
    kernels share one pool)."""
    info = blas_info()["libraries"]
    return int(info[0]["num_threads"]) if info else os.cpu_count() or 1


def timings(fn, repeat: int, warmup: int = 2) -> dict:
    """Wall-clock seconds of `repeat` calls after `warmup`: best, median and the spread
    (max / min - 1) that says how noisy the machine was."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"best_s": min(ts), "median_s": statistics.median(ts),
            "spread": round(max(ts) / min(ts) - 1, 3), "n": repeat}


def idle_fraction(seconds: float = 1.0) -> float | None:
    """The share of the machine's CPU time that was idle over the next `seconds` (from
    /proc/stat): how much other work shared the CPUs. None where /proc/stat is missing."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total
    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return None
    return round((idle1 - idle0) / max(1, total1 - total0), 3)


def git_commit() -> str | None:
    """The checkout's commit, "+dirty" when files differ from it; None outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")


def start(argv: list[str]) -> dict:
    """What a result records before the run: command, date, machine (load average now), the
    checkout's commit, and the share of CPU time other work left idle over one second."""
    idle = idle_fraction()
    return {**header(argv), "git_commit": git_commit(), "cpu_idle_before": idle}


def write_result(path: Path, head: dict, body: dict) -> None:
    out = {**head, "blas": blas_info(), **body, "load_average_at_end": load_average()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def run_c_program(source: Path, flags: list[str]) -> list[dict]:
    """Compiles the C benchmark `source` with the C compiler (`cc -O3 -pthread`, plus
    `flags`), runs it and returns the JSON objects it printed, one a line."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / source.stem
        subprocess.run(["cc", "-O3", *flags, "-pthread", str(source), "-o", str(exe), "-lm"],
                       check=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def rows_cols_main(doc: str, bench_dtype, default_out: Path) -> None:
    """The command line of a benchmark over a rows x cols tensor per dtype (membound.py,
    folds.py): `bench_dtype(rows, cols, dtype, repeat)` for each dtype, on numpy's BLAS
    thread count, into one result file."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--out", type=Path, default=default_out)
    args = p.parse_args()

    from tiled import config

    threads = blas_threads()
    head = start(sys.argv)  # before this process loads the CPUs
    with config.override(cpu_threads=threads):
        results = {d: bench_dtype(args.rows, args.cols, d, args.repeat) for d in args.dtypes}
    write_result(args.out, head, {"threads": threads, "rows": args.rows, "cols": args.cols,
                                  "results": results})


# -- tiled.ops against torch's CPU ops (linear.py, grouped.py, attention.py, conv.py) -------

# OpenBLAS's worker threads spin for a while after each call before they sleep (its
# THREAD_TIMEOUT, 2^28 cycles by default: about 0.1 s here); a tiled call right after a numpy
# call ran beside them on this 2-core machine and read 0.64-0.69x where it reads 0.75-0.81x
# after a pause (examples/gemm.py at 1024^3, 2026-12-03). tiled's pool spins far shorter
# (TILED_CPU_SPIN_US, 200 us by default) before it sleeps. Each timed call therefore starts
# after this pause, numpy's too.
SETTLE_S = 0.25


def interleaved(fns: dict, repeat: int) -> dict:
    """Best seconds of each named call over `repeat` rounds of one call each, each call after
    a pause of SETTLE_S."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            time.sleep(SETTLE_S)
            best[k] = min(best[k], timings(fn, 1, warmup=0)["best_s"])
    return best


def round_times(calls: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each named call in each of `rounds` rounds (the calls one after another in
    a round, no pause: builds compared in one process meet the same moment's load), after
    one warm call each."""
    for fn in calls.values():
        fn()
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def shuffled_round_times(calls: dict, rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """As round_times, the calls of each round in an order shuffled per round (seeded), so
    that no build always follows the same one (the machine's bandwidth drifts within a
    round too); no warm call."""
    order = random.Random(seed)
    times = {k: [] for k in calls}
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for k in names:
            t0 = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def gflops(best: dict, flop: float) -> dict:
    """ms, GFLOP/s and tiled's ratio to each reference from `interleaved`'s best seconds."""
    rates = {k: round(flop / s / 1e9, 1) for k, s in best.items()}
    return {"ms": {k: round(s * 1e3, 3) for k, s in best.items()}, "gflops": rates,
            "ratio": {f"tiled_over_{k}": round(rates["tiled"] / v, 3)
                      for k, v in rates.items() if k != "tiled"}}


def each_config_then_tuned(op, fits, call, check, refs: dict, flop: float, repeat: int,
                           label: str) -> dict:
    """A tiled.ops op (its TunedOp `op`) on CPU tensors: the op restricted to each config of
    its CPU space that `fits`, then the op as a user calls it (tuned, then timed), each in
    rounds with `refs`. `call()` runs the op, `check(y)` returns its error. Returns the tuned
    op's fields (tuning_s, chosen, rel_err, ms, gflops, ratio) and `configs`."""
    space = op.spaces["cpu"]
    configs = []
    try:
        for cfg in filter(fits, space):
            op.spaces["cpu"] = [cfg]  # the op with this config only
            op.clear()
            err = check(call())
            configs.append({"config": cfg, "rel_err": err,
                            **gflops(interleaved({"tiled": call, **refs}, repeat), flop)})
            print(f"{label} {cfg}: {configs[-1]['gflops']}", flush=True)
    finally:
        op.spaces["cpu"] = space
        op.clear()
    t0 = time.perf_counter()
    err = check(call())  # the first call tunes
    tune_s = time.perf_counter() - t0
    chosen = next(t.config for t in op.chosen.values())
    row = {"tuning_s": round(tune_s, 2), "chosen": chosen, "rel_err": err,
           **gflops(interleaved({"tiled": call, **refs}, repeat), flop), "configs": configs}
    print(f"{label} tiled.ops.{op.name} (tuned in {tune_s:.1f} s: {chosen}): "
          f"{row['gflops']}, {row['ratio']}", flush=True)
    return row


def run_rows(out: Path, prefix: str, rows_of) -> None:
    """Runs `rows_of()` on numpy's BLAS thread count (torch's and tiled's pools alike) with
    a fresh tiled cache (so that the ops tune), and writes its rows with torch's version."""
    import tempfile

    import torch

    from tiled import config

    threads = blas_threads()
    torch.set_num_threads(threads)
    head = start(sys.argv)
    with config.override(cpu_threads=threads,
                         cache_dir=Path(tempfile.mkdtemp(prefix=prefix))):
        rows = rows_of()
    write_result(out, head, {"threads": threads, "torch": torch.__version__, "rows": rows})
