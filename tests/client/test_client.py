"""tiled.client against an in-process fake daemon on a real unix socket."""

import asyncio
import pickle
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

import tiled
from tiled import config
from tiled.client import (
    ArtifactNotFound,
    Client,
    ServerBusy,
    ServerUnavailable,
    compile_via_server,
    error_for_code,
    error_for_status,
)
from tiled.client.aio import AsyncClient
from tiled.errors import CompileTimeout, LaunchError, TiledError, UnsupportedTarget, VerifyError
from tiled.ir import Program

from .fake_server import serve

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise


@pytest.fixture(scope="module")
def compiled():
    """A real CPU artifact + manifest for examples/elementwise.py's add()."""
    k = tiled.compile(elementwise.add(), "cpu", cache=False)
    return k.manifest.to_json(), bytes(k.artifact)


@pytest.fixture
def daemon(tmp_path, compiled):
    with serve(tmp_path / "d.sock") as (fake, address):
        fake.set_kernel(*compiled)
        yield fake, address


def client(address, **kw):
    kw.setdefault("timeout_s", 10)
    kw.setdefault("backoff_s", 0.01)
    return Client(address, **kw)


def check_runs(kernel, n=5003):
    a, b = np.random.rand(n).astype("float32"), np.random.rand(n).astype("float32")
    c = np.zeros(n, "float32")
    kernel(a, b, c)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


def test_compile_round_trip(daemon, compiled):
    fake, address = daemon
    vadd = elementwise.add()
    with client(address) as c:
        kernel = c.compile(vadd, "cpu")
    check_runs(kernel)
    assert kernel.manifest.to_json() == compiled[0]
    assert kernel.artifact == compiled[1]
    assert len(kernel.action_key) == 64 and kernel.cache_hit is False
    assert kernel.resolved_target == "cpu"
    (request,) = fake.requests
    assert request.target == "cpu" and request.options_json == ""
    assert Program(request.program).digest == vadd.ir.digest
    assert fake.calls == {"Compile": 1}


def test_program_and_options_travel(daemon):
    fake, address = daemon
    with client(address) as c:
        c.compile(elementwise.add().ir, "cpu", {"b": 1, "a": "x"})
    assert fake.requests[0].options_json == '{"a":"x","b":1}'


def test_artifact_not_inlined_is_fetched_in_chunks(daemon, compiled):
    fake, address = daemon
    fake.inline, fake.chunk_bytes = False, 4096
    with client(address) as c:
        kernel = c.compile(elementwise.add(), "cpu")
    check_runs(kernel)
    assert fake.calls == {"Compile": 1, "GetArtifact": 1}
    assert fake.chunks_sent == -(-len(compiled[1]) // 4096) > 1


def test_corrupted_chunk_is_an_error_not_a_kernel(daemon):
    fake, address = daemon
    fake.inline, fake.chunk_bytes, fake.corrupt_chunk = False, 4096, 2
    with client(address) as c:
        with pytest.raises(LaunchError, match="sha256"):
            c.compile(elementwise.add(), "cpu")
        fake.corrupt_chunk = None  # nothing was kept: the next compile asks again
        check_runs(c.compile(elementwise.add(), "cpu"))
    assert fake.calls["Compile"] == 2


def test_corrupted_inline_artifact_is_an_error(daemon):
    fake, address = daemon
    fake.corrupt_inline = True
    with client(address) as c, pytest.raises(LaunchError):
        c.compile(elementwise.add(), "cpu")


def test_repeat_compile_is_served_from_the_local_table(daemon):
    fake, address = daemon
    with client(address) as c:
        first = c.compile(elementwise.add(), "cpu", {"x": 1, "y": 2})
        again = c.compile(elementwise.add(), "cpu", {"y": 2, "x": 1})  # retraced, same digest
        assert again is first
        assert fake.calls["Compile"] == 1
        c.compile(elementwise.add(), "cpu", {"x": 2, "y": 2})
        c.compile(elementwise.add(), "local", {"x": 1, "y": 2})
        c.compile(elementwise.add(dtype="float64"), "cpu", {"x": 1, "y": 2})
    assert fake.calls["Compile"] == 4


def test_unavailable_twice_then_ok_is_retried(daemon):
    fake, address = daemon
    fake.fail("Compile", grpc.StatusCode.UNAVAILABLE, "restarting", times=2)
    with client(address, retries=5) as c:
        check_runs(c.compile(elementwise.add(), "cpu"))
    assert fake.calls["Compile"] == 3


def test_unavailable_retries_are_bounded(daemon):
    fake, address = daemon
    fake.fail("Compile", grpc.StatusCode.UNAVAILABLE, "draining", times=10)
    with client(address, retries=2) as c, pytest.raises(ServerUnavailable, match="draining"):
        c.compile(elementwise.add(), "cpu")
    assert fake.calls["Compile"] == 3


def test_server_down_raises_server_unavailable_in_bounded_time(tmp_path):
    start = time.monotonic()
    with client(f"unix://{tmp_path}/nobody.sock", retries=3) as c:
        with pytest.raises(ServerUnavailable) as info:
            c.compile(elementwise.add(), "cpu")
    assert time.monotonic() - start < 5
    assert isinstance(info.value, ConnectionError) and "nobody.sock" in str(info.value)


@pytest.mark.parametrize(("code", "error"), [
    (grpc.StatusCode.INVALID_ARGUMENT, VerifyError),
    (grpc.StatusCode.UNIMPLEMENTED, UnsupportedTarget),
    (grpc.StatusCode.DEADLINE_EXCEEDED, CompileTimeout),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ServerBusy),
    (grpc.StatusCode.NOT_FOUND, ArtifactNotFound),
    (grpc.StatusCode.INTERNAL, TiledError),
    (grpc.StatusCode.UNAVAILABLE, ServerUnavailable),
])
def test_each_status_code_maps_to_its_error(daemon, code, error):
    fake, address = daemon
    message = "vadd.py:14: index out of bounds at kernel.body.seq.stmts[2]"
    fake.fail("Compile", code, message, times=10)
    with client(address, retries=1) as c, pytest.raises(error) as info:
        c.compile(elementwise.add(), "cpu")
    assert message in str(info.value)
    assert fake.calls["Compile"] == (2 if code == grpc.StatusCode.UNAVAILABLE else 1)
    if error is TiledError:
        assert "INTERNAL" in str(info.value)
    assert type(pickle.loads(pickle.dumps(info.value))) is type(info.value)


