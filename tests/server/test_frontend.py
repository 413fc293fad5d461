"""The daemon's front end keeps serving while compiles wait (issue 10, finding 6): a real
`tiled serve` with hundreds of cold compiles queued still answers cache hits, health checks
and status at once, and refuses compiles past --max-waiting with RESOURCE_EXHAUSTED."""

import json
import statistics
import sys
import time
from pathlib import Path

import grpc
import pytest

import tiled
import tiled.lang as T
from tests.daemon_util import start_daemon, stop_daemon, tiled_cli
from tests.server.test_daemon import metric, request, wait_until
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import compile_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise

QUEUED = 300


def scaled(c: int):
    """A kernel no other request compiles: its constant makes its digest its own."""
    M = T.dyn("M")

    @tiled.kernel
    def scale(X: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < M:
                    X[bx * 64 + i] = X[bx * 64 + i] * float(c + 2)

    return scale


def blocker(n: int = 72):
    """A kernel the cpu backend compiles for tens of seconds (n*n unrolled statements): while
    it holds the one worker, everything queued behind it stays queued."""
    M = T.dyn("M")

    @tiled.kernel
    def slow(X: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=1):
            for u in T.unroll(n):
                for v in T.unroll(n):
                    X[(u * n + v) % M] = T.sin(X[(u * 7 + v) % M]) * 3.0

    return slow


def idle(d) -> bool:
    """Nothing queued or running, as the pool itself counts (Capabilities)."""
    caps = d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=10)
    return caps.queued == 0 and caps.in_flight == 0


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_hits_health_and_status_answer_while_300_compiles_wait(tmp_path, library_memo):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    d = start_daemon(tmp_path, "--workers", "1", "--queue-limit", str(QUEUED + 50),
                     library_memo=library_memo)
    cold = []
    try:
        hit = request(elementwise.add(block=512))
        assert not d["stub"].Compile(hit, timeout=120).cache_hit
        d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60)  # toolchain digests
        cold.append(d["stub"].Compile.future(request(blocker()), timeout=600))
        wait_until(lambda: metric(d, "tiled_compiles_in_flight") == 1, what="the blocker")
        programs = [request(scaled(c)) for c in range(QUEUED)]
        cold += [d["stub"].Compile.future(r, timeout=600) for r in programs]
        wait_until(lambda: metric(d, "tiled_queue_depth") >= QUEUED, timeout=120,
                   what=f"{QUEUED} compiles to queue")
        caps = d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=10)
        assert (caps.queued, caps.in_flight) == (QUEUED, 1)
        assert metric(d, "tiled_requests_waiting") == QUEUED + 1
        # A serving process of its own: another connection, as a real client would be.
        with grpc.insecure_channel(d["address"]) as channel:
            stub = compile_pb2_grpc.CompilerStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            stub.Compile(hit, timeout=10)  # connect
            hits = [timed(lambda: stub.Compile(hit, timeout=10)) for _ in range(9)]
            checks = [timed(lambda: health.Check(health_pb2.HealthCheckRequest(
                service="tiled.v1.Compiler"), timeout=2.0)) for _ in range(3)]
            caps = [timed(lambda: stub.Capabilities(cpb.CapabilitiesRequest(), timeout=2.0))
                    for _ in range(3)]
        print(f"with {QUEUED} compiles waiting: hit median "
              f"{statistics.median(hits) * 1e3:.1f} ms (max {max(hits) * 1e3:.1f}), health "
              f"max {max(checks) * 1e3:.1f} ms, Capabilities max {max(caps) * 1e3:.1f} ms")
        assert statistics.median(hits) < 0.050
        assert max(checks) < 2.0 and max(caps) < 2.0  # their deadlines held, with margin
        t0 = time.perf_counter()
        status = tiled_cli("status", "--json", "--timeout", "2", env=d["env"])
        assert status.returncode == 0, status.stdout + status.stderr
        print(f"`tiled status` (a fresh process, imports included) took "
              f"{time.perf_counter() - t0:.1f} s")
        shown = json.loads(status.stdout)
        assert shown["serving"] and shown["queued"] == QUEUED and shown["in_flight"] == 1
        assert not any(f.done() for f in cold)  # all still waiting, none refused
        for f in cold:
            f.cancel()
        wait_until(lambda: metric(d, "tiled_requests_waiting") == 0 and idle(d), timeout=120,
                   what="the cancelled compiles to leave the queue and the worker")
        assert metric(d, "tiled_compile_requests_total", result="ok") == 1  # the hit's, only
        assert d["stub"].Compile(request(scaled(QUEUED)), timeout=120).artifact_size > 0
    finally:
        for f in cold:
            f.cancel()
        stop_daemon(d)


def test_waiting_past_max_waiting_is_resource_exhausted(tmp_path, library_memo):
    """Single-flight waiters count: two requests for one cold compile take both slots; a
    merged one that leaves (cancelled, deadline passed) gives its slot back at once."""
    d = start_daemon(tmp_path, "--workers", "1", "--max-waiting", "2",
                     library_memo=library_memo)
    stub = d["stub"]
    try:
        slow = request(blocker())
        first = [stub.Compile.future(slow, timeout=300)]  # the owner: compiles
        wait_until(lambda: metric(d, "tiled_compiles_in_flight") == 1, what="the compile")
        first.append(stub.Compile.future(slow, timeout=300))  # merged onto it
        wait_until(lambda: metric(d, "tiled_requests_waiting") == 2, what="two waiters")
        for other in (slow, request(scaled(10_001))):
            with pytest.raises(grpc.RpcError) as e:
                stub.Compile(other, timeout=60)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-waiting" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # a Warm call waits too: one slot
            list(stub.Warm(cpb.WarmRequest(items=[request(scaled(10_002))]), timeout=60))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert metric(d, "tiled_requests_refused_total", reason="waiting") == 3
        assert stub.Capabilities(cpb.CapabilitiesRequest(), timeout=10).workers == 1
        assert not any(f.done() for f in first)
        # A merged request that goes away frees its slot at once; the compile goes on.
        first[1].cancel()
        wait_until(lambda: metric(d, "tiled_requests_waiting") == 1, what="the slot back")
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            stub.Compile(slow, timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: metric(d, "tiled_requests_waiting") == 1, timeout=5,
                   what="the timed-out waiter to leave")
        assert time.monotonic() - t0 < 5 and metric(d, "tiled_compiles_in_flight") == 1
        first[0].cancel()  # the last waiter to leave cancels the compile
        wait_until(lambda: metric(d, "tiled_requests_waiting") == 0 and idle(d),
                   what="the cancel")
        assert stub.Compile(request(scaled(10_001)), timeout=120).artifact_size > 0
    finally:
        stop_daemon(d)
