"""Calls the plugin's layers served, by op and path ("tiled" or "native", the fallback): the
Prometheus counter `tiled_vllm_ops_total{op, path}` (vLLM's /metrics shows it) and an
in-process table (tiled.ops.serving_plugin.Served)."""

from __future__ import annotations

import logging

from tiled.ops.serving_plugin import Served

SERVED = Served("tiled_vllm_ops", logging.getLogger("tiled_vllm"), "native",
                "vLLM's native forward")
count, fell_back, counts = SERVED.count, SERVED.fell_back, SERVED.counts
