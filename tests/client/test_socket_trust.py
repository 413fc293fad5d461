"""The client refuses a daemon socket another user could have placed or swapped (issue 10,
finding 4, client side): real sockets (tests/client/fake_server.py), and a refused client
never reaches them.

Another user's socket cannot be made without root, so "another user" is, as root, `nobody`
(chown) and, as anyone else, this user seen by a client whose effective uid is faked
(monkeypatched os.geteuid): every path of this user then belongs to someone else, while
root-owned /tmp stays trusted."""

import asyncio
import os
import pickle
import stat
import uuid
from pathlib import Path

import pytest

from tiled.client import Client, ServerUnavailable, UntrustedSocket
from tiled.client.aio import AsyncClient
from tiled.client.socket_trust import refuse_untrusted_socket, socket_path
from tiled.errors import TiledError

from .fake_server import serve

NOBODY = 65534
TMP = Path("/tmp")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a socket owned by root")
tmp_is_sticky = pytest.mark.skipif(
    not TMP.is_dir() or TMP.stat().st_uid != 0 or not TMP.stat().st_mode & stat.S_ISVTX,
    reason="needs a root-owned, sticky /tmp")


@pytest.fixture
def disown(monkeypatch):
    """disown(*paths): the paths belong to another user as the client sees them. Returns how
    the refusal names that owner."""
    real = os.geteuid()

    def give(*paths: Path) -> str:
        if real == 0:
            for p in paths:
                os.lchown(p, NOBODY, NOBODY)
            return f"uid {NOBODY}"
        monkeypatch.setattr(os, "geteuid", lambda: real + 1_000_000)
        return f"uid {real}"
    return give


@pytest.fixture
def scratch():
    """A name directly in /tmp (root-owned, sticky: a trusted directory), removed after."""
    made: list[Path] = []

    def name(kind: str) -> Path:
        made.append(TMP / f"tiled-test-{kind}-{uuid.uuid4().hex[:12]}")
        return made[-1]
    yield name
    for p in made:
        if p.is_symlink() or p.exists():
            p.unlink()


def client(address: str, **kw) -> Client:
    return Client(address, timeout_s=5, backoff_s=0.01, **kw)


def refused(address: str, fake) -> str:
    with client(address) as c, pytest.raises(UntrustedSocket) as info:
        c.capabilities()
    assert not fake.calls, "a refused client connected anyway"
    return str(info.value)


def test_addresses():
    assert socket_path("unix:///run/tiled.sock") == "/run/tiled.sock"
    assert socket_path("unix:/run/tiled.sock") == "/run/tiled.sock"
    assert socket_path("unix:rel/tiled.sock") == "rel/tiled.sock"
    assert socket_path("localhost:7000") is None
    assert socket_path("unix-abstract:tiled") is None
    refuse_untrusted_socket("localhost:7000")  # not a file: nothing to check


def test_own_socket_in_own_directory_is_used(tmp_path):
    with serve(tmp_path / "d.sock") as (fake, address), client(address) as c:
        assert c.capabilities().version == "fake" and fake.calls["Capabilities"] == 1


@tmp_is_sticky
def test_socket_of_another_user_is_refused(scratch, disown):
    sock = scratch("sock")
    with serve(sock) as (fake, address):
        owner = disown(sock)
        message = refused(address, fake)
    assert f"refusing the daemon socket {sock}: it belongs to" in message
    assert owner in message and "shared libraries" in message


@tmp_is_sticky
def test_a_socket_bound_after_the_client_started_is_checked_on_the_next_call(scratch,
                                                                             disown):
    """Not there yet: gRPC's UNAVAILABLE. Bound by another user since: refused."""
    sock = scratch("late")
    with client(f"unix://{sock}", retries=1) as c:
        with pytest.raises(ServerUnavailable):
            c.capabilities()
        with serve(sock) as (fake, _):
            disown(sock)
            with pytest.raises(UntrustedSocket, match="it belongs to"):
                c.capabilities()
            assert not fake.calls


def test_directory_of_another_user_is_refused(tmp_path, disown):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    with serve(d / "d.sock") as (fake, address):
        owner = disown(d)
        message = refused(address, fake)
    assert f"its directory {d} belongs to" in message and owner in message


def test_directory_of_another_user_is_refused_before_the_socket_exists(tmp_path, disown):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    disown(d)
    with client(f"unix://{d}/d.sock") as c, pytest.raises(UntrustedSocket, match="belongs to"):
        c.capabilities()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o722])
def test_directory_writable_by_others_without_sticky_bit_is_refused(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    with serve(d / "d.sock") as (fake, address):
        d.chmod(mode)
        message = refused(address, fake)
    assert f"its directory {d} is writable by group or others without the sticky bit " \
           f"(mode {mode:04o})" in message


def test_sticky_directory_holding_own_socket_is_used(tmp_path):
    d = tmp_path / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    with serve(d / "d.sock") as (fake, address), client(address) as c:
        assert c.capabilities().version == "fake" and fake.calls["Capabilities"] == 1


@tmp_is_sticky
def test_symlink_of_another_user_at_the_path_is_refused(tmp_path, scratch, disown):
    link = scratch("link")
    with serve(tmp_path / "d.sock") as (fake, _):
        link.symlink_to(tmp_path / "d.sock")
        owner = disown(link)
        message = refused(f"unix://{link}", fake)
    assert f"{link}: it is a symlink owned by" in message and owner in message


@tmp_is_sticky
def test_symlinked_directory_of_another_user_is_refused(tmp_path, scratch, disown):
    link = scratch("dirlink")
    with serve(tmp_path / "d.sock") as (fake, _):
        link.symlink_to(tmp_path)
        owner = disown(link)
        message = refused(f"unix://{link}/d.sock", fake)
    assert f"its directory {link} is a symlink owned by" in message and owner in message


def test_own_symlink_is_followed_and_its_target_checked(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    (tmp_path / "link.sock").symlink_to(d / "d.sock")
    with serve(d / "d.sock") as (fake, _):
        with client(f"unix://{tmp_path}/link.sock") as c:
            assert c.capabilities().version == "fake"
        fake.calls.clear()
        d.chmod(0o777)
        message = refused(f"unix://{tmp_path}/link.sock", fake)
    assert f"refusing the daemon socket {d / 'd.sock'}: its directory {d} is writable" in message


@as_root
def test_root_owned_socket_is_trusted(tmp_path, monkeypatch):
    """A daemon run by root for a user (containers): root can replace this user's files
    anyway, so trusting it opens nothing."""
    with serve(tmp_path / "d.sock") as (fake, address):
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
        with client(address) as c:
            assert c.capabilities().version == "fake" and fake.calls["Capabilities"] == 1


def test_async_client_refuses_too(tmp_path, disown):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)

    async def call(address):
        async with AsyncClient(address, timeout_s=5, backoff_s=0.01) as c:
            return await c.capabilities()

    with serve(d / "d.sock") as (fake, address):
        disown(d)
        with pytest.raises(UntrustedSocket, match="belongs to"):
            asyncio.run(call(address))
        assert not fake.calls


def test_the_refusal_is_a_tiled_permission_error_and_pickles():
    e = UntrustedSocket("refusing the daemon socket /x: it belongs to uid 7")
    assert isinstance(e, TiledError) and isinstance(e, PermissionError)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is UntrustedSocket and str(back) == str(e)
