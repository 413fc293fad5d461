"""A real `tiled serve` subprocess on a Unix socket, for tests that drive the daemon from the
outside (the CLI tests). Each daemon gets its own cache directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
MEMO = ("toolchain", "libraries.json")  # as tests/conftest.py: TVM's library hashes


@contextlib.contextmanager
def running_daemon(base: Path, library_memo: Path | None = None, workers: int = 2,
                   ) -> Iterator[dict]:
    """Starts `tiled serve` with its socket and cache under `base`; yields {"proc", "sock",
    "address", "env"}, where env is what a CLI subprocess needs to reach it. Stops it with
    SIGTERM on exit and checks that it shut down cleanly."""
    sock, cache = base / "tiled.sock", base / "cache"
    if library_memo is not None:  # skip hashing the 250 MB compiler library again
        cache.joinpath(MEMO[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(library_memo, cache.joinpath(*MEMO))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiled.cli", "serve", "--socket", str(sock), "--workers",
         str(workers), "--timeout", "120"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    channel = grpc.insecure_channel(f"unix://{sock}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
    except grpc.FutureTimeoutError:
        proc.kill()
        raise RuntimeError(f"daemon did not start:\n{proc.stdout.read()}") from None
    finally:
        channel.close()
    client_env = {**env, "TILED_SERVER": f"unix://{sock}"}
    try:
        yield {"proc": proc, "sock": sock, "address": f"unix://{sock}", "env": client_env}
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out


def tiled_cli(*args: str, env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`tiled ARGS...` as a subprocess (not checked: tests assert on the exit code)."""
    return subprocess.run([sys.executable, "-m", "tiled.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
