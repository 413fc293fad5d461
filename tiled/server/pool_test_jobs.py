"""Job functions that exist for the compile pool's tests only (tests/server/test_pool*.py):
the pool runs only functions under `tiled.` (its allow-list), so they live in the package, apart
from the pool itself. The one that fails inside TVM is tiled.compiler.pool_probe's: TVM stays
within tiled/compiler."""

import os
import signal
import tempfile
import time

from tiled.errors import CompileError


def _test_echo(payload: bytes) -> bytes:
    return payload


def _test_pid(payload: bytes) -> bytes:
    return str(os.getpid()).encode()


def _test_sleep(payload: bytes) -> bytes:
    time.sleep(float(payload))
    return payload


def _test_gate(payload: bytes) -> bytes:
    """Block until the file named by `payload` exists (the test opens the gate)."""
    while not os.path.exists(payload):
        time.sleep(0.01)
    return payload


def _test_crash(payload: bytes) -> bytes:
    os.kill(os.getpid(), signal.SIGKILL)
    return b""


def _test_alloc(payload: bytes) -> bytes:
    return str(len(bytearray(int(payload)))).encode()


def _test_raise(payload: bytes) -> bytes:
    raise CompileError(payload.decode(), loc="kernel.py:7")


def _test_raise_foreign(payload: bytes) -> bytes:
    """Raises an exception of a class outside the allow-list, with `payload` as its text."""
    raise LookupError(payload.decode())


def _test_tmp(payload: bytes) -> bytes:
    """Leaves a file in the job's temp directory; returns where Python and a child put temp
    files: {"tempfile": ..., "TMPDIR": ..., "child": ...}."""
    import json
    import subprocess

    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(payload)
    child = subprocess.run(["sh", "-c", 'echo "$TMPDIR"'], capture_output=True, text=True)
    return json.dumps({"tempfile": tempfile.gettempdir(), "TMPDIR": os.environ.get("TMPDIR"),
                       "child": child.stdout.strip(), "file": f.name}).encode()
