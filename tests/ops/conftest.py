"""Each test of tiled.ops starts with no tuned kernels, no cache stack and zeroed autotuner
counters, so that what it asserts about tunings is its own."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_tuning():
    from tiled import tuning
    from tiled.cache import tiered
    from tiled.ops import fp8, gemm, grouped

    for op in (gemm.LINEAR, gemm.MATMUL, fp8.FP8_LINEAR, grouped.GROUPED):
        op.clear()
    tiered._DEFAULT.clear()
    for k in tuning.STATS:
        tuning.STATS[k] = 0
    yield
