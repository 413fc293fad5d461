"""What the GPU benchmarks that travel as a bundle share: the `build | run | smoke` command line,
and the guarded smoke step (every kernel launched once in a child process with a timeout, so
that a hanging kernel costs seconds of device time, not the whole call)."""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def compile_into(out: Path, name: str, kernel, target: str = "cuda:sm_90a", **options):
    """Compiles `kernel` cold (no cache, compile `options`) into out/NAME.cubin +
    NAME.manifest.json; returns (the compiled kernel, seconds the compile took). A kernel of
    several launches (tiled.sequence) writes NAME.1.*, NAME.2.* for the later ones and
    NAME.launches with their count."""
    import tiled

    t0 = time.perf_counter()
    compiled = tiled.compile(kernel, target=target, cache=False, **options)
    seconds = time.perf_counter() - t0
    kernels = getattr(compiled, "kernels", [compiled])
    for i, k in enumerate(kernels):
        stem = name if i == 0 else f"{name}.{i}"
        (out / f"{stem}.cubin").write_bytes(k.artifact)
        (out / f"{stem}.manifest.json").write_text(k.manifest.to_json())
    if len(kernels) > 1:
        (out / f"{name}.launches").write_text(f"{len(kernels)}\n")
    return compiled, seconds


def build_command(script: str, out: Path, env: tuple[str, ...] = ()) -> str:
    """The command line that built a bundle into `out`, with those of the environment
    variables `env` (a script's build filters) that are set, as the index records it."""
    return " ".join([f"{v}={shlex.quote(os.environ[v])}" for v in env if os.environ.get(v)]
                    + [f"python benchmarks/gpu/{script} build --out {out}"])


def compile_sums(out: Path, pairs, dtype: str, target: str = "cuda:sm_90a") -> dict:
    """The splitk_sum kernels tiled.ops adds split-K partials with, one per (N, splits) of
    `pairs`, compiled into `out` as tiled.ops asks for them (gemm.sum_params); returns their
    index entries by name (install_sums loads them there)."""
    import tiled.ops as ops
    from tiled.ops.split_k import sum_params

    index = {}
    for n, splits in sorted(pairs):
        params = sum_params(n, splits, dtype)
        name = f"splitk_sum__{n}x{splits}"
        _, seconds = compile_into(out, name, ops.kernel_factory("splitk_sum", target, **params),
                                  target)
        index[name] = {"op": "splitk_sum", "params": params, "cold_compile_s": round(seconds, 3)}
    return index


def install_sums(bundle: Path, index: dict, target: str = "cuda:sm_90a") -> None:
    """Installs into tiled.ops the bundle's splitk_sum kernels (compile_sums' entries of the
    build's index), which tiled.ops would otherwise compile (no TVM on the GPU machine)."""
    import tiled.ops as ops

    for name, v in index["kernels"].items():
        if v.get("op") == "splitk_sum":
            ops.install("splitk_sum", target, load_kernel(bundle, name), **v["params"])


def load_kernel(bundle: Path, name: str):
    """The kernel compile_into wrote as NAME into `bundle`, loaded by the thin runtime (no GPU
    call until its first launch); a tiled.sequence.CompiledSequence for several launches."""
    from tiled.runtime import load
    from tiled.sequence import CompiledSequence

    count = bundle / f"{name}.launches"
    n = int(count.read_text()) if count.exists() else 1
    kernels = [load((bundle / f"{stem}.cubin").read_bytes(),
                    (bundle / f"{stem}.manifest.json").read_text())
               for stem in [name] + [f"{name}.{i}" for i in range(1, n)]]
    return kernels[0] if n == 1 else CompiledSequence(name, kernels)


def load_bundle(bundle: Path) -> tuple[dict, dict]:
    """(the build's index.json, name -> loaded kernel for each of its "kernels")."""
    index = json.loads((bundle / "index.json").read_text())
    return index, {name: load_kernel(bundle, name) for name in index["kernels"]}


def labelled_dir(out: Path, env: str, default: str) -> tuple[str, Path, str]:
    """For a twins probe (one bundle, a folder per label, each built at its own commit):
    (the label $`env` names, else `default`; its folder under `out`, made; the checkout's
    short commit)."""
    label = os.environ.get(env, default)
    where = out / label
    where.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                            capture_output=True, text=True).stdout.strip()
    return label, where, commit


def labelled_indexes(bundle: Path) -> dict:
    """A twins probe's bundle: label -> the index.json of its folder."""
    return {p.name: json.loads((p / "index.json").read_text())
            for p in sorted(bundle.iterdir()) if (p / "index.json").exists()}


def write_labelled_rows(out: Path, labels: dict, rows: list) -> None:
    """A twins probe's result: each label's commit (labelled_indexes) and the rows."""
    out.write_text(json.dumps({"labels": {k: v["commit"] for k, v in labels.items()},
                               "rows": rows}, indent=1))


def machine() -> dict:
    """Where a bundle was built."""
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}


BAD_ERROR = 0.1  # a relative error above this is a wrong kernel, not rounding


