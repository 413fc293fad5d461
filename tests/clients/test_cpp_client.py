"""The C++ client (clients/cpp) against a real `tiled serve` process: built with CMake once per
checkout (build/cpp-client, reused while its sources are unchanged), its own test programs
(tiled_loader_test, tiled_client_test) run, and its CLIs (tiled-compile, tiled-launch) drive a
daemon on a Unix socket and, with TLS and a token, on TCP; an in-process fake daemon
(tests/client/fake_server.py) supplies UNAVAILABLE answers and corrupted artifacts.

Needs cmake, a C++17 compiler, gRPC C++ and protobuf (scripts/test.sh installs Debian's
libgrpc++-dev, protobuf-compiler-grpc, nlohmann-json3-dev and cmake): a missing one fails
here, it is not skipped."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.client.fake_server import serve as serve_fake
from tests.daemon_util import free_port, start_daemon, stop_daemon
from tests.server.test_tcp_tls import self_signed
from tiled.client import Client
from tiled.ir import Program, verify
from tiled.runtime.cpu_levels import host_level

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "clients" / "cpp"
TESTDATA = CPP / "testdata"
BUILD = ROOT / "build" / "cpp-client"
PROGRAMS = ("vadd", "rows_axpb")

sys.path.insert(0, str(ROOT / "examples"))
import elementwise


@pytest.fixture(scope="session")
def cpp():
    """The build folder, configured and built (cmake --build is a no-op when up to date)."""
    missing = [tool for tool in ("cmake", "c++", "protoc", "grpc_cpp_plugin")
               if shutil.which(tool) is None]
    assert not missing, (f"{', '.join(missing)} not on PATH: scripts/test.sh installs cmake, "
                         f"g++, libgrpc++-dev, protobuf-compiler-grpc and nlohmann-json3-dev")
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(min(4, os.cpu_count() or 2))}
    # Build type None: no optimization and no debug info, the quickest to compile (67 s of CPU
    # against 115 s for RelWithDebInfo, measured on a 2-core machine); these tests time nothing.
    for cmd in (["cmake", "-S", str(CPP), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=None"],
                ["cmake", "--build", str(BUILD)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return BUILD


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, library_memo):
    d = start_daemon(tmp_path_factory.mktemp("cpp-daemon"), "--workers", "1", "--timeout", "120",
                     library_memo=library_memo)
    yield d
    stop_daemon(d)


def clean_env(**extra: str) -> dict:
    """The environment without any TILED_* client setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILED_")}
    return {**env, **extra}


def cli(cpp: Path, server: str, *args: str, timeout: float = 300, **env: str):
    return subprocess.run([str(cpp / "tiled-compile"), "--server", server, *args],
                          capture_output=True, text=True, timeout=timeout, env=clean_env(**env))


def json_lines(r: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in r.stdout.splitlines()]


def program_file(tmp_path: Path, name: str, kernel) -> Path:
    """A program none of the other tests compile (so its first compile is a miss)."""
    path = tmp_path / f"{name}.tir"
    path.write_bytes(kernel.ir.to_bytes())
    return path


def test_committed_programs_decode_verify_and_match_their_sidecar():
    sidecar = json.loads((TESTDATA / "programs.json").read_text())
    assert sorted(sidecar) == sorted(PROGRAMS)
    for name in PROGRAMS:
        data = (TESTDATA / f"{name}.tir").read_bytes()
        program = verify(Program.from_bytes(data))
        assert len(data) == sidecar[name]["size"]
        assert hashlib.sha256(data).hexdigest() == sidecar[name]["sha256"]
        assert program.digest == sidecar[name]["digest"] and program.name == name


