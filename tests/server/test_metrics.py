import re
import sys
import urllib.request

import pytest

import tiled.server.metrics as metrics_module
from tiled.cache.entry import sha256_hex
from tiled.server.metrics import COMPILE_BUCKETS, Metrics

HEX64 = re.compile(r"[0-9a-f]{64}")


@pytest.fixture(autouse=True)
def fake_tvm(monkeypatch):
    # build_info reads the TVM distribution's version from package metadata; pin it.
    real = metrics_module.metadata.version
    monkeypatch.setattr(metrics_module.metadata, "version",
                        lambda name: "9.9.9" if name == "apache-tvm" else real(name))


def value(m, name, **labels):
    return m.registry.get_sample_value(name, labels or None)


def test_observe_compile_labels_and_buckets():
    m = Metrics()
    m.observe_compile("cuda", "sm_90a", {"lower": 0.02, "toolchain": 40.0, "total": 45.0},
                      "compiled")
    m.observe_compile("cuda", "sm_90a", {"total": 0.0005}, "hit")
    assert COMPILE_BUCKETS[0] == 0.001 and COMPILE_BUCKETS[-1] >= 1800
    lab = dict(backend="cuda", arch="sm_90a", result="compiled")
    assert value(m, "tiled_compile_duration_seconds_count", stage="lower", **lab) == 1
    assert value(m, "tiled_compile_duration_seconds_sum", stage="toolchain", **lab) == 40.0
    total = dict(stage="total", **lab)
    assert value(m, "tiled_compile_duration_seconds_bucket", le="30.0", **total) == 0
    assert value(m, "tiled_compile_duration_seconds_bucket", le="60.0", **total) == 1
    assert value(m, "tiled_compile_duration_seconds_bucket", le="1800.0", **total) == 1
    hit = dict(backend="cuda", arch="sm_90a", stage="total", result="hit")
    assert value(m, "tiled_compile_duration_seconds_bucket", le="0.001", **hit) == 1
    assert value(m, "tiled_compile_duration_seconds_count", stage="verify", **lab) is None


def test_observe_compile_rejects_unknown_stage_and_result():
    m = Metrics()
    with pytest.raises(ValueError, match="stages"):
        m.observe_compile("cpu", "x86", {"linking": 1.0}, "compiled")
    with pytest.raises(ValueError, match="result"):
        m.observe_compile("cpu", "x86", {"total": 1.0}, "crashed")


def test_errors_count_by_code_and_time_under_error():
    m = Metrics()
    m.observe_error("cpu", "x86_64", "INVALID_ARGUMENT", 0.002)
    m.observe_error("cpu", "x86_64", "INVALID_ARGUMENT", 0.003)
    m.observe_error("unknown", "unknown", "UNIMPLEMENTED", 0.001)
    assert value(m, "tiled_compile_errors_total", backend="cpu", code="INVALID_ARGUMENT") == 2
    assert value(m, "tiled_compile_errors_total", backend="unknown", code="UNIMPLEMENTED") == 1
    err = dict(backend="cpu", arch="x86_64", stage="total", result="error")
    assert value(m, "tiled_compile_duration_seconds_count", **err) == 2


def test_limits_are_gauges():
    m = Metrics()
    m.set_limits(4, 256, 260)
    assert (value(m, "tiled_workers"), value(m, "tiled_queue_limit"),
            value(m, "tiled_requests_waiting_limit")) == (4, 256, 260)


def test_metric_stages_are_the_compilers_plus_total():
    from tiled.compiler.stages import STAGES

    assert metrics_module.STAGES == (*STAGES, "total")


def test_cache_events_count():
    m = Metrics()
    ev = m.cache_events()
    ev.lookup("disk", "hit")
    ev.lookup("disk", "hit")
    ev.lookup("redis", "miss")
    ev.bytes_written("disk", 100)
    ev.bytes_read("disk", 40)
    ev.evicted("memory", 3, 900)
    ev.error("redis", "read")
    assert value(m, "tiled_cache_lookups_total", tier="disk", result="hit") == 2
    assert value(m, "tiled_cache_lookups_total", tier="redis", result="miss") == 1
    assert value(m, "tiled_cache_bytes_written_total", tier="disk") == 100
    assert value(m, "tiled_cache_bytes_read_total", tier="disk") == 40
    assert value(m, "tiled_cache_evictions_total", tier="memory") == 3
    assert value(m, "tiled_cache_evicted_bytes_total", tier="memory") == 900
    assert value(m, "tiled_cache_errors_total", tier="redis", op="read") == 1


def test_cache_events_never_raise():
    m = Metrics()
    ev = m.cache_events()
    ev.bytes_written("disk", -5)  # Counter.inc rejects negatives: logged, not raised
    ev.bytes_read("disk", "lots")
    assert value(m, "tiled_cache_bytes_written_total", tier="disk") == 0


