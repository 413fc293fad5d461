"""Cache test helpers: entries, and a real redis-server on a free localhost port.

`redis_server` needs the `redis-server` binary (Debian: apt-get install redis-server) and the
`redis` Python client. Without them the Redis tests skip, except under CI (the CI variable
set), where a missing Redis is a failure: the shared tier must not go untested silently.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tiled.cache.entry import Entry, sha256_hex
from tiled.cache.keys import action_record, key_of_record

ARCH = {"cpu": "x86-64", "cuda": "sm_90a"}
FORMAT = {"cpu": "so", "cuda": "cubin"}


def toolchain_of(target: str, options=None) -> str:
    """The toolchain digest tests pretend this host has for `target` ("backend:arch"); the
    shape of tiled.cache.bundle.ToolchainDigest."""
    return sha256_hex(f"toolchain for {target}".encode())


def manifest_for(tag: str, artifact: str, backend: str = "cpu", symbol: str = "k",
                 namespace: str = "", toolchain: str | None = None, options=None,
                 action: bool = True) -> tuple[str, bytes]:
    """(key, manifest bytes) of a valid launch manifest for program `tag` (its digest is
    sha256 of the tag) whose artifact is the blob `artifact`, carrying the action record whose
    digest is the key (unless `action` is false: a manifest of an older tiled). The key
    depends on the tag, backend, options, toolchain and namespace, never on the artifact."""
    arch = ARCH[backend]
    program = sha256_hex(f"program:{tag}".encode())
    record = action_record(program, {"backend": backend, "arch": arch}, options,
                           toolchain or toolchain_of(f"{backend}:{arch}"), namespace)
    manifest = {"manifest_version": 1, "name": "k", "program_digest": program,
                "target": backend if backend == "cpu" else f"{backend}:{arch}",
                "backend": backend, "arch": arch, "artifact_format": FORMAT[backend],
                "artifact_sha256": artifact, "symbol": symbol,
                "params": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": ["n"]}],
                "grid": [["ceildiv", "n", 128], 1, 1], "block": [128, 1, 1]}
    if action:
        manifest["action"] = record
    return key_of_record(record), json.dumps(manifest, sort_keys=True).encode()


def entry_for(tag: str, blobs: list[bytes], **kw) -> Entry:
    """A valid entry for program `tag` whose artifact is blobs[0] (the others ride along)."""
    key, manifest = manifest_for(tag, sha256_hex(blobs[0]), **kw)
    return Entry(key, manifest, {sha256_hex(b): b for b in blobs})


def make_entry(i: int, size: int = 100, blobs: int = 1, **kw) -> Entry:
    """A valid entry with `blobs` (>= 1) distinct blobs of `size` bytes each, unique to `i`."""
    datas = [(f"entry-{i}-blob-{j}:".encode() * (size // 8 + 1))[:size] for j in range(blobs)]
    return entry_for(f"entry-{i}", datas, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the Redis tests must run", pytrace=False)
    pytest.skip(reason)


class RedisServer:
    """One redis-server process with no persistence, restartable on the same port."""

    def __init__(self, binary: str, workdir: Path):
        self.binary, self.workdir, self.port = binary, workdir, _free_port()
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> None:
        assert not self.running
        log = open(self.workdir / "redis.log", "ab")  # the child keeps its own descriptor
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while not self._ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                text = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"redis-server on port {self.port} did not start:\n{text}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freezes the server (SIGSTOP): connections open, nothing answers. A slow Redis."""
        assert self.running
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.paused and self.running:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


@pytest.fixture(scope="session")
def _redis_process(tmp_path_factory):
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server is not installed (apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        _unavailable("the redis Python client is not installed (pip install 'redis>=5')")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(_redis_process):
    """A running, empty redis-server. A test may stop(), restart(), pause() or resume() it;
    the next test gets it running and flushed again."""
    server = _redis_process
    server.resume()
    if not server.running:
        server.start()
    with server.client() as c:
        c.flushall()
    yield server
    server.resume()
