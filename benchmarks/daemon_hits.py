"""The compile daemon's cache-hit path, end to end on a real `tiled serve` over its Unix socket:

  a. one client's Compile round trip for a cached ~100 KiB artifact (inlined in the response):
     generated stubs, and the thin client `tiled.client.Client` (`compile_raw`, which bypasses
     its in-process kernel table, so every call is an RPC);
  b. hits per second and per-call latency with 1, 4 and 16 client processes (spawned);
  c. `import tiled.client` in a fresh interpreter, and that it leaves TVM unimported;
  d. the daemon's resident memory (RSS and PSS) at start-up, idle after the runs, and once its
     --idle-stop (IDLE_STOP_S here) has stopped the compile processes;
  e. where a hit's time goes inside the server: `CompilerService.compile` in this process over
     the same cache directory, step by step, plus a cProfile listing.

    python benchmarks/daemon_hits.py --out benchmarks/results/daemon_hits.json

Goals (issue): at least 2,000 hits/s and p50 under 1 ms; `import tiled.client` under 0.3 s;
an idle daemon under 400 MB. The kernel is examples/gemm.py's matmul in fp32 with a symbolic M
(N = K = 1024) for cuda:sm_90a: fp32 has no tensor-core path, so its cubin is the real kernel
closest to 100 KiB (the fp16 GEMM's is ~14 KB). The artifact's size is measured and written out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import Daemon, header, load_average, percentiles, temp_dir, tree_memory, wait_settled

CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


def bench_kernel():
    sys.path.insert(0, str(ROOT / "examples"))
    import gemm

    import tiled.lang as T

    return gemm.matmul(T.dyn("M"), 1024, 1024, dtype="float32")


# -- a. one client ---------------------------------------------------------------------------
def time_calls(fn, n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def single_client(address: str, program, target: str, n: int) -> tuple[dict, object]:
    """Part a's numbers, and the cold CompileResponse (part e seeds its cache with it)."""
    import grpc

    from tiled.client import Client
    from tiled.v1 import compile_pb2 as cpb
    from tiled.v1 import compile_pb2_grpc

    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = compile_pb2_grpc.CompilerStub(channel)
    request = cpb.CompileRequest(program=program.proto, target=target)
    t0 = time.perf_counter()
    cold = stub.Compile(request, timeout=600)
    cold_s = time.perf_counter() - t0
    assert not cold.cache_hit and len(cold.artifact) == cold.artifact_size, "expected a miss"
    print(f"cold compile through the daemon: {cold_s:.2f} s, artifact {cold.artifact_size} B "
          f"(stages {dict(cold.stage_seconds)})", flush=True)

    server_total, server_verify = [], []

    def stub_hit():
        r = stub.Compile(request, timeout=60)
        assert r.cache_hit and len(r.artifact) == cold.artifact_size
        # Measured by the daemon inside CompilerService.compile: "verify" is verify + target +
        # options + compile_key, "total" the whole method (no gRPC, no (de)serialization).
        server_total.append(r.stage_seconds["total"])
        server_verify.append(r.stage_seconds["verify"])

    fetch = cpb.GetArtifactRequest(sha256=cold.artifact_sha256)

    def get_artifact():
        (chunk,) = stub.GetArtifact(fetch, timeout=60)
        assert len(chunk.data) == cold.artifact_size

    out: dict = {"cold_compile_s": round(cold_s, 3),
                 "cold_stage_seconds": {k: round(v, 4) for k, v in cold.stage_seconds.items()},
                 "artifact_bytes": cold.artifact_size, "action_key": cold.action_key,
                 "request_bytes": request.ByteSize(), "response_bytes": cold.ByteSize()}
    out["stub"] = percentiles(time_calls(stub_hit, n, warmup=200))
    out["stub_server_side"] = {"compile_total": percentiles(server_total[-n:]),
                               "verify_and_key": percentiles(server_verify[-n:])}
    # The same 100 KiB from the same daemon with no verify / digest: a floor for this socket,
    # this server and its thread pool (one streamed chunk, so a little over a unary call).
    out["get_artifact_reference"] = percentiles(time_calls(get_artifact, n, warmup=200))
    client = Client(address)

    def client_hit():
        response, artifact = client.compile_raw(program, target)
        assert response.cache_hit and len(artifact) == cold.artifact_size

    out["client_compile_raw"] = percentiles(time_calls(client_hit, n, warmup=200))
    # Client.compile with its table emptied before each call: the RPC, the artifact check and
    # the runtime's load() (lazy for CUDA: no driver is touched until the first launch).
    try:
        client.compile(program, target)

        def client_compile():
            client._table.clear()
            client.compile(program, target)

        out["client_compile_table_cleared"] = percentiles(time_calls(client_compile, n // 2,
                                                                     warmup=50))
    except Exception as e:  # a runtime without a loader for this backend: say so, go on
        out["client_compile_table_cleared"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    client.close()
    channel.close()
    rows = {name: out[name] for name in ("stub", "get_artifact_reference", "client_compile_raw",
                                         "client_compile_table_cleared")}
    rows["server-side compile()"] = out["stub_server_side"]["compile_total"]
    rows["server-side verify + key"] = out["stub_server_side"]["verify_and_key"]
    for name, r in rows.items():
        if "p50_us" in r:
            print(f"{name:30s} p50 {r['p50_us']:7.0f} us  p90 {r['p90_us']:7.0f}  "
                  f"p99 {r['p99_us']:7.0f}  mean {r['mean_us']:7.0f}", flush=True)
    return out, cold


# -- b. many client processes ------------------------------------------------------------------
def hit_loop(address: str, payload: bytes, warmup_s: float, duration_s: float, barrier,
             results) -> None:
    """One client process: connect, wait for the others, send hits for warmup_s (not
    counted), then for duration_s; report the latency of each call started in the window."""
    import grpc

    from tiled.v1 import compile_pb2 as cpb
    from tiled.v1 import compile_pb2_grpc

    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    stub = compile_pb2_grpc.CompilerStub(channel)
    request = cpb.CompileRequest.FromString(payload)
    stub.Compile(request, timeout=60)
    barrier.wait()
    start = time.perf_counter() + warmup_s
    end = start + duration_s
    samples, misses, errors = [], 0, 0
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        try:
            r = stub.Compile(request, timeout=60)
            misses += not r.cache_hit
        except grpc.RpcError:
            errors += 1
            continue
        if t0 >= start:
            samples.append(time.perf_counter() - t0)
    channel.close()
    results.put({"samples": samples, "misses": misses, "errors": errors})


def many_clients(address: str, payload: bytes, procs: int, warmup_s: float,
                 duration_s: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=hit_loop, args=(address, payload, warmup_s, duration_s,
                                                  barrier, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    got = [results.get(timeout=300 + warmup_s + duration_s) for _ in workers]
    for w in workers:
        w.join()
    samples = [s for g in got for s in g["samples"]]
    per_proc = [len(g["samples"]) / duration_s for g in got]
    return {"clients": procs, "duration_s": duration_s, "warmup_s": warmup_s,
            "calls": len(samples), "hits_per_s": round(len(samples) / duration_s, 1),
            "per_client_hits_per_s_min": round(min(per_proc), 1),
            "per_client_hits_per_s_max": round(max(per_proc), 1),
            "misses": sum(g["misses"] for g in got), "errors": sum(g["errors"] for g in got),
            "latency": percentiles(samples), "load_average_after": load_average()}


# -- c. import time ------------------------------------------------------------------------------
def import_time(runs: int) -> dict:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}

    def wall(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, cwd="/", check=True)
        return time.perf_counter() - t0

    bare, client = [], []
    for _ in range(runs):  # interleaved: machine noise hits both alike
        bare.append(wall("pass"))
        client.append(wall("import tiled.client"))
    probe = ("import json, sys, tiled.client; print(json.dumps({m: m in sys.modules for m in "
             "('tvm', 'tvm_ffi', 'tiled.compiler', 'numpy', 'grpc', 'google.protobuf')}))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, cwd="/",
                                       check=True, capture_output=True, text=True).stdout)
    trace = subprocess.run([sys.executable, "-X", "importtime", "-c", "import tiled.client"],
                           env=env, cwd="/", check=True, capture_output=True, text=True).stderr
    rows = []
    for line in trace.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2  # two spaces per nesting level
        rows.append({"module": name.strip(), "depth": depth, "self_us": int(self_us),
                     "cumulative_us": int(cum_us)})
    top = sorted((r for r in rows if r["depth"] <= 1), key=lambda r: -r["cumulative_us"])[:12]
    client_cum = next((r["cumulative_us"] for r in rows if r["module"] == "tiled.client"), None)
    return {"runs": runs, "bare_interpreter_s": [round(x, 4) for x in bare],
            "import_tiled_client_s": [round(x, 4) for x in client],
            "median_bare_s": round(statistics.median(bare), 4),
            "median_import_s": round(statistics.median(client), 4),
            "median_difference_s": round(statistics.median(client) - statistics.median(bare), 4),
            "importtime_tiled_client_cumulative_s": client_cum and round(client_cum / 1e6, 4),
            "importtime_top_level": top, "modules_loaded": loaded}


# -- e. the server's hit path, in this process ----------------------------------------------------
def hit_path_profile(cache_dir: Path, payload: bytes, seed, n: int) -> dict:
    """CompilerService.compile answering hits from the cache the daemon filled (its disk tier,
    promoted to memory by the first call), with the daemon's Metrics attached, and each step of
    that path timed on its own. When this process computes another action key than the daemon
    did (someone edited a file the toolchain digest covers in between), the entry is stored
    under this process's key from `seed`, the daemon's cold CompileResponse."""
    import json as json_mod

    from tiled import config
    from tiled.cache.entry import Entry
    from tiled.cache.tiered import open_default_cache
    from tiled.compiler.cached import compile_key
    from tiled.compiler.toolchain.digest import toolchain_digest
    from tiled.ir import verify
    from tiled.ir.program import Program
    from tiled.server.metrics import Metrics
    from tiled.server.service import CompilerService
    from tiled.v1 import compile_pb2 as cpb

    with config.override(cache_dir=cache_dir):
        metrics = Metrics()
        cache = open_default_cache(events=metrics.cache_events())
        service = CompilerService(cache, pool=None, metrics=metrics, local_target="cpu")
        request = cpb.CompileRequest.FromString(payload)
        program = Program(request.program)
        target = service._target(request.target)
        options = service._options(request.options_json)
        key = compile_key(program, target, options)
        reseeded = cache.get(key) is None
        if reseeded:
            cache.put(Entry(key, seed.manifest_json.encode(),
                            {seed.artifact_sha256: seed.artifact}))
        first = service.compile(request, None)
        assert first.cache_hit, "the cache should hold the entry"
        entry = cache.get(key)
        manifest_json = entry.manifest.decode()

        steps = {
            "parse request (FromString)": lambda: cpb.CompileRequest.FromString(payload),
            "CompilerService.compile (whole)": lambda: service.compile(request, None),
            "verify(program)": lambda: verify(Program(request.program)),
            "parse target + options": lambda: (service._target(request.target),
                                               service._options(request.options_json)),
            "program.digest": lambda: program.digest,
            "toolchain_digest (memoized)": lambda: toolchain_digest(target),
            "compile_key (digest + toolchain + key)": lambda: compile_key(program, target,
                                                                           options),
            "cache.get (memory tier)": lambda: cache.get(key),
            "json.loads(manifest)": lambda: json_mod.loads(manifest_json),
            "metrics.observe_compile": lambda: service._observe(target, {"verify": 1e-4,
                                                                         "total": 1e-3}, "hit"),
            "build CompileResponse": lambda: cpb.CompileResponse(
                action_key=first.action_key, manifest_json=first.manifest_json,
                artifact_sha256=first.artifact_sha256, artifact_size=first.artifact_size,
                artifact=first.artifact, cache_hit=True, resolved_target=first.resolved_target,
                stage_seconds=dict(first.stage_seconds)),
            "response.SerializeToString": first.SerializeToString,
        }
        timed = {}
        for name, fn in steps.items():
            timed[name] = percentiles(time_calls(fn, n, warmup=50))
            print(f"  {name:42s} p50 {timed[name]['p50_us']:8.1f} us  "
                  f"mean {timed[name]['mean_us']:8.1f} us", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            service.compile(request, None)
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        rows = []
        for (file, line, fn), (_cc, ncalls, tottime, cumtime, _) in stats.stats.items():
            rows.append({"function": f"{Path(file).name}:{line}({fn})", "ncalls": ncalls,
                         "tottime_us_per_hit": round(tottime / n * 1e6, 1),
                         "cumtime_us_per_hit": round(cumtime / n * 1e6, 1)})
        rows.sort(key=lambda r: -r["tottime_us_per_hit"])
        cache.close()
    return {"calls": n, "key_differs_from_daemon": reseeded, "steps": timed,
            "cprofile_top_by_tottime": rows[:20],
            "cprofile_note": "cProfile inflates Python-heavy code; read shares, not absolutes"}


def measure_daemon(daemon: Daemon, program, args, results: dict):
    """Parts a, b and d; returns the cold CompileResponse."""
    results["daemon"] = {
        "command": f"python -m tiled.cli serve --socket PATH --workers {daemon.workers}",
        "ready_after_s": round(daemon.started_s, 2)}
    settle = wait_settled(daemon.pid, daemon.workers)
    results["memory_at_start"] = {**tree_memory(daemon.pid), "settled_after_s": round(settle, 1)}
    print(f"daemon up ({daemon.started_s:.1f} s; settled {settle:.0f} s): "
          f"main {results['memory_at_start']['main_rss_mb']} MB, total "
          f"{results['memory_at_start']['total_rss_mb']} MB RSS, "
          f"{results['memory_at_start']['total_pss_mb']} MB PSS", flush=True)
    results["single_client"], cold = single_client(daemon.address, program, args.target,
                                                   args.n)
    from tiled.v1 import compile_pb2 as cpb

    payload = cpb.CompileRequest(program=program.proto, target=args.target).SerializeToString()
    results["throughput"] = []
    for procs in [int(x) for x in args.clients.split(",")]:
        row = many_clients(daemon.address, payload, procs, args.warmup, args.duration)
        results["throughput"].append(row)
        print(f"{procs:2d} client processes: {row['hits_per_s']:7.0f} hits/s  "
              f"p50 {row['latency']['p50_us']:.0f} us  p99 {row['latency']['p99_us']:.0f} us"
              f"  (misses {row['misses']}, errors {row['errors']})", flush=True)
    time.sleep(3.0)  # idle: no RPC in flight, workers waiting on their pipes
    results["memory_idle_after"] = tree_memory(daemon.pid)
    print(f"idle after the runs: main {results['memory_idle_after']['main_rss_mb']} MB, "
          f"total {results['memory_idle_after']['total_rss_mb']} MB RSS, "
          f"{results['memory_idle_after']['total_pss_mb']} MB PSS", flush=True)
    # The daemon runs with --idle-stop IDLE_STOP_S: once idle that long it stops its compile
    # processes (workers and the fork server that preloads TVM).
    deadline = time.monotonic() + IDLE_STOP_S + 30
    while time.monotonic() < deadline:
        time.sleep(1.0)
        mem = tree_memory(daemon.pid)
        if not any(c["role"] in ("worker", "fork_server") for c in mem["children"]):
            break
    results["memory_after_idle_stop"] = mem
    print(f"after {IDLE_STOP_S:.0f} s idle (--idle-stop): main {mem['main_rss_mb']} MB, total "
          f"{mem['total_rss_mb']} MB RSS, {mem['total_pss_mb']} MB PSS", flush=True)
    return cold


IDLE_STOP_S = 20.0  # the daemon's --idle-stop here (its default is 300 s)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="cuda:sm_90a")
    p.add_argument("--n", type=int, default=2000, help="round trips timed in part a")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per client config")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--import-runs", type=int, default=10)
    args = p.parse_args()
    results = header(sys.argv)
    program = bench_kernel().ir
    with temp_dir("tiled-hits-cache-") as cache_dir:
        with Daemon(workers=2, cache_dir=cache_dir,
                    args=("--idle-stop", str(IDLE_STOP_S))) as daemon:
            cold = measure_daemon(daemon, program, args, results)
        results["import_time"] = it = import_time(args.import_runs)
        print(f"import tiled.client: {it['median_difference_s'] * 1e3:.0f} ms over a bare "
              f"interpreter (median of {it['runs']}); tvm loaded: "
              f"{it['modules_loaded']['tvm']}", flush=True)
        print("server hit path in this process (daemon stopped):", flush=True)
        from tiled.v1 import compile_pb2 as cpb

        payload = cpb.CompileRequest(program=program.proto,
                                     target=args.target).SerializeToString()
        results["hit_path"] = hit_path_profile(cache_dir, payload, cold, n=args.n)
    best = max(results["throughput"], key=lambda r: r["hits_per_s"])
    results["goals"] = {
        "hits_per_s >= 2000 (best config)": {"measured": best["hits_per_s"],
                                             "met": best["hits_per_s"] >= 2000},
        "p50 < 1 ms (1 client, stubs)": {"measured_us": results["single_client"]["stub"]["p50_us"],
                                         "met": results["single_client"]["stub"]["p50_us"] < 1000},
        "import tiled.client < 0.3 s": {"measured_s": it["median_difference_s"],
                                        "met": it["median_difference_s"] < 0.3
                                        and not it["modules_loaded"]["tvm"]},
        "idle daemon < 400 MB (main process)": {
            "measured_mb": results["memory_idle_after"]["main_rss_mb"],
            "met": results["memory_idle_after"]["main_rss_mb"] < 400},
        "idle daemon < 400 MB (main + workers)": {
            "measured_mb": results["memory_idle_after"]["total_rss_mb"],
            "met": results["memory_idle_after"]["total_rss_mb"] < 400},
        "idle daemon < 400 MB (main + workers, PSS)": {
            "measured_mb": results["memory_idle_after"]["total_pss_mb"],
            "met": results["memory_idle_after"]["total_pss_mb"] < 400},
        "idle daemon < 400 MB (main + children after --idle-stop, RSS)": {
            "measured_mb": results["memory_after_idle_stop"]["total_rss_mb"],
            "met": results["memory_after_idle_stop"]["total_rss_mb"] < 400},
    }
    results["load_average_at_end"] = load_average()
    Path(args.out).write_text(json.dumps(results, indent=1))
    for goal, r in results["goals"].items():
        print(f"goal {goal}: {'met' if r['met'] else 'NOT met'} ({r})")


if __name__ == "__main__":
    main()
