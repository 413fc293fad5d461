"""What each Compile request is counted as, on a real daemon's /metrics: "compiled" (its own
compile), "merged" (it waited on an identical compile in flight), "hit" (from the cache) or
"error" (with its status code), so that result="compiled" counts the compiles that ran."""

import sys
import threading
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tiled
import tiled.lang as T
from tests.daemon_util import ROOT, start_daemon, stop_daemon
from tiled.v1 import compile_pb2 as cpb

sys.path.insert(0, str(ROOT / "examples"))
import elementwise


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, library_memo):
    # Cold: its workers start (and import the compiler) on the first compile, which takes
    # seconds, so every one of 20 requests sent at once arrives while that compile runs.
    d = start_daemon(tmp_path_factory.mktemp("results"), "--workers", "2",
                     library_memo=library_memo)
    yield d
    stop_daemon(d)


def samples(daemon) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of the daemon's /metrics."""
    url = f"http://127.0.0.1:{daemon['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def count(daemon, result: str, stage: str = "total") -> float:
    key = ("tiled_compile_duration_seconds_count",
           tuple(sorted({"backend": "cpu", "arch": tiled_arch(), "stage": stage,
                         "result": result}.items())))
    return samples(daemon).get(key, 0.0)


def tiled_arch() -> str:
    """The arch label of a "cpu" compile: the host's feature level it resolves to."""
    from tiled.compiler.registry import parse_target

    return parse_target("cpu").arch


def triple():
    N = T.dyn("N")

    @tiled.kernel
    def triple(X: T.Tensor((N,), "float32")):  # a program no other test compiles
        with T.Kernel(T.ceildiv(N, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    X[bx * 64 + i] = X[bx * 64 + i] * 3.0

    return triple


def test_twenty_identical_cold_requests_count_one_compiled_nineteen_merged(daemon):
    request = cpb.CompileRequest(program=triple().ir.proto, target="cpu")
    barrier = threading.Barrier(20)
    responses, errors = [], []

    def one():
        barrier.wait()
        try:
            responses.append(daemon["stub"].Compile(request, timeout=120))
        except grpc.RpcError as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(responses) == 20
    assert len({r.action_key for r in responses}) == 1
    assert not any(r.cache_hit for r in responses)
    assert (count(daemon, "compiled"), count(daemon, "merged"), count(daemon, "hit")) == \
        (1, 19, 0)
    # the compile's own stages, each observed once; merged requests only verify and wait
    for stage in ("verify", "lower", "codegen", "toolchain", "store"):
        assert count(daemon, "compiled", stage) == 1, stage
    assert count(daemon, "merged", "verify") == 19
    assert count(daemon, "merged", "toolchain") == 0
    got = samples(daemon)
    assert got[("tiled_compile_requests_total", (("result", "ok"),))] == 1  # the pool's count
    assert got[("tiled_merged_requests_total", ())] == 19

    daemon["stub"].Compile(request, timeout=60)  # the remembered response: a hit
    fresh = cpb.CompileRequest(program=triple().ir.proto, target="cpu", inline_limit=1)
    assert daemon["stub"].Compile(fresh, timeout=60).cache_hit  # decoded, keyed, then a hit
    assert count(daemon, "hit") == 2 and count(daemon, "compiled") == 1


def test_errors_count_by_status_code(daemon):
    bad_target = cpb.CompileRequest(program=elementwise.add(block=32).ir.proto,
                                    target="tpu:v5")
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(bad_target, timeout=60)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    bad_option = cpb.CompileRequest(program=elementwise.add(block=32).ir.proto, target="cpu",
                                    options_json='{"no_such_option": 1}')
    with pytest.raises(grpc.RpcError) as e:
        daemon["stub"].Compile(bad_option, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = samples(daemon)
    errors = {dict(k[1])["code"]: v for k, v in got.items()
              if k[0] == "tiled_compile_errors_total"}
    assert errors == {"UNIMPLEMENTED": 1, "INVALID_ARGUMENT": 1}
    # an unknown backend never becomes a label value: the client chose it
    assert got[("tiled_compile_errors_total",
                (("backend", "unknown"), ("code", "UNIMPLEMENTED")))] == 1
    assert count(daemon, "error") == 1  # the cpu one; the other is under backend="unknown"
