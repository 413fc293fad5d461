"""A real `tiled serve` subprocess on a Unix socket, for tests that drive the daemon from the
outside (gRPC stubs, the CLI, the Node.js client). Each daemon gets its own cache directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc

from tiled.v1 import compile_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MEMO = ("toolchain", "libraries.json")  # as tests/conftest.py: TVM's library hashes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(base: Path, *args: str, library_memo: Path | None = None,
                 sock: Path | None = None) -> dict:
    """`tiled serve ARGS` with its socket (`sock`, default base/tiled.sock), cache (base/cache)
    and a metrics port of its own. Returns {"proc", "sock", "address", "env" (what a CLI
    subprocess needs to reach it), "channel", "stub", "metrics" (the port), "base"}."""
    sock, cache = sock or base / "tiled.sock", base / "cache"
    if library_memo is not None:  # skip hashing the 250 MB compiler library again
        cache.joinpath(MEMO[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(library_memo, cache.joinpath(*MEMO))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiled.cli", "serve", "--socket", str(sock), "--metrics-port",
         str(port), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    channel = grpc.insecure_channel(f"unix://{sock}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
    except grpc.FutureTimeoutError:
        proc.kill()
        channel.close()
        raise RuntimeError(f"daemon did not start:\n{proc.communicate()[0]}") from None
    return {"proc": proc, "sock": sock, "address": f"unix://{sock}", "base": base,
            "env": {**env, "TILED_SERVER": f"unix://{sock}"}, "channel": channel,
            "stub": compile_pb2_grpc.CompilerStub(channel), "metrics": port}


def stop_daemon(d: dict) -> str:
    """SIGTERM, then checks a clean exit and that the socket is gone; returns the log."""
    d["channel"].close()
    d["proc"].terminate()
    out, _ = d["proc"].communicate(timeout=60)
    assert d["proc"].returncode == 0, out
    assert not d["sock"].exists()
    return out


@contextlib.contextmanager
def running_daemon(base: Path, library_memo: Path | None = None, workers: int = 2,
                   ) -> Iterator[dict]:
    """start_daemon with `workers` workers and a 120 s compile limit, stopped on exit."""
    d = start_daemon(base, "--workers", str(workers), "--timeout", "120",
                     library_memo=library_memo)
    try:
        yield d
    finally:
        stop_daemon(d)


def serve_refused(*args: str, env: dict | None = None) -> str:
    """Runs `tiled serve ARGS` expecting a refusal: exit code 2 and one line on stderr, no
    traceback. Returns that line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    r = subprocess.run([sys.executable, "-m", "tiled.cli", "serve", *args], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiled: error: "), r.stderr
    return lines[0]


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` alone (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"process {pid} has no VmRSS")


def tiled_cli(*args: str, env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`tiled ARGS...` as a subprocess (not checked: tests assert on the exit code)."""
    return subprocess.run([sys.executable, "-m", "tiled.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
