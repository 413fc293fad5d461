"""A real `tiled serve` subprocess on a Unix socket, for tests that drive the daemon from the
outside (gRPC stubs, the CLI, the Node.js client). Each daemon gets its own cache directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
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


class DaemonLog:
    """A daemon's log (its stdout and stderr, one pipe), read by a thread as it is written:
    a pipe holds about 64 KiB, and a daemon blocked writing its log stops answering. Every
    line is kept. Thread-safe."""

    def __init__(self, stream):
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True,
                                        name="daemon-log")
        self._reader.start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            with self._lock:
                self._lines.append(line)
        stream.close()

    def lines(self) -> list[str]:
        """The lines read so far."""
        with self._lock:
            return list(self._lines)

    def text(self) -> str:
        """The log read so far."""
        return "".join(self.lines())

    def wait(self, timeout: float = 60) -> str:
        """The whole log, once the pipe is closed (the daemon and its workers exited)."""
        self._reader.join(timeout)
        if self._reader.is_alive():
            raise TimeoutError(f"the daemon's log was still open after {timeout} s")
        return self.text()


def start_daemon(base: Path, *args: str, library_memo: Path | None = None,
                 sock: Path | None = None) -> dict:
    """`tiled serve ARGS` with its socket (`sock`, default base/tiled.sock), cache (base/cache)
    and a metrics port of its own. Returns {"proc", "log" (a DaemonLog of the daemon's output:
    read that, not `proc.stdout`, which its thread reads), "sock", "address", "env" (what a CLI
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
    log = DaemonLog(proc.stdout)
    channel = grpc.insecure_channel(f"unix://{sock}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
    except grpc.FutureTimeoutError:
        proc.kill()
        proc.wait(60)
        channel.close()
        with contextlib.suppress(TimeoutError):  # its workers may hold the pipe a while
            log.wait(10)
        raise RuntimeError(f"daemon did not start:\n{log.text()}") from None
    return {"proc": proc, "log": log, "sock": sock, "address": f"unix://{sock}", "base": base,
            "env": {**env, "TILED_SERVER": f"unix://{sock}"}, "channel": channel,
            "stub": compile_pb2_grpc.CompilerStub(channel), "metrics": port}


def end_daemon(d: dict, timeout: float = 60) -> tuple[int, str]:
    """SIGTERM; waits for the daemon's exit. Returns (its exit code, its whole log)."""
    d["channel"].close()
    d["proc"].terminate()
    code = d["proc"].wait(timeout)
    return code, d["log"].wait(timeout)


def stop_daemon(d: dict) -> str:
    """SIGTERM, then checks a clean exit and that the socket is gone; returns the log."""
    code, out = end_daemon(d)
    assert code == 0, out
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
