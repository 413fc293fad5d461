"""Client-side metrics, counted in the serving process itself: the time to load each compiled
artifact, and the kernels tiled.ops launches. They go into prometheus_client's default
registry, the one vLLM and SGLang serve on their /metrics, and only where prometheus_client is
importable: the thin side does not depend on it, and without it every call here is a no-op.

    tiled_artifact_load_seconds{backend}     histogram, observed by tiled.runtime.load
    tiled_ops_launches_total{op, target}     counter, by tiled.ops when an op fetches its
                                             kernel to launch it (eager calls and CUDA graph
                                             captures; a graph replay runs no Python and is
                                             not counted)

Thread-safe; never raises (a metric must not fail a launch). Label values are bounded: op
names of tiled.ops and target names.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

# A load is a dlopen or cuModuleLoadData: well under a millisecond to a few seconds.
LOAD_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "load", "launches": the metrics; empty until first use
_children: dict[tuple, Any] = {}


def _metrics() -> dict[str, Any]:
    """The two metrics, made on first use; {} where prometheus_client is missing or refuses
    them (a name already registered by something else)."""
    if _state:
        return _state
    with _lock:
        if _state:
            return _state
        try:
            from prometheus_client import Counter, Histogram
        except ImportError:
            _state["off"] = True
            return _state
        try:
            _state["load"] = Histogram("tiled_artifact_load_seconds",
                                       "time to load a compiled artifact (client side)",
                                       ["backend"], buckets=LOAD_BUCKETS)
            _state["launches"] = Counter("tiled_ops_launches_total",
                                         "kernels launched by tiled.ops (client side)",
                                         ["op", "target"])
        except ValueError as e:  # registered twice in this process
            log.warning("tiled client metrics are off: %s", e)
            _state.clear()
            _state["off"] = True
    return _state


def _child(name: str, *labels: str):
    key = (name, *labels)
    child = _children.get(key)
    if child is None:
        metric = _metrics().get(name)
        if metric is None:
            return None
        child = _children.setdefault(key, metric.labels(*labels))
    return child


def observe_load(backend: str, seconds: float) -> None:
    """One artifact loaded in `seconds` by the `backend` loader."""
    try:
        child = _child("load", backend)
        if child is not None:
            child.observe(seconds)
    except Exception:  # never fail a load over a metric
        log.debug("observe_load failed", exc_info=True)


def count_launch(op: str, target: str) -> None:
    """One kernel launch of tiled.ops' `op` on `target` ("cpu", "cuda:sm_90a")."""
    try:
        child = _child("launches", op, target)
        if child is not None:
            child.inc()
    except Exception:  # never fail a launch over a metric
        log.debug("count_launch failed", exc_info=True)
