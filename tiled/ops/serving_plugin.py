"""What tiled's serving-framework plugins (integrations/vllm, integrations/sglang) share: the
ops TILED_OPS selects, and the count of the layer calls each path served.

    selected_ops(value, log)          the ops of "all" / "none" / a comma list (TILED_OPS)
    Served(metric, log, fallback)     count(op, path), fell_back(op, error), counts()

A Served counts into a Prometheus counter `<metric>_total{op, path}` where prometheus_client
is installed (the frameworks install it and serve it on /metrics) and into an in-process
table either way.
"""

from __future__ import annotations

import logging
import threading

from tiled import config

PLUGIN_OPS = ("rms_norm", "silu_and_mul", "gelu_and_mul", "rotary_embedding")


def selected_ops(value: str | None, log: logging.Logger) -> tuple[str, ...]:
    """The ops `value` (else TILED_OPS, default "all") asks for, in PLUGIN_OPS' order;
    unknown names are logged and ignored."""
    value = config.get("ops") if value is None else value
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names or names == ["all"]:
        return PLUGIN_OPS
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in PLUGIN_OPS]
    if unknown:
        log.warning("%s: TILED_OPS names unknown ops %s (known: %s); ignoring them",
                    log.name, unknown, ", ".join(PLUGIN_OPS))
    return tuple(n for n in PLUGIN_OPS if n in names)


class Served:
    """Calls served by op and path ("tiled", or `fallback`: the framework's own forward)."""

    def __init__(self, metric: str, log: logging.Logger, fallback: str, fallback_text: str):
        self.metric, self.log = metric, log
        self.fallback, self.fallback_text = fallback, fallback_text
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._warned: set[tuple[str, str]] = set()
        try:
            from prometheus_client import Counter

            self._prom = Counter(metric, f"layer calls served by {log.name}", ["op", "path"])
        except Exception:  # no prometheus_client, or a registry that refuses the name
            self._prom = None

    def count(self, op: str, path: str) -> None:
        with self._lock:
            self._counts[(op, path)] = self._counts.get((op, path), 0) + 1
        if self._prom is not None:
            self._prom.labels(op=op, path=path).inc()

    def fell_back(self, op: str, error: BaseException) -> None:
        """A call of `op` tiled could not serve: counted as the fallback path, and logged
        once per op and error type."""
        self.count(op, self.fallback)
        key = (op, type(error).__name__)
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        if first:
            self.log.warning("%s: %s runs %s (%s: %s); counted in %s_total{path=\"%s\"}",
                             self.log.name, op, self.fallback_text, type(error).__name__,
                             error, self.metric, self.fallback)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {f"{op}/{path}": n for (op, path), n in sorted(self._counts.items())}