def test_verify_error_keeps_the_located_message():
    e = error_for_status(grpc.StatusCode.INVALID_ARGUMENT, "k.py:3: bad extent")
    assert isinstance(e, VerifyError) and str(e) == "k.py:3: bad extent"
    assert isinstance(error_for_code(12, "no cuda"), UnsupportedTarget)
    assert str(ArtifactNotFound("no blob ab")) == "no blob ab"


def test_get_artifact_find_missing_capabilities(daemon, compiled):
    fake, address = daemon
    artifact = compiled[1]
    sha = fake.artifact_sha256
    with client(address) as c:
        assert c.get_artifact(sha, chunk_bytes=1000) == artifact
        with pytest.raises(ArtifactNotFound):
            c.get_artifact("0" * 64)
        kernel = c.compile(elementwise.add(), "cpu")
        assert c.find_missing([kernel.action_key, "f" * 64]) == ["f" * 64]
        caps = c.capabilities()
        assert caps.local_target == "cpu" and caps.backends[0].name == "cpu"


def test_warm_yields_one_result_per_item(daemon):
    fake, address = daemon
    fake.fail("Warm", grpc.StatusCode.UNAVAILABLE, times=1)
    with client(address) as c:
        results = list(c.warm([(elementwise.add(), "cpu"), (elementwise.add(), "nope:x"),
                               (elementwise.add(), "cpu")]))
    assert [r.index for r in results] == [0, 1, 2]
    assert results[0].code == 0 and not results[0].cache_hit and results[2].cache_hit
    assert isinstance(error_for_code(results[1].code, results[1].message), UnsupportedTarget)
    assert fake.calls["Warm"] == 2


def test_async_client_round_trip(daemon):
    fake, address = daemon
    fake.inline, fake.chunk_bytes = False, 4096
    fake.fail("Compile", grpc.StatusCode.UNAVAILABLE, times=1)

    async def main():
        async with AsyncClient(address, timeout_s=10, backoff_s=0.01) as c:
            kernel = await c.compile(elementwise.add(), "cpu")
            assert await c.compile(elementwise.add(), "cpu") is kernel
            warmed = [r async for r in c.warm([(elementwise.add(), "cpu")])]
            missing = await c.find_missing([kernel.action_key])
            caps = await c.capabilities()
            with pytest.raises(ArtifactNotFound):
                await c.get_artifact("0" * 64)
            fake.fail("Compile", grpc.StatusCode.INVALID_ARGUMENT, "k.py:1: bad")
            with pytest.raises(VerifyError, match=r"k\.py:1: bad"):
                await c.compile_raw(elementwise.add(), "cpu")
            return kernel, warmed, missing, caps

    kernel, warmed, missing, caps = asyncio.run(main())
    check_runs(kernel)
    assert fake.calls["Compile"] == 4 and fake.calls["GetArtifact"] == 2  # the artifact, the miss
    assert warmed[0].cache_hit and missing == [] and caps.version == "fake"


def test_async_server_down(tmp_path):
    async def main():
        async with AsyncClient(f"unix://{tmp_path}/nobody.sock", timeout_s=10, retries=2,
                               backoff_s=0.01) as c:
            await c.capabilities()

    with pytest.raises(ServerUnavailable):
        asyncio.run(main())


def test_compile_via_server_uses_tiled_server(daemon):
    fake, address = daemon
    with config.override(server=address):
        kernel = compile_via_server(elementwise.add(), "cpu", opt=1)
        assert compile_via_server(elementwise.add(), "cpu", opt=1) is kernel
        compile_via_server(elementwise.add(), "cpu", cache=False, opt=1)
    check_runs(kernel)
    assert fake.calls["Compile"] == 2 and fake.requests[0].options_json == '{"opt":1}'


def test_client_without_address_is_an_error():
    with config.override(server=""), pytest.raises(TiledError, match="TILED_SERVER"):
        Client()


def test_importing_the_client_imports_neither_tvm_nor_the_compiler():
    code = ("import sys, tiled.client, tiled.client.aio\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'tvm'\n"
            "             or m.startswith('tiled.compiler'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
