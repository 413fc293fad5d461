"""Which daemon sockets a client trusts (issue 10, finding 4: a socket swapped by another user).

The daemon sends shared libraries and cubins that the client loads and runs, so whoever can
put a socket at the path, or swap the one there, chooses code this process runs. Before every
call to a `unix:` address the client refuses (UntrustedSocket) a socket
- owned by a user other than this process's effective user or root,
- that is a symlink owned by such a user (who could point it at their own daemon),
- whose directory is owned by such a user, or is a symlink owned by one,
- whose directory is writable by group or others without the sticky bit (anyone who can write
  the directory can rename the socket away and bind their own; the sticky bit stops that for
  entries they do not own, as in /tmp).

Root is trusted as an owner: it can replace this process's own files anyway, so trusting it
opens nothing, and a daemon started by root for a user (containers, system services) is
plausible. A socket that does not exist yet (a daemon not started) is left to gRPC:
UNAVAILABLE, retried with backoff, and checked again before each attempt; its directory, when
it exists, is checked all the same. As on the daemon's side (tiled.server.app), only the
socket's own directory is checked, not its ancestors. Costs two lstat calls per call.
"""

from __future__ import annotations

import os
import stat

from tiled.client.errors import UntrustedSocket

LOADS = "the daemon sends shared libraries that this process loads"


def socket_path(address: str) -> str | None:
    """The filesystem path of a `unix:PATH` or `unix:///ABSOLUTE` address; None for any other
    address (host:port, unix-abstract:)."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    return path[2:] if path.startswith("//") else path


def refuse_untrusted_socket(address: str) -> None:
    """Raises UntrustedSocket, naming the path and its owner, when the daemon socket at
    `address` could have been placed or swapped by another user (see the module's rules).
    Returns for a trusted socket, a missing one, and an address that is not `unix:`."""
    path = socket_path(address)
    if not path:
        return
    euid = os.geteuid()
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    try:
        dir_link = os.lstat(directory)
    except OSError:
        return  # no directory (or one this user cannot search): gRPC reports it
    try:
        sock_link: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        sock_link = None  # not bound yet: its directory is still checked
    except OSError:
        return
    for what, link in ((f"its directory {directory}", dir_link), ("it", sock_link)):
        if link is not None and stat.S_ISLNK(link.st_mode) and not _trusted(link.st_uid, euid):
            raise UntrustedSocket(
                f"refusing the daemon socket {path}: {what} is a symlink owned by "
                f"{_who(link.st_uid)}, {_neither(euid)}: they could point it at another "
                f"daemon; {LOADS}")
    dir_st, sock_st = dir_link, sock_link
    if stat.S_ISLNK(dir_link.st_mode) or (sock_link is not None and
                                          stat.S_ISLNK(sock_link.st_mode)):
        path = os.path.realpath(path)  # the checks below are on what the links lead to
        directory = os.path.dirname(path)
        try:
            dir_st = os.stat(directory)
            sock_st = os.stat(path) if sock_link is not None else None
        except OSError:
            return  # a dangling link: gRPC reports it
    if not _trusted(dir_st.st_uid, euid):
        raise UntrustedSocket(
            f"refusing the daemon socket {path}: its directory {directory} belongs to "
            f"{_who(dir_st.st_uid)}, {_neither(euid)}: they could replace the socket; "
            f"{LOADS}. Use a daemon whose socket is in a directory of your own")
    if dir_st.st_mode & 0o022 and not dir_st.st_mode & stat.S_ISVTX:
        raise UntrustedSocket(
            f"refusing the daemon socket {path}: its directory {directory} is writable by "
            f"group or others without the sticky bit (mode {stat.S_IMODE(dir_st.st_mode):04o}),"
            f" so another user could replace the socket; {LOADS}. Run chmod go-w {directory}")
    if sock_st is not None and not _trusted(sock_st.st_uid, euid):
        raise UntrustedSocket(
            f"refusing the daemon socket {path}: it belongs to {_who(sock_st.st_uid)}, "
            f"{_neither(euid)}; {LOADS}. Use a daemon of your own (tiled serve)")


def _trusted(uid: int, euid: int) -> bool:
    return uid in (euid, 0)


def _neither(euid: int) -> str:
    return "not root" if euid == 0 else f"neither this user, {_who(euid)}, nor root"


def _who(uid: int) -> str:
    """`name (uid N)`, or `uid N` where the user database has no name for it."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
