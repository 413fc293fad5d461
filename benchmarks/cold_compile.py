"""Cold compile of the example GEMM for cuda:sm_90a, by stage, next to TileLang 0.1.15 compiling
its own equivalent GEMM in the same run (rounds interleaved, so machine noise hits both alike).

    python benchmarks/cold_compile.py --setup-tilelang /tmp/tl-venv    # once: TileLang's venv
    python benchmarks/cold_compile.py --tilelang-python /tmp/tl-venv/bin/python \\
        --out benchmarks/results/cold_compile.json

The kernel: examples/gemm.py's matmul, fp16 in, fp32 accumulate, 128x128x32 tiles, 3 stages,
128 threads, M = N = K = 1024 (what TOOLCHAIN-FACTS measured TileLang with). Each round runs:

  tiled    a fresh interpreter: import tiled + tiled.compiler + TVM, then `tiled.compile(...,
           cache=False)` twice; the first compile is cold in every sense, the second shows a
           process that has compiled before (what a daemon worker is). Stages: `.stages`.
  tilelang a fresh interpreter of TileLang's venv running benchmarks/tilelang_gemm.py (its
           kernel and binary caches off, its cache dir a fresh temp dir), also two compiles.
  daemon   a fresh `tiled serve --workers 1` with an empty cache dir: the first request (a
           small elementwise kernel) pays the daemon's one-time costs, then the GEMM is a miss
           in a warm worker; wall time at the client and the response's stage_seconds.

TileLang must live in its own venv: it bundles a TVM fork (0.25.dev0, importable as `tvm`) that
cannot share an interpreter with apache-tvm 0.27.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import Daemon, header, load_average, temp_dir, wait_settled

TARGET = "cuda:sm_90a"
TILELANG_PINS = ["tilelang==0.1.15", "torch==2.13.0"]


def gemm_kernel(size: int):
    sys.path.insert(0, str(ROOT / "examples"))
    import gemm

    return gemm.matmul(size, size, size, block_M=128, block_N=128, block_K=32, num_stages=3,
                       dtype="float16", accum_dtype="float32", threads=128)


# -- tiled, in a fresh interpreter (this script re-run with --child) ---------------------------
def child(size: int, repeat: int) -> None:
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import tiled

    light_s = time.perf_counter() - t0
    # What the first compile would otherwise load: timed here, so compiles exclude it.
    import tvm

    import tiled.compiler

    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    kernel = gemm_kernel(size)
    program = kernel.ir
    define_s = time.perf_counter() - t0
    compiles = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        compiled = tiled.compile(kernel, TARGET, cache=False)
        total = time.perf_counter() - t0
        compiles.append({"total_s": total, "stages": dict(compiled.stages)})
    print(json.dumps({"import_tiled_s": light_s, "import_s": import_s, "define_s": define_s,
                      "tvm": tvm.__version__, "program_bytes": len(program.to_bytes()),
                      "artifact_bytes": len(compiled.artifact), "compiles": compiles,
                      "source_uses": {m: m in (compiled.source or "") for m in (
                          "tma", "wgmma", "mbarrier", "cp_async", "gemm_ss")}}))


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tiled_round(size: int, repeat: int) -> dict:
    with temp_dir("tiled-cold-cache-") as cache:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(cache)}
        t0 = time.perf_counter()
        out = run_json([sys.executable, __file__, "--child", "--size", str(size),
                        "--repeat", str(repeat)], env)
        out["process_wall_s"] = time.perf_counter() - t0
        return out


def tilelang_round(python: str, size: int, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    t0 = time.perf_counter()
    out = run_json([python, str(ROOT / "benchmarks" / "tilelang_gemm.py"), "--size", str(size),
                    "--repeat", str(repeat)], env)
    out["process_wall_s"] = time.perf_counter() - t0
    return out


def daemon_round(size: int) -> dict:
    import grpc

    from tiled.v1 import compile_pb2 as cpb
    from tiled.v1 import compile_pb2_grpc

    sys.path.insert(0, str(ROOT / "examples"))
    import elementwise

    with Daemon(workers=1) as daemon:
        wait_settled(daemon.pid, 1)
        channel = grpc.insecure_channel(daemon.address)
        stub = compile_pb2_grpc.CompilerStub(channel)

        def timed(kernel) -> tuple[float, cpb.CompileResponse]:
            request = cpb.CompileRequest(program=kernel.ir.proto, target=TARGET)
            t0 = time.perf_counter()
            r = stub.Compile(request, timeout=600)
            return time.perf_counter() - t0, r

        first_s, first = timed(elementwise.add(block=512))
        cold_s, cold = timed(gemm_kernel(size))
        hit_s, hit = timed(gemm_kernel(size))
        channel.close()
    assert not first.cache_hit and not cold.cache_hit and hit.cache_hit
    return {"first_request_s": first_s, "first_request_stages": dict(first.stage_seconds),
            "total_s": cold_s, "stage_seconds": dict(cold.stage_seconds),
            "artifact_bytes": cold.artifact_size, "hit_s": hit_s}


# -- the TileLang venv -------------------------------------------------------------------------
def setup_tilelang(venv: Path) -> Path:
    """Creates `venv` with TileLang 0.1.15 and torch 2.13.0 (pip's configured index); returns its
    python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", *TILELANG_PINS], check=True)
    subprocess.run([str(python), "-c", "import tilelang; print('tilelang', tilelang.__version__)"],
                   check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return python


def nvcc_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "not found"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def summary(rows: list[dict], *path: str) -> dict:
    values = []
    for r in rows:
        v = r
        for p in path:
            v = v.get(p) if isinstance(v, dict) else (v[int(p)] if isinstance(v, list) else None)
            if v is None:
                break
        if isinstance(v, (int, float)):
            values.append(v)
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(x, 4) for x in values]} if values else {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--tilelang-python", help="python of a venv with tilelang==0.1.15")
    p.add_argument("--setup-tilelang", metavar="DIR", help="create TileLang's venv in DIR first")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=1024, help="M = N = K")
    p.add_argument("--repeat", type=int, default=2, help="compiles per fresh process")
    p.add_argument("--no-daemon", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.size, args.repeat)
    tl_python = args.tilelang_python
    if args.setup_tilelang:
        tl_python = str(setup_tilelang(Path(args.setup_tilelang)))
    if not args.out:
        return None
    results = header(sys.argv)
    results["machine"]["nvcc"] = nvcc_version()
    results["kernel"] = {"example": "examples/gemm.py matmul", "M=N=K": args.size,
                         "tile": "128x128x32", "num_stages": 3, "threads": 128,
                         "dtype": "float16", "accum_dtype": "float32", "target": TARGET}
    rows: dict[str, list[dict]] = {"tiled": [], "tilelang": [], "daemon": []}
    for i in range(args.rounds):
        order = ["tiled", "tilelang", "daemon"]
        order = order if i % 2 == 0 else order[::-1]  # alternate who goes first
        for what in order:
            if what == "tiled":
                r = tiled_round(args.size, args.repeat)
                msg = (f"cold {r['compiles'][0]['total_s']:.2f} s "
                       f"{ {k: round(v, 3) for k, v in r['compiles'][0]['stages'].items()} }, "
                       f"import {r['import_s']:.2f} s")
            elif what == "tilelang" and tl_python:
                r = tilelang_round(tl_python, args.size, args.repeat)
                c = r["compiles"][0]
                msg = (f"cold {c['total_s']:.2f} s (nvcc {c['nvcc_s']:.2f} s, lower+rest "
                       f"{c['lower_and_rest_s']:.2f} s), import {r['import_s']:.2f} s")
            elif what == "daemon" and not args.no_daemon:
                r = daemon_round(args.size)
                msg = (f"miss {r['total_s']:.2f} s "
                       f"{ {k: round(v, 3) for k, v in r['stage_seconds'].items()} }, "
                       f"first request {r['first_request_s']:.2f} s")
            else:
                continue
            r["round"], r["load_average"] = i, load_average()
            rows[what].append(r)
            print(f"round {i} {what:8s} {msg}", flush=True)
    results["runs"] = rows
    results["summary"] = {
        "tiled": {
            "import_s (tiled + tiled.compiler + tvm)": summary(rows["tiled"], "import_s"),
            "cold_compile_s": summary(rows["tiled"], "compiles", "0", "total_s"),
            **{f"cold_{s}_s": summary(rows["tiled"], "compiles", "0", "stages", s)
               for s in ("verify", "lower", "toolchain")},
            "second_compile_same_process_s": summary(rows["tiled"], "compiles", "1", "total_s"),
            "second_toolchain_s": summary(rows["tiled"], "compiles", "1", "stages",
                                          "toolchain"),
            "artifact_bytes": rows["tiled"][0]["artifact_bytes"] if rows["tiled"] else None,
        },
        "tilelang": {
            "import_s": summary(rows["tilelang"], "import_s"),
            "cold_compile_s": summary(rows["tilelang"], "compiles", "0", "total_s"),
            "cold_nvcc_s": summary(rows["tilelang"], "compiles", "0", "nvcc_s"),
            "cold_lower_and_rest_s": summary(rows["tilelang"], "compiles", "0",
                                             "lower_and_rest_s"),
            "second_compile_same_process_s": summary(rows["tilelang"], "compiles", "1",
                                                     "total_s"),
            "second_nvcc_s": summary(rows["tilelang"], "compiles", "1", "nvcc_s"),
        },
        "daemon": {
            "miss_in_warm_worker_s": summary(rows["daemon"], "total_s"),
            **{f"miss_{s}_s": summary(rows["daemon"], "stage_seconds", s)
               for s in ("verify", "lower", "toolchain", "store", "total")},
            "first_request_after_start_s": summary(rows["daemon"], "first_request_s"),
            "hit_after_s": summary(rows["daemon"], "hit_s"),
        },
    }
    results["load_average_at_end"] = load_average()
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results["summary"], indent=1))
    return None


if __name__ == "__main__":
    main()
