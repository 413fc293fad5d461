"""Calls the plugin's layers served, by op and path ("tiled", or "sglang": SGLang's own
forward, for calls tiled does not take and for fallbacks): the Prometheus counter
`tiled_sglang_ops_total{op, path}` (SGLang's /metrics shows it with --enable-metrics) and an
in-process table (tiled.ops.serving_plugin.Served)."""

from __future__ import annotations

import logging

from tiled.ops.serving_plugin import Served

SERVED = Served("tiled_sglang_ops", logging.getLogger("tiled_sglang"), "sglang",
                "SGLang's own forward")
count, fell_back, counts = SERVED.count, SERVED.fell_back, SERVED.counts
