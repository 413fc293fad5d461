"""Calls the plugin's layers served, by op and path ("tiled" or "native", the fallback): a
Prometheus counter `tiled_vllm_ops_total{op, path}` where prometheus_client is installed (vLLM
installs it; its /metrics endpoint then shows it), and an in-process table either way."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("tiled_vllm")
_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}
_warned: set[tuple[str, str]] = set()

try:
    from prometheus_client import Counter

    _prom = Counter("tiled_vllm_ops", "vLLM layer calls served by tiled_vllm", ["op", "path"])
except Exception:  # no prometheus_client, or a registry that refuses it
    _prom = None


def count(op: str, path: str) -> None:
    with _lock:
        _counts[(op, path)] = _counts.get((op, path), 0) + 1
    if _prom is not None:
        _prom.labels(op=op, path=path).inc()


def fell_back(op: str, error: BaseException) -> None:
    """A call of `op` that tiled could not serve: counted, and logged once per op and
    error type."""
    count(op, "native")
    key = (op, type(error).__name__)
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        log.warning("tiled_vllm: %s runs vLLM's native forward (%s: %s); counted in "
                    "tiled_vllm_ops_total{path=\"native\"}", op, type(error).__name__, error)


def counts() -> dict[str, int]:
    with _lock:
        return {f"{op}/{path}": n for (op, path), n in sorted(_counts.items())}
