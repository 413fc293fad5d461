"""What the GPU benchmarks that travel as a bundle share: the `build | run | smoke` command line,
and the guarded smoke step (every kernel launched once in a child process with a timeout, so
that a hanging kernel costs seconds of device time, not the whole call)."""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def compile_into(out: Path, name: str, kernel, target: str = "cuda:sm_90a", **options):
    """Compiles `kernel` cold (no cache, compile `options`) into out/NAME.cubin +
    NAME.manifest.json; returns (the compiled kernel, seconds the compile took)."""
    import tiled

    t0 = time.perf_counter()
    compiled = tiled.compile(kernel, target=target, cache=False, **options)
    seconds = time.perf_counter() - t0
    (out / f"{name}.cubin").write_bytes(compiled.artifact)
    (out / f"{name}.manifest.json").write_text(compiled.manifest.to_json())
    return compiled, seconds


def load_kernel(bundle: Path, name: str):
    """The kernel compile_into wrote as NAME into `bundle`, loaded by the thin runtime (no GPU
    call until its first launch)."""
    from tiled.runtime import load

    return load((bundle / f"{name}.cubin").read_bytes(),
                (bundle / f"{name}.manifest.json").read_text())


def load_bundle(bundle: Path) -> tuple[dict, dict]:
    """(the build's index.json, name -> loaded kernel for each of its "kernels")."""
    index = json.loads((bundle / "index.json").read_text())
    return index, {name: load_kernel(bundle, name) for name in index["kernels"]}


def machine() -> dict:
    """Where a bundle was built."""
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}


def write_results(out: Path, script: str, bundle: Path, build: dict, **fields) -> None:
    """A GPU run's JSON: the command that made it, the build's index, the device, versions,
    the date, then `fields` (the rows)."""
    import torch
    import triton

    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/{script} run --bundle {bundle} --out {out}",
        "build": build, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}, indent=1))


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
    return g.replay


def smoke_in_child(script: str, bundle: Path, timeout_s: float) -> None:
    """Runs `script smoke --bundle BUNDLE` in a child; exits when it fails or hangs."""
    child = subprocess.run([sys.executable, script, "smoke", "--bundle", str(bundle)],
                           capture_output=True, text=True, timeout=timeout_s)
    print(child.stdout + child.stderr[-3000:], flush=True)
    if child.returncode:
        raise SystemExit("smoke run failed; not timing")


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
