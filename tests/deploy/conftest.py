"""What the operator files (deploy/) are checked against: the metric names a live daemon and
a serving process export, as PromQL sees them."""

import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_util import ROOT, running_daemon

sys.path.insert(0, str(ROOT / "examples"))
import elementwise

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                             "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


def promql_names(exposition: str) -> set[str]:
    """Every series name a scrape of `exposition` gives PromQL: each family's declared names
    (a counter F as F_total, a histogram as F_bucket / F_sum / F_count), whether or not a
    labelled family has a sample yet."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


@pytest.fixture(scope="session")
def daemon_exposition(tmp_path_factory, library_memo) -> str:
    """A live daemon's /metrics after a compile, a hit and a refused request."""
    from tiled.client.client import compile_request

    with running_daemon(tmp_path_factory.mktemp("deploy-metrics"), library_memo,
                        workers=1) as d:
        request = compile_request(elementwise.add(block=32), "cpu")
        d["stub"].Compile(request, timeout=120)
        d["stub"].Compile(request, timeout=60)
        url = f"http://127.0.0.1:{d['metrics']}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()


@pytest.fixture(scope="session")
def client_exposition() -> str:
    """prometheus_client's default registry in a fresh serving-like process after tiled's
    thin runtime loaded a kernel and tiled.ops launched one, with the serving plugins'
    counters (their names read from integrations/*/counters.py) registered as they do."""
    plugins = []
    for counters in sorted((ROOT / "integrations").glob("*/*/counters.py")):
        import re

        plugins += re.findall(r'Served\("([a-z_]+)"', counters.read_text())
    assert plugins, "no serving plugin counters found"
    code = ("import logging, sys, torch\n"
            "import tiled.ops as ops\n"
            "from tiled.ops.serving_plugin import Served\n"
            "from prometheus_client import REGISTRY, generate_latest\n"
            "ops.rms_norm(torch.randn(4, 32), torch.randn(32))\n"
            f"for name in {plugins!r}:\n"
            "    Served(name, logging.getLogger(name), 'native', 'x').count('rms_norm', 'tiled')\n"
            "sys.stdout.write(generate_latest(REGISTRY).decode())\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout
