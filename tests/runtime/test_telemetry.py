"""Client-side metrics (tiled.runtime.telemetry) in prometheus_client's default registry, the
one serving frameworks expose: artifact load time per backend, tiled.ops launches per op; and
nothing at all, without failing, where prometheus_client is not installed."""

import subprocess
import sys

import numpy as np
from prometheus_client import REGISTRY

import tiled
from tests.daemon_util import ROOT

sys.path.insert(0, str(ROOT / "examples"))
import elementwise


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_loading_an_artifact_is_timed_per_backend():
    compiled = tiled.compile(elementwise.add(block=64), target="cpu", cache=False)
    before = sample("tiled_artifact_load_seconds_count", backend="cpu")
    kernel = tiled.runtime.load(compiled.artifact, compiled.manifest)
    a = np.arange(100, dtype=np.float32)
    c = np.zeros_like(a)
    kernel(a, a, c)
    assert c[99] == 198
    assert sample("tiled_artifact_load_seconds_count", backend="cpu") == before + 1
    assert sample("tiled_artifact_load_seconds_sum", backend="cpu") > 0


def test_ops_launches_are_counted_per_op_and_target():
    import torch

    import tiled.ops as ops

    x, w = torch.randn(8, 64), torch.randn(64)
    before = sample("tiled_ops_launches_total", op="rms_norm", target="cpu")
    for _ in range(3):
        ops.rms_norm(x, w)
    assert sample("tiled_ops_launches_total", op="rms_norm", target="cpu") == before + 3


def test_without_prometheus_client_nothing_is_counted_and_nothing_fails():
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "sys.path.insert(0, 'examples')\n"
            "import numpy as np, tiled, elementwise\n"
            "from tiled.runtime import telemetry\n"
            "k = tiled.compile(elementwise.add(block=64), target='cpu', cache=False)\n"
            "a = np.ones(10, np.float32); c = np.zeros_like(a)\n"
            "tiled.runtime.load(k.artifact, k.manifest)(a, a, c)\n"
            "telemetry.count_launch('rms_norm', 'cpu')\n"
            "assert c[9] == 2 and telemetry._state == {'off': True}, telemetry._state\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