def bad_numerics(value, path: str = "") -> list[str]:
    """The places in a results tree whose relative-error entries (keys naming `err`, not
    absolute ones) exceed BAD_ERROR or are NaN: a speed number of a wrong kernel means
    nothing (the rotary kernel's 0.71 went unnoticed in a JSON once)."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if "err" in str(k) and "abs" not in str(k) and isinstance(v, float) and \
                    not v <= BAD_ERROR:
                out.append(f"{here} = {v}")
            else:
                out += bad_numerics(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += bad_numerics(v, f"{path}[{i}]")
    return out


def write_results(out: Path, script: str, bundle: Path, build: dict, **fields) -> None:
    """A GPU run's JSON: the command that made it (with the *_PARTS variables that chose its
    parts), the build's index, the device, versions, the date, then `fields` (the rows), and
    `bad_numerics` (bad_numerics's list, printed too: empty for a run to trust)."""
    import torch
    import triton

    bad = bad_numerics(fields)
    for line in bad:
        print(f"BAD NUMERICS {line}", flush=True)
    fields["bad_numerics"] = bad
    env = "".join(f"{k}={v} " for k, v in sorted(os.environ.items()) if k.endswith("_PARTS"))
    out.write_text(json.dumps({
        "command": f"{env}python3 benchmarks/gpu/{script} run --bundle {bundle} --out {out}",
        "build": build, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}, indent=1))


def tuning_records() -> list[dict]:
    """The tunings this host's kernel cache holds (tiled.autotune records them in the
    manifest notes of the winner): each one's factory, winning config and every candidate's
    time (us by config index) and skip reason, for a results file."""
    from tiled.cache.tiered import default_cache

    cache, out = default_cache(), []
    keys = cache.keys()
    for key in keys:
        entry = cache.get(key)
        notes = json.loads(entry.manifest).get("notes") or {} if entry else {}
        if "tiled.autotune" in notes:
            out.append(notes["tiled.autotune"])
    return out


def graphed(torch, fn, calls: int):
    """fn captured `calls` times in a CUDA graph (after one warm-up call on a side stream):
    the graph's replay, for timing launches that cost less device time than host time."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()

    def replay():
        g.replay()
    # The graph holds the addresses of fn's tensors, not the tensors: fn (and what its
    # closure holds) must live as long as the replay. Without this, a caller that dropped fn
    # had its output freed, and the next capture's empty_cache unmapped it under the graph
    # (illegal address on replay, seen on the H200).
    replay.fn = fn
    return replay


def time_graphed(torch, calls: dict, rounds: int, graph_calls: int, rep_ms: int = 40) -> dict:
    """Median microseconds per call of each callable in `calls`, each replayed from a CUDA
    graph of `graph_calls` calls, do_bench (10 ms warm-up, `rep_ms` of replays) in `rounds`
    rounds that interleave the callables (the clock drifts as the GPU heats)."""
    import statistics

    from triton.testing import do_bench

    graphs = {k: graphed(torch, fn, graph_calls) for k, fn in calls.items()}
    samples = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            samples[k].append(do_bench(g, warmup=10, rep=rep_ms) / graph_calls)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


SKIP_ENV = "TILED_SMOKE_SKIP"


def rotated_medians(calls: dict, rounds: int, bench) -> dict:
    """name -> the median over `rounds` rounds of `bench(fn)` (triton's do_bench: ms) for
    each of `calls`, the order rotated each round so that none always runs first (the
    H200's clock falls as it heats)."""
    import statistics

    samples = {n: [] for n in calls}
    for r in range(rounds):
        names = list(calls)
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples[n].append(bench(calls[n]))
    return {n: statistics.median(v) for n, v in samples.items()}


def smoke_order(names):
    """The kernels a smoke child launches, in order: `names` less those the parent marked
    hung (SKIP_ENV), each announced before its launch so the parent knows which one hangs."""
    skip = set(os.environ.get(SKIP_ENV, "").split(","))
    for name in names:
        if name not in skip:
            print(f"smoke-start {name}", flush=True)
            yield name


def smoke_in_child(script: str, bundle: Path, timeout_s: float,
                   stall_s: float | None = None) -> list[str]:
    """Runs `script smoke --bundle BUNDLE` in a child, its output passed through as it comes.
    Without `stall_s`, any failure or a run past `timeout_s` ends the benchmark. With it, a
    kernel announced by smoke_order that prints nothing for `stall_s` seconds is taken as
    hung: the child is killed and run again on the kernels not yet launched. Returns the
    hung kernels' names."""
    import selectors

    deadline, hung, passed = time.monotonic() + timeout_s, [], []
    while True:
        env = dict(os.environ, **{SKIP_ENV: ",".join(hung + passed)})
        child = subprocess.Popen([sys.executable, script, "smoke", "--bundle", str(bundle)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        started, last, pending = None, "", b""
        while True:
            wait = deadline - time.monotonic()
            if stall_s is not None:
                wait = min(wait, stall_s)
            if wait <= 0 or not sel.select(timeout=wait):
                child.kill()
                child.wait()
                if stall_s is None or started is None or time.monotonic() >= deadline:
                    raise SystemExit(f"smoke run stalled after {last!r}; not timing")
                print(f"smoke {started}: HUNG (no output for {stall_s} s); skipped", flush=True)
                hung.append(started)
                break
            chunk = os.read(child.stdout.fileno(), 1 << 16)
            if not chunk:
                if child.wait():
                    raise SystemExit("smoke run failed; not timing")
                return hung
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                last = line.decode(errors="replace").strip()
                print(last, flush=True)
                if last.startswith("smoke-start "):
                    started = last.split(" ", 1)[1]
                elif last.startswith("smoke ") and started is not None:
                    passed.append(started)
                    started = None


def main(build, run, smoke, default_dir: str) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["build", "run", "smoke"])
    p.add_argument("--out", default=default_dir)
    p.add_argument("--bundle", default=default_dir)
    args = p.parse_args()
    if args.mode == "build":
        build(Path(args.out))
    elif args.mode == "smoke":
        smoke(Path(args.bundle))
    else:
        run(Path(args.bundle), Path(args.out))