def test_loader_tests_pass(cpp):
    r = subprocess.run([str(cpp / "tiled_loader_test")], capture_output=True, text=True,
                       timeout=300, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("12 passed, 0 failed"), r.stdout


def test_cuda_loader_makes_the_driver_calls_the_manifest_asks_for(cpp):
    """Against a stand-in libcuda.so.1 that records each call (no GPU here): the geometry,
    shared memory, parameters and TMA descriptors of real sm_90a manifests (testdata/sm90a)."""
    r = subprocess.run([str(cpp / "tiled_cuda_fake_test")], capture_output=True, text=True,
                       timeout=300, env=clean_env(LD_LIBRARY_PATH=str(cpp / "fake-driver")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("7 passed, 0 failed"), r.stdout


def test_client_tests_pass_against_the_daemon(cpp, daemon):
    r = subprocess.run([str(cpp / "tiled_client_test")], capture_output=True, text=True,
                       timeout=600, env=clean_env(TILED_SERVER=daemon["address"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("10 passed, 0 failed"), r.stdout


@pytest.mark.parametrize("name", PROGRAMS)
def test_action_keys_and_artifacts_equal_the_python_clients(cpp, daemon, name):
    path = TESTDATA / f"{name}.tir"
    r = cli(cpp, daemon["address"], "--target", "cpu", str(path))
    assert r.returncode == 0, r.stderr
    (line,) = json_lines(r)
    with Client(daemon["address"], timeout_s=120) as client:
        response, artifact = client.compile_raw(Program.from_bytes(path.read_bytes()), "cpu")
    assert line["action_key"] == response.action_key
    assert line["artifact_sha256"] == hashlib.sha256(artifact).hexdigest()
    assert line["size"] == len(artifact) and line["name"] == name


def test_compile_misses_then_hits_and_streams_the_same_bytes(cpp, daemon, tmp_path):
    path = program_file(tmp_path, "vadd256", elementwise.add(block=256))
    first = cli(cpp, daemon["address"], "--target", "cpu", str(path))
    # the repeat: nothing inlined, so the artifact streams (GetArtifact), then again in 4 KiB
    # chunks, each checked against the sha256 that the response and the manifest name
    second = cli(cpp, daemon["address"], "--target", "cpu", "--inline-limit", "1", "--refetch",
                 "--chunk-bytes", "4096", str(path))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    (a,), (b,) = json_lines(first), json_lines(second)
    assert not a["cache_hit"] and b["cache_hit"]
    assert a == {**b, "cache_hit": False}
    assert b["size"] > 4096  # several chunks


@pytest.mark.parametrize(("name", "dims"), [("vadd", []), ("vadd", ["--dim", "N=1"]),
                                            ("rows_axpb", ["--dim", "M=1001"]),
                                            ("rows_axpb", ["--dim", "M=0", "--scalar", "k=7"])])
def test_daemon_compiled_cpu_kernel_launches_from_cpp(cpp, daemon, tmp_path, name, dims):
    out = tmp_path / "out"
    r = cli(cpp, daemon["address"], "--target", "cpu", "--out", str(out),
            str(TESTDATA / f"{name}.tir"))
    assert r.returncode == 0, r.stderr
    assert (out / f"{name}.so").is_file() and (out / f"{name}.manifest.json").is_file()
    run = subprocess.run([str(cpp / "tiled-launch"), str(out), *dims], capture_output=True,
                         text=True, timeout=300, env=clean_env())
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = json_lines(run)
    assert result["ok"] and result["bad"] == 0 and result["backend"] == "cpu"
    size = {"vadd": result["dims"].get("N"), "rows_axpb": result["dims"].get("M", 0) * 64}[name]
    assert result["checked"] == size
    if name == "vadd" and not dims:
        assert result["dims"] == {"N": 100003} and result["grid"] == [98, 1, 1]


def test_a_cubin_that_writes_nothing_fails_tiled_launchs_check(cpp, daemon, tmp_path):
    """A daemon-compiled sm_90a cubin through tiled-launch's whole cuda path (allocate, copy,
    load, launch, copy back) on the stand-in driver, which runs nothing: every output element
    keeps its NaN, and the check reports each one."""
    out = tmp_path / "out"
    r = cli(cpp, daemon["address"], "--target", "cuda:sm_90a", "--out", str(out),
            str(TESTDATA / "vadd.tir"))
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(cpp / "tiled-launch"), str(out)], capture_output=True, text=True,
                         timeout=300, env=clean_env(LD_LIBRARY_PATH=str(cpp / "fake-driver")))
    assert run.returncode == 1, run.stdout + run.stderr
    (result,) = json_lines(run)
    assert result["device"] == "fake CUDA device" and result["grid"] == [98, 1, 1]
    assert result["checked"] == result["bad"] == 100003 and not result["ok"]


def test_launch_refuses_a_corrupt_artifact_and_an_unknown_kernel(cpp, daemon, tmp_path):
    out = tmp_path / "out"
    assert cli(cpp, daemon["address"], "--target", "cpu", "--out", str(out),
               str(TESTDATA / "vadd.tir")).returncode == 0
    so = out / "vadd.so"
    data = so.read_bytes()
    so.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    run = subprocess.run([str(cpp / "tiled-launch"), str(out)], capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert run.returncode == 1 and "ARTIFACT_MISMATCH" in run.stderr, run.stderr
    so.write_bytes(data)  # intact again, but under a name tiled-launch has no reference for
    manifest = json.loads((out / "vadd.manifest.json").read_text())
    (out / "vadd.manifest.json").write_text(json.dumps({**manifest, "name": "other"}))
    (out / "vadd.so").rename(out / "other.so")
    (out / "vadd.manifest.json").rename(out / "other.manifest.json")
    run = subprocess.run([str(cpp / "tiled-launch"), str(out)], capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert run.returncode == 1 and "no reference for this kernel" in run.stderr, run.stderr


def test_find_missing_warm_capabilities_and_health(cpp, daemon, tmp_path):
    address = daemon["address"]
    caps = cli(cpp, address, "--capabilities")
    assert caps.returncode == 0, caps.stderr
    caps = json.loads(caps.stdout)
    assert caps["local_target"] == "cpu" and "cpu" in [b["name"] for b in caps["backends"]]
    assert caps["tile_ir_schema_version"] >= 1

    health = cli(cpp, address, "--health")
    assert (health.returncode, health.stdout.strip()) == (0, "SERVING")
    health = cli(cpp, address, "--health", "tiled.v1.Compiler/cpu")
    assert (health.returncode, health.stdout.strip()) == (0, "SERVING")
    health = cli(cpp, address, "--health", "no.such.Service")
    assert (health.returncode, health.stdout.strip()) == (1, "SERVICE_UNKNOWN")

    bad = Program.from_bytes((TESTDATA / "vadd.tir").read_bytes())
    bad.proto.kernel.threads = 5000
    (tmp_path / "threads.tir").write_bytes(bad.to_bytes())
    fresh = program_file(tmp_path, "vadd128", elementwise.add(block=128))
    files = [str(TESTDATA / "vadd.tir"), str(fresh), str(tmp_path / "threads.tir")]
    warm = cli(cpp, address, "--target", "cpu", "--warm", *files)
    assert warm.returncode == 1, warm.stderr  # one item failed
    results = sorted(json_lines(warm), key=lambda r: r["index"])
    assert [r["code"] for r in results] == ["OK", "OK", "INVALID_ARGUMENT"]
    assert "threads" in results[2]["message"]
    assert not results[1]["cache_hit"]
    missing = cli(cpp, address, "--find-missing", results[0]["action_key"],
                  results[1]["action_key"], "0" * 64)
    assert missing.returncode == 0, missing.stderr
    assert json.loads(missing.stdout) == ["0" * 64]


def test_errors_carry_the_grpc_status_and_the_daemons_message(cpp, daemon, tmp_path):
    bad = Program.from_bytes((TESTDATA / "rows_axpb.tir").read_bytes())
    bad.proto.kernel.threads = 5000
    (tmp_path / "threads.tir").write_bytes(bad.to_bytes())
    r = cli(cpp, daemon["address"], "--target", "cpu", str(tmp_path / "threads.tir"))
    assert r.returncode == 1 and r.stdout == ""
    assert "INVALID_ARGUMENT" in r.stderr and "threads" in r.stderr, r.stderr
    assert "clients/cpp/testdata/make_programs.py" in r.stderr  # the daemon's message is located
    r = cli(cpp, daemon["address"], "--target", "nope:sm_1", str(TESTDATA / "vadd.tir"))
    assert r.returncode == 1 and ("INVALID_ARGUMENT" in r.stderr or "UNIMPLEMENTED" in r.stderr)
    r = cli(cpp, daemon["address"], "--get-artifact", "0" * 64, "--output", str(tmp_path / "x"))
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r.stderr
    r = cli(cpp, daemon["address"], "--timeout", "soon", str(TESTDATA / "vadd.tir"))
    assert r.returncode == 2 and "usage" in r.stderr


def test_a_deadline_that_expires_is_deadline_exceeded(cpp, daemon, tmp_path):
    path = program_file(tmp_path, "vadd64", elementwise.add(block=64, threads=64))
    start = time.monotonic()
    r = cli(cpp, daemon["address"], "--target", "cpu", "--timeout", "0.05", str(path))
    assert r.returncode == 1 and "DEADLINE_EXCEEDED" in r.stderr, r.stderr
    assert time.monotonic() - start < 30  # not retried: the deadline is the client's


def test_unavailable_is_retried_until_the_daemon_answers(cpp, tmp_path):
    with serve_fake(tmp_path / "fake.sock") as (fake, address):
        fake.fail("Capabilities", grpc.StatusCode.UNAVAILABLE, "restarting", times=2)
        r = cli(cpp, address, "--capabilities", "--backoff", "0.01")
        assert r.returncode == 0, r.stderr
        assert fake.calls["Capabilities"] == 3
        fake.fail("Capabilities", grpc.StatusCode.UNAVAILABLE, "restarting", times=2)
        r = cli(cpp, address, "--capabilities", "--retries", "1", "--backoff", "0.01")
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr and "restarting" in r.stderr
        fake.fail("Capabilities", grpc.StatusCode.INVALID_ARGUMENT, "no", times=1)
        r = cli(cpp, address, "--capabilities", "--backoff", "0.01")
        assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr  # never retried
        assert fake.calls["Capabilities"] == 6


@pytest.fixture
def fake_kernel(tmp_path):
    """A fake daemon serving a (cpu) manifest and 20 KB of artifact bytes."""
    artifact = bytes(range(256)) * 80
    digest = hashlib.sha256(artifact).hexdigest()
    manifest = {"manifest_version": 1, "name": "vadd", "program_digest": "a" * 64,
                "target": "cpu", "backend": "cpu", "arch": "x86_64", "artifact_format": "so",
                "artifact_sha256": digest, "symbol": "__tvm_ffi_vadd", "params": []}
    with serve_fake(tmp_path / "fake.sock") as (fake, address):
        fake.set_kernel(json.dumps(manifest), artifact)
        yield fake, address, digest


def test_a_corrupted_artifact_never_leaves_the_client(cpp, fake_kernel):
    fake, address, digest = fake_kernel
    program = str(TESTDATA / "vadd.tir")
    fake.inline, fake.chunk_bytes = False, 4096
    r = cli(cpp, address, "--target", "cpu", program)
    assert r.returncode == 0, r.stderr
    assert fake.chunks_sent == 5 and json_lines(r)[0]["artifact_sha256"] == digest
    fake.corrupt_chunk = 2
    r = cli(cpp, address, "--target", "cpu", program)
    assert r.returncode == 1 and r.stdout == ""
    assert f"ARTIFACT_MISMATCH: artifact {digest[:12]}: received bytes have sha256" in r.stderr
    fake.corrupt_chunk, fake.inline, fake.corrupt_inline = None, True, True
    r = cli(cpp, address, "--target", "cpu", program)
    assert r.returncode == 1 and "ARTIFACT_MISMATCH" in r.stderr
    assert "the response names" in r.stderr, r.stderr
    # the program arrived as the file holds it (decoded and encoded again here: same bytes)
    assert fake.requests[0].program.SerializeToString() == (TESTDATA / "vadd.tir").read_bytes()


@pytest.fixture(scope="module")
def late_tls_daemon(cpp, tmp_path_factory, library_memo):
    """A daemon with TLS + token on TCP, started only after a C++ client began asking for it
    on its Unix socket: the client's UNAVAILABLE retries must carry it to the daemon."""
    base = tmp_path_factory.mktemp("cpp-tls")
    cert = self_signed(base)
    (base / "token").write_text("cpp-s3cret\n")
    sock = base / "tiled.sock"
    waiting = subprocess.Popen(
        [str(cpp / "tiled-compile"), "--server", f"unix://{sock}", "--capabilities",
         "--retries", "40", "--backoff", "0.2", "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    time.sleep(1.0)
    assert waiting.poll() is None, waiting.communicate()
    port = free_port()
    try:
        d = start_daemon(base, "--workers", "1", "--tcp", f"127.0.0.1:{port}", "--tls-cert",
                         str(base / "cert.pem"), "--tls-key", str(base / "key.pem"),
                         "--token-file", str(base / "token"), library_memo=library_memo)
    except BaseException:
        waiting.kill()
        waiting.communicate()
        raise
    out, err = waiting.communicate(timeout=300)
    d.update(port=port, cert=cert, waited=(waiting.returncode, out, err))
    yield d
    stop_daemon(d)


def test_a_client_started_before_the_daemon_reaches_it(late_tls_daemon):
    code, out, err = late_tls_daemon["waited"]
    assert code == 0, err
    assert json.loads(out)["local_target"] == "cpu"


def test_tls_and_token_over_tcp(cpp, late_tls_daemon, tmp_path):
    d = late_tls_daemon
    address = f"127.0.0.1:{d['port']}"
    ca = tmp_path / "ca.pem"
    ca.write_bytes(d["cert"])
    token = str(d["base"] / "token")
    program = str(TESTDATA / "vadd.tir")
    r = cli(cpp, address, "--target", "cpu", "--tls-ca", str(ca), "--token-file", token,
            "--inline-limit", "1", program)
    assert r.returncode == 0, r.stderr
    assert json_lines(r)[0]["resolved_target"] == f"cpu:{host_level().name}"
    # the same through the environment, as the Python client reads it
    r = cli(cpp, address, "--health", TILED_TLS_CA=str(ca), TILED_TOKEN_FILE=token)
    assert (r.returncode, r.stdout.strip()) == (0, "SERVING"), r.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    for args in (["--token-file", str(wrong)], []):
        r = cli(cpp, address, "--capabilities", "--tls-ca", str(ca), *args)
        assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stderr
    r = cli(cpp, address, "--capabilities", "--token-file", token, "--retries", "0")
    assert r.returncode == 1 and "CREDENTIALS" in r.stderr and "plaintext" in r.stderr
    r = cli(cpp, address, "--capabilities", "--retries", "0")  # plaintext to the TLS port
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr
