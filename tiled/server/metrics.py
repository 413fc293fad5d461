"""Prometheus metrics of the compile daemon (the serving processes' own are in
tiled.runtime.telemetry).

`Metrics` owns a private CollectorRegistry, never the global one, so tests and several daemons in
one process never collide. Every method is thread-safe. The hooks that the cache and the worker
pool call (`cache_events()`, `pool_event`) never raise: a metric must not fail a compile.

Label values are bounded sets (backend, arch, stage, result, tier, op, reason). Keys and digests
never become labels: one series per kernel would grow without bound. `_label` maps anything that
looks like a digest, or is too long to be a name, to "other".
"""

from __future__ import annotations

import collections
import logging
import platform
import re
import threading
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server

log = logging.getLogger(__name__)

# tiled.compiler.stages.STAGES plus the whole request ("total"); not imported from there, so
# that a client-side Metrics never imports the compiler package.
STAGES = ("verify", "lower", "codegen", "toolchain", "store", "total")
# What a Compile request got (tiled.server.service): from the cache, its own compile, an
# identical compile another request started, or an error. Count of "compiled" = compiles run.
RESULTS = ("compiled", "hit", "merged", "error")
# A cold CUDA compile with autotuning can take many minutes; the top buckets keep those visible.
# fmt: off
COMPILE_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120,
                   300, 600, 1200, 1800)
# fmt: on

_HEXRUN = re.compile(r"[0-9a-fA-F]{16,}")


def _label(value: object) -> str:
    text = str(value)
    return "other" if len(text) > 48 or _HEXRUN.search(text) else text


