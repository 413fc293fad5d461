"""The disk tier's shared bookkeeping (see tiled.cache.disk for the layout): the lock every
mutation holds, the byte ledger with per-writer reservations, writer tokens and their
staleness, and the least-recently-used order of entries.

The ledger is a hint kept safe in one direction: every sequence that changes the directory
updates the ledger so that a crash at any point leaves `used` at or above the bytes really
stored (an over-count costs an early eviction; an under-count could break the cap). A ledger
that is missing or does not parse is rebuilt by measuring the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_LEDGER_PAD = 4096  # rewritten in place and padded: a full disk never needs a new block for it


def _host_tag() -> str:
    """This host and pid namespace: two containers sharing a hostname still differ, so a pid
    is only ever judged dead by a process that can see it."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:48] or "host"
    try:
        return f"{host}-{os.stat('/proc/self/ns/pid').st_ino:x}"
    except OSError:
        return host


HOST_TAG = _host_tag()


def writer_token() -> str:
    """A name unique across hosts and processes: `<host>.<pid>.<random>`."""
    return f"{HOST_TAG}.{os.getpid()}.{secrets.token_hex(6)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def token_is_stale(token: str, age_s: float, stale_after_s: float) -> bool:
    """A writer token (or a staging name ending in one) whose owner is gone: older than
    `stale_after_s`, or made on this host by a pid that no longer runs."""
    if age_s > stale_after_s:
        return True
    parts = token.split(".")
    if len(parts) < 3 or parts[-3] != HOST_TAG or not parts[-2].isdigit():
        return False
    return not _pid_alive(int(parts[-2]))


class LedgerState:
    """The ledger's contents while the lock is held. `used`: bytes published (records and
    blob inodes); `reservations`: token -> [bytes, unix time] of writes in flight;
    `recount`: set when a sweep removed files whose bytes the ledger may still count."""

    def __init__(self, save: Callable[[LedgerState], None], used: int = 0,
                 reservations: dict[str, list[float]] | None = None, recount: bool = False):
        self._save = save
        self.used = used
        self.reservations = reservations or {}
        self.recount = recount

    @property
    def reserved(self) -> int:
        return int(sum(r[0] for r in self.reservations.values()))

    def reserve(self, token: str, nbytes: int) -> None:
        self.reservations[token] = [nbytes, time.time()]

    def release(self, token: str) -> None:
        self.reservations.pop(token, None)

    def prune(self, stale_after_s: float) -> None:
        """Drops reservations of writers that died (their staging is swept separately)."""
        now = time.time()
        for token, (_, created) in list(self.reservations.items()):
            if token_is_stale(token, now - created, stale_after_s):
                del self.reservations[token]

    def save(self) -> None:
        self._save(self)

    def to_json(self) -> bytes:
        return json.dumps({"v": 1, "used": max(0, int(self.used)),
                           "reservations": self.reservations, "recount": self.recount},
                          separators=(",", ":")).encode()


class Ledger:
    """The file lock (`lock`) and the ledger file (`ledger`) under one cache directory.

    `locked()` serializes every mutation of the directory across threads (a mutex) and
    processes and hosts (flock on `lock`; Linux NFS clients map flock to byte-range locks, so
    it holds across hosts that mount the directory). Its state is saved on leaving the block,
    on an exception too: the files it describes have changed either way."""

    def __init__(self, base: Path, measure: Callable[[], int]):
        self._lock_path = base / "lock"
        self._path = base / "ledger"
        self._measure = measure
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def locked(self, blocking: bool = True) -> Iterator[LedgerState]:
        """Raises BlockingIOError when `blocking` is false and another holder has the lock."""
        if not self._mutex.acquire(blocking):
            raise BlockingIOError("disk cache lock is held in this process")
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                state = self._load()
                before = state.to_json()
                try:
                    yield state
                finally:
                    if state.to_json() != before:
                        self._write(state)
            finally:
                os.close(fd)  # releases the flock
        finally:
            self._mutex.release()

    def _load(self) -> LedgerState:
        try:
            data = json.loads(self._path.read_bytes())
            if data.get("v") != 1:
                raise ValueError(f"ledger version {data.get('v')!r}")
            return LedgerState(self._write, int(data["used"]), dict(data["reservations"]),
                               bool(data.get("recount")))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("disk cache ledger %s unreadable (%s); measuring the directory",
                        self._path, e)
        state = LedgerState(self._write, self._measure())
        self._write(state)
        return state

    def _write(self, state: LedgerState) -> None:
        data = state.to_json()
        data += b" " * (_LEDGER_PAD - len(data)) + b"\n" if len(data) < _LEDGER_PAD else b"\n"
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            if os.fstat(fd).st_size > len(data):
                os.ftruncate(fd, len(data))
            os.fsync(fd)  # a lost ledger update after power loss could under-count
        finally:
            os.close(fd)


def lru_order(ac: Path, record: str) -> list[tuple[int, str]]:
    """Every entry directory under `ac` as (last use in ns, path), least recently used first.
    The last use is the record's mtime, which a hit bumps; an entry without a record sorts
    first. O(entries): only eviction and gc call it, never a lookup."""
    out: list[tuple[int, str]] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(ac) as shards:
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError), os.scandir(shard.path) as entries:
                for e in entries:
                    try:
                        mtime = os.stat(os.path.join(e.path, record)).st_mtime_ns
                    except OSError:
                        mtime = 0
                    out.append((mtime, e.path))
    out.sort()
    return out
