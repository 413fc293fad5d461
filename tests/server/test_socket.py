"""Who may own the daemon's Unix socket (issue 10, finding 4): a real `tiled serve` on a real
path. The daemon makes its directory 0700 or refuses one that another user could write;
it deletes nothing at the path but a stale socket; it refuses to take over a live one; and on
shutdown it removes only the socket it created."""

import os
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.daemon_util import ROOT, end_daemon, serve_refused, start_daemon, stop_daemon
from tiled.v1 import compile_pb2 as cpb

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a directory of another uid")
NOBODY = 65534


def capabilities(d) -> str:
    return d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60).local_target


def test_missing_directory_is_created_0700_and_the_socket_0600(tmp_path):
    sock = tmp_path / "new" / "tiled.sock"
    d = start_daemon(tmp_path, "--workers", "1", sock=sock)
    try:
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    finally:
        stop_daemon(d)


def _serve_at(sock: Path, *args: str) -> str:
    return serve_refused("--socket", str(sock), "--workers", "1", *args)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_directory_writable_by_others_is_refused(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(mode)
    assert "writable by group or others" in _serve_at(d / "tiled.sock")
    assert list(d.iterdir()) == []  # nothing made there, not even the lock file


@as_root
def test_directory_of_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    assert f"belongs to uid {NOBODY}" in _serve_at(d / "tiled.sock")


@as_root
def test_symlinked_directory_owned_by_another_user_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, NOBODY, NOBODY)  # they could point it elsewhere later
    assert "symlink owned by uid" in _serve_at(link / "tiled.sock")


def test_default_socket_directory_is_checked_too(tmp_path):
    """TILED_SOCKET's default, /tmp/tiled-<uid>/tiled.sock: another local user may have
    created the directory first. The uid is faked (in the daemon process only) so that the
    test owns a fresh default path."""
    uid = 3_000_000 + uuid.uuid4().int % 1_000_000
    d = Path(f"/tmp/tiled-{uid}")
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k != "TILED_SOCKET"}
    try:
        r = subprocess.run(
            [sys.executable, "-c", f"import os; os.getuid = lambda: {uid}\n"
             "from tiled.cli import main; raise SystemExit(main(['serve', '--workers', '1']))"],
            env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"socket directory {d} is writable by group or others" in r.stderr
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def test_regular_file_is_never_deleted(tmp_path):
    sock = tmp_path / "tiled.sock"
    sock.write_text("precious")
    assert "is not a socket; not deleting it" in _serve_at(sock)
    assert sock.read_text() == "precious"


def test_directory_at_the_socket_path_is_refused(tmp_path):
    sock = tmp_path / "tiled.sock"
    sock.mkdir()
    (sock / "inside").write_text("x")
    assert "is a directory" in _serve_at(sock)
    assert (sock / "inside").read_text() == "x"


@pytest.mark.parametrize("target", ["dangling", "file", "socket"])
def test_symlink_at_the_socket_path_is_refused(tmp_path, target):
    sock = tmp_path / "tiled.sock"
    dest = tmp_path / "elsewhere"
    listener = None
    if target == "file":
        dest.write_text("x")
    elif target == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(dest))
    sock.symlink_to(dest)
    try:
        assert "is a symlink" in _serve_at(sock)
        assert sock.is_symlink() and os.readlink(sock) == str(dest)
    finally:
        if listener is not None:
            listener.close()


def test_stale_socket_is_replaced(tmp_path):
    sock = tmp_path / "tiled.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()  # the path remains, nothing listens: a daemon that was killed
    old = sock.stat().st_ino
    d = start_daemon(tmp_path, "--workers", "1")
    try:
        assert capabilities(d) == "cpu" and sock.stat().st_ino != old
    finally:
        stop_daemon(d)


def test_a_second_daemon_does_not_take_over_a_live_one(tmp_path):
    d = start_daemon(tmp_path, "--workers", "1")
    try:
        ino = d["sock"].stat().st_ino
        message = _serve_at(d["sock"])
        assert "another tiled serve holds" in message
        assert d["sock"].stat().st_ino == ino and capabilities(d) == "cpu"
    finally:
        stop_daemon(d)


def test_something_else_listening_is_not_taken_over(tmp_path):
    """A live listener that is not a tiled daemon (no lock file): found by connecting."""
    sock = tmp_path / "tiled.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen()
    try:
        assert "already listening" in _serve_at(sock)
        assert stat.S_ISSOCK(sock.lstat().st_mode)
    finally:
        listener.close()


def test_shutdown_removes_only_the_socket_it_created(tmp_path):
    d = start_daemon(tmp_path, "--workers", "1")
    sock = d["sock"]
    sock.unlink()  # someone replaced the daemon's socket with their own
    theirs = socket.socket(socket.AF_UNIX)
    theirs.bind(str(sock))
    theirs.listen()
    try:
        ino = sock.stat().st_ino
        code, out = end_daemon(d)
        assert code == 0, out
        assert sock.stat().st_ino == ino, "the daemon deleted a socket it did not create"
        assert "no longer the socket this daemon bound" in out
    finally:
        theirs.close()