def _tvm_version() -> str:
    # From the installed distribution's metadata: no `import tvm` (seconds, 200 MB) on the
    # scrape path; "none" where the compiler extra is not installed.
    try:
        return metadata.version(TVM_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "none"


TVM_DISTRIBUTION = "apache-tvm"
_BUILD_LABELS = ("version", "tvm_version", "python")


class _BuildInfo:
    """`tiled_build_info{version,tvm_version,python} 1`, labels computed once at first collect."""

    def __init__(self) -> None:
        self._labels: list[str] | None = None
        self._lock = threading.Lock()

    def labels(self) -> list[str]:
        with self._lock:
            if self._labels is None:
                from tiled import __version__

                self._labels = [__version__, _tvm_version(), platform.python_version()]
            return self._labels

    def describe(self):  # keeps registration from calling collect
        return [GaugeMetricFamily("tiled_build_info", "tiled build", labels=_BUILD_LABELS)]

    def collect(self):
        family = GaugeMetricFamily("tiled_build_info", "tiled build", labels=_BUILD_LABELS)
        family.add_metric(self.labels(), 1)
        return [family]


class _CacheSize:
    """`tiled_cache_bytes{tier}`, read from callbacks at scrape time. A failing callback drops
    its tier from that scrape (logged) instead of failing the whole scrape."""

    HELP = "bytes held by a cache tier"

    def __init__(self) -> None:
        self._callbacks: dict[str, Callable[[], float]] = {}
        self._lock = threading.Lock()

    def set(self, tier: str, fn: Callable[[], float] | None) -> None:
        with self._lock:
            if fn is None:
                self._callbacks.pop(tier, None)
            else:
                self._callbacks[tier] = fn

    def describe(self):
        return [GaugeMetricFamily("tiled_cache_bytes", self.HELP, labels=["tier"])]

    def collect(self):
        family = GaugeMetricFamily("tiled_cache_bytes", self.HELP, labels=["tier"])
        with self._lock:
            callbacks = list(self._callbacks.items())
        for tier, fn in callbacks:
            try:
                family.add_metric([tier], float(fn()))
            except Exception:  # a scrape must survive a broken tier; the failure is logged
                log.warning("cache size callback for tier %s failed", tier, exc_info=True)
        return [family]


class _CacheEvents:
    """The CacheEvents protocol (tiled.cache.entry) counted into a Metrics registry."""

    def __init__(self, m: Metrics):
        self._m = m

    def lookup(self, tier: str, result: str) -> None:
        self._m._safe(self._m.child(self._m.cache_lookups, tier, result).inc)

    def bytes_written(self, tier: str, n: int) -> None:
        self._m._safe(self._m.child(self._m.cache_bytes_written, tier).inc, n)

    def bytes_read(self, tier: str, n: int) -> None:
        self._m._safe(self._m.child(self._m.cache_bytes_read, tier).inc, n)

    def evicted(self, tier: str, entries: int, nbytes: int) -> None:
        self._m._safe(self._m.child(self._m.cache_evictions, tier).inc, entries)
        self._m._safe(self._m.child(self._m.cache_evicted_bytes, tier).inc, nbytes)

    def error(self, tier: str, op: str) -> None:
        self._m._safe(self._m.child(self._m.cache_errors, tier, op).inc)


class Metrics:
    """All tiled metrics in one private registry. Thread-safe.

    Server: `observe_compile`, `observe_error`, `set_limits`, `cache_events()`,
    `set_cache_size_callback`, `pool_event`, `start_http`. Tests: `render()`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._children: dict[tuple, Any] = {}  # (metric id, *labels) -> labelled child
        self.compile_duration = Histogram(
            "tiled_compile_duration_seconds",
            "compile time per stage",
            ["backend", "arch", "stage", "result"],
            buckets=COMPILE_BUCKETS,
            registry=r,
        )
        self.compile_errors = Counter(
            "tiled_compile_errors_total",
            "Compile requests that failed, by gRPC status code",
            ["backend", "code"],
            registry=r,
        )
        self.cache_lookups = Counter(
            "tiled_cache_lookups_total", "cache lookups", ["tier", "result"], registry=r
        )
        self.cache_bytes_written = Counter(
            "tiled_cache_bytes_written_total", "bytes written to a cache tier", ["tier"], registry=r
        )
        self.cache_bytes_read = Counter(
            "tiled_cache_bytes_read_total", "bytes read from a cache tier", ["tier"], registry=r
        )
        self.cache_evictions = Counter(
            "tiled_cache_evictions_total", "entries evicted", ["tier"], registry=r
        )
        self.cache_evicted_bytes = Counter(
            "tiled_cache_evicted_bytes_total", "bytes evicted", ["tier"], registry=r
        )
        self.cache_errors = Counter(
            "tiled_cache_errors_total", "failed cache reads and writes", ["tier", "op"], registry=r
        )
        self.queue_depth = Gauge("tiled_queue_depth", "compiles waiting for a worker", registry=r)
        self.in_flight = Gauge(
            "tiled_compiles_in_flight", "compiles running on a worker", registry=r
        )
        self.workers = Gauge("tiled_workers", "compile worker processes configured", registry=r)
        self.queue_limit = Gauge(
            "tiled_queue_limit", "compiles that may queue before RESOURCE_EXHAUSTED", registry=r
        )
        self.waiting_limit = Gauge(
            "tiled_requests_waiting_limit",
            "requests that may wait for compiles before RESOURCE_EXHAUSTED (--max-waiting)",
            registry=r,
        )
        self.compile_requests = Counter(
            "tiled_compile_requests_total", "compiles finished by the pool", ["result"], registry=r
        )
        self.merged_requests = Counter(
            "tiled_merged_requests_total",
            "requests merged onto an identical compile in flight",
            registry=r,
        )
        self.requests_waiting = Gauge(
            "tiled_requests_waiting",
            "requests waiting for a compile (their own or one they merged onto)",
            registry=r,
        )
        self.requests_refused = Counter(
            "tiled_requests_refused_total",
            "requests refused by admission control (RESOURCE_EXHAUSTED)",
            ["reason"],
            registry=r,
        )
        self.workers_replaced = Counter(
            "tiled_workers_replaced_total", "worker processes replaced", ["reason"], registry=r
        )
        self._cache_size = _CacheSize()
        r.register(self._cache_size)
        r.register(_BuildInfo())
        self._events = _CacheEvents(self)
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0
        self._queued_by_key: collections.Counter = collections.Counter()  # key -> jobs queued
        self._early: collections.Counter = collections.Counter()  # key -> "started" before "queued"
        self._http: tuple | None = None

    def observe_compile(
        self, backend: str, arch: str, stages: Mapping[str, float], result: str
    ) -> None:
        """One compile's stage times in seconds (a subset of STAGES; add "total" for the whole).
        Raises ValueError for a stage or result outside STAGES / RESULTS: a caller bug."""
        if result not in RESULTS:
            raise ValueError(f"compile result {result!r} is not one of {RESULTS}")
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise ValueError(f"compile stages {sorted(unknown)} are not among {STAGES}")
        for stage, seconds in stages.items():
            self.child(self.compile_duration, backend, arch, stage, result).observe(seconds)

    def observe_error(self, backend: str, arch: str, code: str, seconds: float) -> None:
        """A Compile request that failed after `seconds`: its total time under result="error",
        and one count of its gRPC status code name (INVALID_ARGUMENT, INTERNAL, ...)."""
        self.child(self.compile_duration, backend, arch, "total", "error").observe(seconds)
        self.child(self.compile_errors, backend, code).inc()

    def set_limits(self, workers: int, queue_limit: int, max_waiting: int | None) -> None:
        """The daemon's configured capacity, for saturation ratios (queue depth / limit)."""
        self.workers.set(workers)
        self.queue_limit.set(queue_limit)
        if max_waiting is not None:
            self.waiting_limit.set(max_waiting)

    def child(self, metric, *labels: object):
        """`metric.labels(*labels)` with each label passed through `_label`, memoized:
        prometheus_client's `labels()` costs microseconds, and a cache hit makes several."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*(_label(v) for v in labels))
        return child

    def set_waiting(self, n: int) -> None:
        """How many requests wait for a compile now (the service's admission count)."""
        self.requests_waiting.set(n)

    def refused(self, reason: str) -> None:
        """A request refused by admission control; `reason` is a bounded name ("waiting")."""
        self.child(self.requests_refused, reason).inc()

    def cache_events(self) -> _CacheEvents:
        """A CacheEvents (tiled.cache.entry) feeding the tiled_cache_* counters."""
        return self._events

    def set_cache_size_callback(self, tier: str, fn: Callable[[], float] | None) -> None:
        """`fn()` returns the bytes tier holds; called at each scrape. None removes the tier."""
        self._cache_size.set(_label(tier), fn)

    def pool_event(self, name: str, fields: Mapping[str, object]) -> None:
        """The worker pool's hook. "queued": a compile waits; "started": it left the queue for
        a worker; "dequeued": it was cancelled while queued; "finished" (ok, seconds, optional
        result: ok|error|timeout|cancelled): it left the worker; "merged": a request joined an
        identical compile in flight and never queues;
        "replaced" (reason): a worker process was replaced. Never raises; unknown names are
        ignored. Gauges never go below 0, so a pool that skips "queued" stays consistent."""
        self._safe(self._pool_event, name, fields)

    def _pool_event(self, name: str, fields: Mapping[str, object]) -> None:
        if name == "merged":
            self.merged_requests.inc()
        elif name == "replaced":
            self.child(self.workers_replaced, fields.get("reason", "unknown")).inc()
        elif name in ("queued", "started", "dequeued", "finished"):
            key = fields.get("key")
            with self._lock:
                # The pool emits "queued" from the submitting thread and "started" from its
                # dispatcher, so a job that starts at once may report them in either order:
                # a "started" whose "queued" is still to come is remembered, and that
                # "queued" then counts nothing (else the queue gauge would stay one too high).
                if name == "queued":
                    if self._early[key] > 0:
                        self._early[key] -= 1
                    else:
                        self._queued_by_key[key] += 1
                        self._queued += 1
                elif name in ("dequeued", "started"):
                    if self._queued_by_key[key] > 0:
                        self._queued_by_key[key] -= 1
                        self._queued -= 1
                    elif name == "started" and len(self._early) < 10_000:
                        self._early[key] += 1
                    self._running += name == "started"
                else:
                    self._running = max(0, self._running - 1)
                for table in (self._queued_by_key, self._early):
                    if table.get(key) == 0:
                        del table[key]
                self.queue_depth.set(self._queued)
                self.in_flight.set(self._running)
            if name in ("finished", "dequeued"):
                result = "cancelled" if name == "dequeued" else fields.get("result")
                if result not in ("ok", "error", "timeout", "cancelled"):
                    result = "ok" if fields.get("ok") else "error"
                self.compile_requests.labels(result).inc()

    def _safe(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:  # metrics hooks must never fail the caller; counted nowhere, logged
            log.warning(
                "metrics hook %s%r failed", getattr(fn, "__name__", fn), args, exc_info=True
            )

    def start_http(self, port: int, addr: str = "127.0.0.1"):
        """Serves /metrics from this registry on a daemon thread; returns the server, whose
        `server_port` is the bound port (port 0 picks a free one). `stop_http` closes it."""
        server, thread = start_http_server(port, addr, registry=self.registry)
        self._http = (server, thread)
        return server

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            self._http = None
            server.shutdown()
            server.server_close()
            thread.join()

    def render(self) -> bytes:
        return generate_latest(self.registry)
