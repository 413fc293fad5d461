"""The daemon end to end: a real `tiled serve` process on a real Unix socket, driven with the
generated gRPC stubs (what a client in any language would do)."""

import os
import re
import signal
import stat
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.daemon_util import start_daemon, stop_daemon
from tiled.runtime import load
from tiled.runtime.cpu_levels import host_level
from tiled.v1 import compile_pb2 as cpb

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import elementwise
import flash_attention
import gemm
import softmax


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("daemon"), "--workers", "2", "--timeout", "120")
    yield d
    stop_daemon(d)


def request(kernel, target="cpu", **kw):
    return cpb.CompileRequest(program=kernel.ir.proto, target=target, **kw)


def metric(daemon, name, **labels):
    text = urllib.request.urlopen(f"http://127.0.0.1:{daemon['metrics']}/metrics",
                                  timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_socket_is_private(daemon):
    assert stat.S_IMODE(daemon["sock"].stat().st_mode) == 0o600


def test_compile_runs_and_second_call_hits(daemon):
    stub = daemon["stub"]
    r1 = stub.Compile(request(elementwise.add(block=512)), timeout=120)
    r2 = stub.Compile(request(elementwise.add(block=512)), timeout=120)
    assert not r1.cache_hit and r2.cache_hit and r1.action_key == r2.action_key
    assert r1.artifact == r2.artifact and len(r1.artifact) == r1.artifact_size
    k = load(r1.artifact, r1.manifest_json)
    a, b = np.random.rand(1000).astype(np.float32), np.random.rand(1000).astype(np.float32)
    c = np.zeros_like(a)
    k(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    assert r1.resolved_target == f"cpu:{host_level().name}" and "total" in r1.stage_seconds


def test_get_artifact_streams_chunks(daemon):
    stub = daemon["stub"]
    r = stub.Compile(request(elementwise.add(block=256), inline_limit=1), timeout=120)
    assert r.artifact == b"" and r.artifact_size > 1
    chunks = list(stub.GetArtifact(cpb.GetArtifactRequest(sha256=r.artifact_sha256,
                                                          chunk_bytes=4096), timeout=30))
    assert len(chunks) > 1
    data = b"".join(c.data for c in chunks)
    import hashlib
    assert hashlib.sha256(data).hexdigest() == r.artifact_sha256
    with pytest.raises(grpc.RpcError) as e:
        list(stub.GetArtifact(cpb.GetArtifactRequest(sha256="0" * 64), timeout=30))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_find_missing_and_warm(daemon):
    stub = daemon["stub"]
    items = [request(softmax.softmax(N=n)) for n in (32, 64)]
    items.append(request(softmax.softmax(N=32), target="cuda:sm_75"))
    results = sorted(stub.Warm(cpb.WarmRequest(items=items), timeout=300),
                     key=lambda r: r.index)
    assert [r.index for r in results] == [0, 1, 2]
    assert results[0].code == 0 and results[1].code == 0
    assert results[2].code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert "sm_75" in results[2].message
    keys = [results[0].action_key, "f" * 64]
    missing = stub.FindMissing(cpb.FindMissingRequest(action_keys=keys), timeout=30).missing
    assert list(missing) == ["f" * 64]


def test_malformed_program_is_invalid_argument_with_location(daemon):
    req = request(elementwise.add(block=128))
    req.program.kernel.threads = 5000
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "threads" in e.value.details() and "elementwise.py" in e.value.details()


def test_unknown_target_is_unimplemented(daemon):
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(request(elementwise.add(), target="vulkan"), timeout=30)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_oversized_request_is_refused(daemon):
    req = request(elementwise.add())
    req.options_json = '{"pad": "' + "x" * (65 << 20) + '"}'
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(req, timeout=60)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(("options_json", "says"), [
    ('{"no_such_option": 1}', "unknown compile option 'no_such_option' for backend cpu"),
    ('{"target": "cuda:sm_90a"}', "unknown compile option 'target'"),
    ('{"safe_access": "yes"}', "'safe_access' must be a bool"),
    ('[1, 2]', "must be a JSON object"),
    ("{not json", "options_json is not JSON"),
    ('{"a":' * 500 + "1" + "}" * 500, "nests deeper than 4 levels"),
    ("[" * 2000 + "]" * 2000, "nests deeper than 4 levels"),  # past json's recursion limit
    ('{"pad": "' + "x" * 5000 + '"}', "options_json is 5011 bytes; the limit is 4096"),
])
def test_bad_options_are_invalid_argument(daemon, options_json, says):
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(request(elementwise.add(), options_json=options_json),
                               timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert says in e.value.details()


def test_errors_echo_a_bounded_prefix_of_the_request(daemon):
    """A 1 MB target, and a 100 KB debug name in a located error: each status message stays
    within status.MAX_MESSAGE_BYTES, under any client's header limit."""
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(request(elementwise.add(), target="cuda:" + "9" * (1 << 20)),
                               timeout=30)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert len(e.value.details().encode()) <= 2048 and "target must be" in e.value.details()
    req = request(elementwise.add(block=128))
    req.program.kernel.threads = 5000
    req.program.kernel.loc.file = "k" * 100_000 + ".py"
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(e.value.details().encode()) <= 2048 and "bytes, cut at 2048" in \
        e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        list(daemon["stub"].GetArtifact(cpb.GetArtifactRequest(sha256="0" * 100_000),
                                        timeout=30))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and len(e.value.details()) < 200


def test_serve_defaults(monkeypatch):
    """A compile may run 120 s and a worker has a memory limit unless the operator says
    otherwise (the pool's measured defaults, one place); `--memory-limit 0` lifts it."""
    from tiled import cli
    from tiled.server import app, pool

    seen = []
    monkeypatch.setattr(app, "serve", lambda opts: seen.append(opts) or 0)
    assert cli.main(["serve"]) == 0
    assert cli.main(["serve", "--timeout", "30", "--memory-limit", "0"]) == 0
    assert cli.main(["serve", "--memory-limit", "8G"]) == 0
    assert pool.DEFAULT_TIMEOUT_S == 120.0 and 2 << 30 <= pool.DEFAULT_MEMORY_BYTES <= 8 << 30
    assert (seen[0].compile_timeout_s, seen[0].memory_bytes) == (120.0,
                                                                 pool.DEFAULT_MEMORY_BYTES)
    assert (seen[1].compile_timeout_s, seen[1].memory_bytes) == (30.0, None)
    assert seen[2].memory_bytes == 8 << 30


def test_health_and_reflection(daemon):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(daemon["channel"])
    for name in ("", "tiled.v1.Compiler/cpu", "tiled.v1.Compiler/cuda", "tiled.v1.Compiler/rocm",
                 "tiled.v1.Compiler/metal"):
        r = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(daemon["channel"])
    resp = next(refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    names = {s.name for s in resp.list_services_response.service}
    assert {"tiled.v1.Compiler", "grpc.health.v1.Health"} <= names


def test_capabilities(daemon):
    caps = daemon["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60)
    assert caps.local_target == "cpu"  # no GPU on this machine
    assert caps.version == tiled.__version__ and caps.tile_ir_schema_version == 1
    assert {b.name for b in caps.backends} == {"cpu", "cuda", "rocm", "metal"}
    assert list(next(b for b in caps.backends if b.name == "rocm").archs) == ["gfx942", "gfx90a"]
    assert list(next(b for b in caps.backends if b.name == "metal").archs) == \
        ["apple7", "apple8", "apple9"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", b.toolchain_digest) for b in caps.backends)


def test_fifty_concurrent_identical_cold_requests_compile_once(daemon):
    M = T.dyn("M")

    @tiled.kernel
    def scale(X: T.Tensor((M,), "float32")):  # a program no other test compiles
        with T.Kernel(T.ceildiv(M, 128), threads=128) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < M:
                    X[bx * 128 + i] = X[bx * 128 + i] * 3.0

    compiles = metric(daemon, "tiled_compile_requests_total")
    merged = metric(daemon, "tiled_merged_requests_total")
    barrier = threading.Barrier(50)
    results, errors = [], []

    def one():
        barrier.wait()
        try:
            results.append(daemon["stub"].Compile(request(scale), timeout=120))
        except grpc.RpcError as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r.action_key for r in results}) == 1 and len(results) == 50
    # One compile ran in a worker; the other 49 requests waited on it (single-flight) or, if
    # they arrived after it finished, were served from the cache.
    assert metric(daemon, "tiled_compile_requests_total") - compiles == 1
    hits = sum(r.cache_hit for r in results)
    assert metric(daemon, "tiled_merged_requests_total") - merged + hits == 49


def test_thin_client_and_tiled_compile_through_the_daemon(daemon):
    from tiled import config
    from tiled.client import Client

    kernel = elementwise.add(block=2048)
    with Client(f"unix://{daemon['sock']}") as client:
        k = client.compile(kernel, "cpu")
        a = np.random.rand(5000).astype(np.float32)
        c = np.zeros_like(a)
        k(a, a, c)
        np.testing.assert_array_equal(c, a + a)
    with config.override(server=f"unix://{daemon['sock']}"):
        k2 = tiled.compile(kernel, "cpu")
    assert k2.action_key == k.action_key and k2.cache_hit


# -- failures of one compile: crash, timeout, cancellation -----------------------------------

def _children(pid: int) -> list[int]:
    out = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat_file.parent.name))
    return out


def worker_pids(daemon) -> list[int]:
    """The daemon's compile workers: the children of its multiprocessing fork server."""
    servers = _children_named(daemon, b"forkserver")
    assert servers, "the daemon has no fork server"
    return [w for server in servers for w in _children(server)]


def wait_until(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def gemm_request(n: int) -> cpb.CompileRequest:
    """A cold sm_90a GEMM compile: nvcc alone takes about a second here."""
    return request(gemm.matmul(M=n, N=n, K=n), target="cuda:sm_90a")


def test_worker_killed_mid_compile_fails_that_request_only(daemon):
    stub = daemon["stub"]
    replaced = metric(daemon, "tiled_workers_replaced_total", reason="crashed")
    pending = stub.Compile.future(gemm_request(384), timeout=120)
    wait_until(lambda: metric(daemon, "tiled_compiles_in_flight") >= 1, what="compile to start")
    for pid in worker_pids(daemon):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as e:
        pending.result()
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "crashed" in e.value.details() and "signal 9" in e.value.details()
    assert metric(daemon, "tiled_workers_replaced_total", reason="crashed") > replaced
    r = stub.Compile(gemm_request(384), timeout=120)  # the same request now succeeds
    assert not r.cache_hit and r.artifact_size > 0
    assert stub.Compile(request(elementwise.add(block=512)), timeout=120).action_key


def test_cancelled_request_stops_its_compile(daemon):
    stub = daemon["stub"]
    cancelled = metric(daemon, "tiled_compile_requests_total", result="cancelled")
    replaced = metric(daemon, "tiled_workers_replaced_total", reason="cancelled")
    pending = stub.Compile.future(gemm_request(320), timeout=120)
    wait_until(lambda: metric(daemon, "tiled_compiles_in_flight") >= 1, what="compile to start")
    assert pending.cancel()
    wait_until(lambda: metric(daemon, "tiled_compile_requests_total", result="cancelled")
               > cancelled, what="the pool to cancel the compile")
    assert metric(daemon, "tiled_workers_replaced_total", reason="cancelled") == replaced + 1
    # A client deadline that passes mid-compile cancels it the same way. The kernels compile
    # for over a second here (1.3 s with a warm worker, 2026-12-01). Where the deadline falls
    # depends on the machine's load: before the request reaches the pool (admission took over
    # 0.3 s once in CI) nothing is cancelled, after the compile ends nothing is either; so
    # deadlines grow over distinct kernels until one passes mid-compile, which must happen.
    for attempt, deadline in enumerate((0.3, 0.6, 1.0, 1.5)):
        seq = 640 + 64 * attempt  # a program not compiled before: no cache hit
        slow = request(flash_attention.flash_attention(2, 4, 4, seq, seq, 128, True, "bfloat16",
                                                       block_M=128, block_N=128, threads=256),
                       target="cuda:sm_90a")
        before = metric(daemon, "tiled_compile_requests_total", result="cancelled")
        try:
            stub.Compile(slow, timeout=deadline)
            continue  # it finished within the deadline
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
        try:
            wait_until(lambda b=before: metric(daemon, "tiled_compile_requests_total",
                                               result="cancelled") > b, timeout=15,
                       what="the deadline to cancel the compile")
            break
        except AssertionError:
            continue  # it passed before the compile started
    else:
        pytest.fail("no client deadline cancelled a compile in flight")
    r = stub.Compile(gemm_request(320), timeout=120)  # nothing was cached; it compiles again
    assert not r.cache_hit
    wait_until(lambda: metric(daemon, "tiled_compiles_in_flight") == 0, what="idle gauges")
    assert metric(daemon, "tiled_queue_depth") == 0


def test_compile_past_its_timeout_is_deadline_exceeded(tmp_path):
    d = start_daemon(tmp_path, "--workers", "1", "--timeout", "0.3")
    try:
        with pytest.raises(grpc.RpcError) as e:
            d["stub"].Compile(gemm_request(256), timeout=60)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "0.3 s limit" in e.value.details()
        assert metric(d, "tiled_workers_replaced_total", reason="timeout") == 1
        caps = d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60)
        assert caps.workers == 1  # still serving, with a replaced worker
    finally:
        stop_daemon(d)


def test_get_artifact_after_restart(tmp_path):
    d = start_daemon(tmp_path, "--workers", "1")
    try:
        r = d["stub"].Compile(request(elementwise.add(block=64)), timeout=120)
    finally:
        stop_daemon(d)
    d = start_daemon(tmp_path, "--workers", "1")  # same cache dir, new process
    try:
        chunks = d["stub"].GetArtifact(cpb.GetArtifactRequest(sha256=r.artifact_sha256),
                                       timeout=30)
        assert b"".join(c.data for c in chunks) == r.artifact
    finally:
        stop_daemon(d)


def test_bytes_that_do_not_decode_are_invalid_argument(daemon):
    compile_raw = daemon["channel"].unary_unary("/tiled.v1.Compiler/Compile")
    with pytest.raises(grpc.RpcError) as e:
        compile_raw(b"\x0a\x05\x0a\x03abc\xff", timeout=30)  # a truncated nested message
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tiled.v1.CompileRequest" in e.value.details()



def test_idle_stop_frees_the_compiler_and_the_next_compile_restarts_it(tmp_path):
    d = start_daemon(tmp_path, "--workers", "1", "--idle-stop", "1")
    try:
        d["stub"].Compile(request(elementwise.add(block=80)), timeout=120)
        wait_until(lambda: not _children_named(d, b"forkserver"), timeout=60,
                   what="the fork server and its workers to stop")
        r = d["stub"].Compile(request(elementwise.add(block=96)), timeout=120)
        assert not r.cache_hit and r.artifact_size > 0
    finally:
        stop_daemon(d)


def _children_named(d, text: bytes) -> list[int]:
    """The daemon's child processes whose command line holds `text` (gone ones skipped)."""
    out = []
    for pid in _children(d["proc"].pid):
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out