def test_pool_events_drive_gauges():
    m = Metrics()

    def depth():
        return value(m, "tiled_queue_depth")

    def running():
        return value(m, "tiled_compiles_in_flight")

    key = "ab" * 32
    for _ in range(3):
        m.pool_event("queued", {"key": key})
    assert (depth(), running()) == (3, 0)
    m.pool_event("merged", {"key": key})
    m.pool_event("started", {"key": key})
    m.pool_event("started", {"key": key})
    assert (depth(), running()) == (1, 2)
    m.pool_event("finished", {"key": key, "seconds": 1.5, "ok": True})
    m.pool_event("finished", {"key": key, "seconds": 2.0, "ok": False})
    m.pool_event("started", {"key": key})
    m.pool_event("finished", {"key": key, "seconds": 600, "ok": False, "result": "timeout"})
    assert (depth(), running()) == (0, 0)
    m.pool_event("finished", {"key": key, "ok": True})  # unmatched: gauges stay at 0
    assert (depth(), running()) == (0, 0)
    assert value(m, "tiled_merged_requests_total") == 1
    assert value(m, "tiled_compile_requests_total", result="ok") == 2
    assert value(m, "tiled_compile_requests_total", result="error") == 1
    assert value(m, "tiled_compile_requests_total", result="timeout") == 1
    m.pool_event("queued", {"key": key})
    m.pool_event("dequeued", {"key": key})  # cancelled while queued
    m.pool_event("started", {"key": key})
    m.pool_event("finished", {"key": key, "ok": False, "result": "cancelled"})
    assert (depth(), running()) == (0, 0)
    assert value(m, "tiled_compile_requests_total", result="cancelled") == 2
    m.pool_event("replaced", {"reason": "crashed"})
    m.pool_event("replaced", {"reason": "crashed"})
    m.pool_event("no-such-event", {})
    m.pool_event("replaced", None)  # a malformed event is logged, never raised
    assert value(m, "tiled_workers_replaced_total", reason="crashed") == 2


def test_admission_gauge_and_refusals():
    m = Metrics()
    m.set_waiting(300)
    assert value(m, "tiled_requests_waiting") == 300
    m.refused("waiting")
    m.refused("waiting")
    m.set_waiting(0)
    assert value(m, "tiled_requests_waiting") == 0
    assert value(m, "tiled_requests_refused_total", reason="waiting") == 2


def test_cache_size_callback():
    m = Metrics()
    size = [10]
    m.set_cache_size_callback("disk", lambda: size[0])
    m.set_cache_size_callback("redis", lambda: 1 / 0)  # a broken tier drops out of the scrape
    assert value(m, "tiled_cache_bytes", tier="disk") == 10
    size[0] = 4096
    assert value(m, "tiled_cache_bytes", tier="disk") == 4096
    assert value(m, "tiled_cache_bytes", tier="redis") is None
    m.set_cache_size_callback("disk", None)
    assert value(m, "tiled_cache_bytes", tier="disk") is None


def test_build_info(monkeypatch):
    m = Metrics()
    info = {
        s.labels["tvm_version"]: s.value
        for f in m.registry.collect()
        if f.name == "tiled_build_info"
        for s in f.samples
    }
    assert info == {"9.9.9": 1}
    real = metrics_module.metadata.version

    def missing(name):
        if name == "apache-tvm":
            raise metrics_module.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metrics_module.metadata, "version", missing)  # no compiler extra
    assert (
        value(
            Metrics(),
            "tiled_build_info",
            version=__import__("tiled").__version__,
            tvm_version="none",
            python=sys.version.split()[0],
        )
        == 1
    )


def test_no_digest_in_any_label():
    m = Metrics()
    digest = sha256_hex(b"kernel")
    m.observe_compile("cuda", digest, {"total": 1.0}, "compiled")
    m.cache_events().lookup(digest, "hit")
    m.cache_events().error("disk", digest)
    m.set_cache_size_callback(digest, lambda: 1)
    m.pool_event("finished", {"key": digest, "ok": True, "result": digest})
    m.pool_event("replaced", {"reason": f"worker died on {digest}"})
    labels = [v for f in m.registry.collect() for s in f.samples for v in s.labels.values()]
    assert "other" in labels
    assert not [v for v in labels if HEX64.search(v)]


def test_http_endpoint_on_free_port():
    m = Metrics()
    m.observe_compile("cpu", "x86_64", {"total": 0.2}, "compiled")
    server = m.start_http(0)
    try:
        port = server.server_port
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        m.stop_http()
    assert "tiled_build_info" in text
    assert "tiled_compile_duration_seconds_bucket" in text


def test_two_metrics_do_not_collide():
    a, b = Metrics(), Metrics()
    a.cache_events().lookup("disk", "hit")
    a.pool_event("queued", {})
    assert value(a, "tiled_cache_lookups_total", tier="disk", result="hit") == 1
    assert value(b, "tiled_cache_lookups_total", tier="disk", result="hit") is None
    assert value(b, "tiled_queue_depth") == 0
    assert b"tiled_build_info" in b.render()


def test_started_before_queued_leaves_the_queue_gauge_right():
    """The pool's submitting thread may report "queued" after its dispatcher reported
    "started" for the same job (it started at once): the gauge must still end at zero."""
    m = Metrics()
    m.pool_event("started", {"key": "k1"})
    m.pool_event("queued", {"key": "k1"})
    m.pool_event("queued", {"key": "k2"})
    assert value(m, "tiled_queue_depth") == 1 and value(m, "tiled_compiles_in_flight") == 1
    m.pool_event("finished", {"key": "k1", "ok": True})
    m.pool_event("started", {"key": "k2"})
    m.pool_event("finished", {"key": "k2", "ok": True})
    assert value(m, "tiled_queue_depth") == 0 and value(m, "tiled_compiles_in_flight") == 0
