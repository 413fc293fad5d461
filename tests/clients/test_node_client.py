"""The Node.js client (clients/node) against a real `tiled serve` process on a real Unix socket:
the committed Tile IR file compiles from Node, the second call is a cache hit, and Node and the
Python client agree on the action and the artifact.

Needs `node` on PATH (scripts/test.sh installs it); `npm ci` runs here when node_modules is
missing."""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.daemon_util import start_daemon, stop_daemon
from tiled.client import Client
from tiled.compiler.targets.rocm.codeobject import read_code_object
from tiled.ir import Program, verify

ROOT = Path(__file__).resolve().parents[2]
NODE_CLIENT = ROOT / "clients" / "node"
PROGRAM = NODE_CLIENT / "testdata" / "vadd.tir"
SIDECAR = NODE_CLIENT / "testdata" / "vadd.json"


@pytest.fixture(scope="module")
def node():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH (scripts/test.sh installs nodejs and npm with apt)")
    if not (NODE_CLIENT / "node_modules").is_dir():
        npm = shutil.which("npm")
        assert npm, "node is on PATH but npm is not: install npm to run the Node client"
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_CLIENT,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"npm ci failed:\n{r.stdout}\n{r.stderr}"
    return node


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("node-daemon"), "--workers", "1", "--timeout", "120")
    yield d["address"]
    stop_daemon(d)


def run_node(node, server, program, *args, target="cpu"):
    return subprocess.run(
        [node, str(NODE_CLIENT / "compile.js"), "--server", server, "--target", target, *args,
         str(program)], capture_output=True, text=True, timeout=300)


def test_committed_program_decodes_verifies_and_matches_its_sidecar():
    data = PROGRAM.read_bytes()
    sidecar = json.loads(SIDECAR.read_text())
    program = verify(Program.from_bytes(data))
    assert len(data) == sidecar["size"]
    assert hashlib.sha256(data).hexdigest() == sidecar["sha256"]
    assert program.digest == sidecar["digest"] and program.name == sidecar["name"]


def test_node_compiles_then_hits_and_agrees_with_python(node, daemon):
    runs = [run_node(node, daemon, PROGRAM), run_node(node, daemon, PROGRAM, "--chunk-bytes",
                                                        "4096")]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert not first["cache_hit"] and second["cache_hit"]
    assert first == {**second, "cache_hit": False}

    with Client(daemon, timeout_s=120) as client:
        response, artifact = client.compile_raw(Program.from_bytes(PROGRAM.read_bytes()), "cpu")
    assert response.action_key == first["action_key"]
    assert hashlib.sha256(artifact).hexdigest() == first["artifact_sha256"]
    assert len(artifact) == first["size"]


def test_node_and_python_compile_rocm_gfx942_once(node, daemon):
    runs = [run_node(node, daemon, PROGRAM, target="rocm:gfx942") for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert not first["cache_hit"] and second["cache_hit"]
    program = Program.from_bytes(PROGRAM.read_bytes())
    with Client(daemon, timeout_s=120) as client:
        response, artifact = client.compile_raw(program, "rocm:gfx942")
        assert response.cache_hit and response.action_key == first["action_key"]
        assert hashlib.sha256(artifact).hexdigest() == first["artifact_sha256"]
        manifest = json.loads(response.manifest_json)
        assert manifest["target"] == "rocm:gfx942" and manifest["artifact_format"] == "hsaco"
        co = read_code_object(artifact)
        assert (co.arch, co.code_object_version) == ("gfx942", 5)
        assert manifest["code_object"]["kernarg_size"] == \
            co.kernel(manifest["symbol"])[".kernarg_segment_size"]
        # What the daemon sent runs here on the CPU (the code object carries its source).
        kernel = client.compile(program, "rocm:gfx942")
        assert manifest["params"][0]["shape"] == ["N"]
        n = 1000
        a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
        c = np.zeros(n, np.float32)
        kernel.emulate(a, b, c)
        np.testing.assert_array_equal(c, a + b)


def test_node_and_python_compile_metal_once(node, daemon):
    runs = [run_node(node, daemon, PROGRAM, target="metal") for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert not first["cache_hit"] and second["cache_hit"]
    program = Program.from_bytes(PROGRAM.read_bytes())
    with Client(daemon, timeout_s=120) as client:
        response, artifact = client.compile_raw(program, "metal")
        assert response.cache_hit and response.action_key == first["action_key"]
        assert hashlib.sha256(artifact).hexdigest() == first["artifact_sha256"]
        manifest = json.loads(response.manifest_json)
        assert manifest["target"] == "metal:apple7" and manifest["artifact_format"] == "msl"
        source = artifact.decode("utf-8")
        assert f"kernel void {manifest['symbol']}(" in source
        assert manifest["metal"]["bindings"][0] == {"buffer": 0}
        # What the daemon sent (MSL source) runs here on the CPU.
        kernel = client.compile(program, "metal")
        n = 1000
        a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
        c = np.zeros(n, np.float32)
        kernel.emulate(a, b, c)
        np.testing.assert_array_equal(c, a + b)


def test_program_that_does_not_verify_is_invalid_argument(node, daemon, tmp_path):
    program = Program.from_bytes(PROGRAM.read_bytes())
    program.proto.kernel.threads = 5000
    bad = tmp_path / "threads.tir"
    bad.write_bytes(program.to_bytes())
    r = run_node(node, daemon, bad)
    assert r.returncode == 1 and r.stdout == ""
    assert "INVALID_ARGUMENT" in r.stderr and "threads" in r.stderr, r.stderr
    assert "examples/elementwise.py" in r.stderr  # the daemon's message is located


def test_program_that_does_not_decode_is_invalid_argument(node, daemon, tmp_path):
    bad = tmp_path / "truncated.tir"
    bad.write_bytes(PROGRAM.read_bytes()[:300])
    r = run_node(node, daemon, bad)
    assert r.returncode == 1
    assert "INVALID_ARGUMENT" in r.stderr, r.stderr


def test_node_rejects_an_artifact_its_manifest_does_not_name(node):
    script = """
        const { checkArtifact, sha256Hex } = require('./tiled_client');
        const data = Buffer.from('not a shared library');
        checkArtifact(data, { artifact_sha256: sha256Hex(data), artifact_size: data.length,
                              manifest_json: JSON.stringify({ artifact_sha256: '0'.repeat(64) }) });
    """
    r = subprocess.run([node, "-e", script], cwd=NODE_CLIENT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "ARTIFACT_MISMATCH" in r.stderr and "the manifest names 000" in r.stderr, r.stderr
