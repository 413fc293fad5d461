"""`tiled status` against a real daemon subprocess: what it reports, and its exit code when the
daemon is not there."""

import json
import os
import sys

import pytest

from tests.daemon_util import ROOT, running_daemon, tiled_cli
from tiled.client import Client

sys.path.insert(0, str(ROOT / "examples"))
import elementwise


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, library_memo):
    with running_daemon(tmp_path_factory.mktemp("status-daemon"), library_memo) as d:
        yield d


def status_json(daemon):
    out = tiled_cli("status", "--json", env=daemon["env"])
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_status_prints_what_an_operator_needs(daemon):
    out = tiled_cli("status", "--server", daemon["address"], env=daemon["env"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"tiled daemon at {daemon['address']}: SERVING")
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[1:]
             if line.startswith("  ") and line[2] != " "}
    for field in ("version", "uptime", "local", "backends", "workers", "queue", "limits",
                  "compiles", "cache", "health"):
        assert field in lines, out.stdout
    assert "cpu" in lines["local"] and "limit 256" in lines["queue"]
    assert lines["workers"].split()[1] == "2"
    assert "toolchain " in lines["backends"] and "disk " in lines["cache"]
    assert out.stdout.count(": SERVING") == 7  # the header and the six health names
    rocm = next(line for line in out.stdout.splitlines() if "rocm (gfx942, gfx90a)" in line)
    assert "compiled and CPU-emulated here" in rocm and "not yet run on an AMD GPU" in rocm
    metal = next(line for line in out.stdout.splitlines()
                 if "metal (apple7, apple8, apple9)" in line)
    assert "MSL type-checked and CPU-emulated here" in metal
    assert "not yet run on an Apple GPU" in metal


def test_status_json_counts_compiles_and_hits(daemon):
    before = status_json(daemon)
    assert before["reachable"] and before["serving"] and before["workers"] == 2
    assert before["queue_limit"] == 256 and before["uptime_seconds"] > 0
    assert before["local_target"] == "cpu" and before["backends"][0]["name"] == "cpu"
    assert set(before["health"]) == {"", "tiled.v1.Compiler", "tiled.v1.Compiler/cpu",
                                     "tiled.v1.Compiler/cuda", "tiled.v1.Compiler/rocm",
                                     "tiled.v1.Compiler/metal"}
    assert set(before["health"].values()) == {"SERVING"}
    assert [t["name"] for t in before["cache_tiers"]] == ["memory", "disk"]
    with Client(daemon["address"]) as c:
        kernel = elementwise.add(block=32)
        first, _ = c.compile_raw(kernel, "cpu")
        second, _ = c.compile_raw(kernel, "cpu")
    assert not first.cache_hit and second.cache_hit
    after = status_json(daemon)
    assert after["compiles_total"] == before["compiles_total"] + 1
    assert after["cache_hits_total"] == before["cache_hits_total"] + 1
    assert after["queued"] == after["in_flight"] == 0
    assert after["uptime_seconds"] > before["uptime_seconds"]
    disk = next(t for t in after["cache_tiers"] if t["name"] == "disk")
    assert disk["bytes"] > 0 and disk["max_bytes"] > disk["bytes"]


def test_status_without_daemon_exits_1_naming_the_address(tmp_path):
    sock = tmp_path / "none.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CLIENT_RETRIES": "0",
           "TILED_SOCKET": str(sock)}
    env.pop("TILED_SERVER", None)
    out = tiled_cli("status", env=env)  # the default address: unix://TILED_SOCKET
    assert out.returncode == 1
    assert f"tiled daemon at unix://{sock}: not reachable" in out.stderr
    out = tiled_cli("status", "--json", "--server", f"unix://{sock}", env=env)
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["reachable"] is False and not report["serving"]
    assert report["address"] == f"unix://{sock}" and report["error"]


def test_probe_asks_health_only(daemon, tmp_path):
    out = tiled_cli("status", "--probe", "--server", daemon["address"], env=daemon["env"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"tiled daemon at {daemon['address']}: SERVING"
    sock = tmp_path / "none.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_SOCKET": str(sock)}
    env.pop("TILED_SERVER", None)
    out = tiled_cli("status", "--probe", "--timeout", "5", env=env)
    assert out.returncode == 1
    assert f"tiled daemon at unix://{sock}: not reachable" in out.stderr
