"""The disk tier's publish path (tiled.cache.disk for the layout and its invariants): how a
put becomes an entry, as a mixin of DiskTier. Reserve space in the ledger (evicting under the
lock), stage every file in `staging/w.<token>/` and fsync it, then under the lock count the
bytes, link the blobs into cas/ and rename the directory into ac/; a failure anywhere undoes
the stage and the reservation. Each step's ordering is what keeps a crash from publishing a
torn entry or leaving the ledger under-counted, so the steps live together, apart from the
read path they are written for.

PublishPath's methods keep their names on DiskTier (tiled.cache.disk_maintenance and the
tests see one class); it uses the tier's settings, its layout and ledger, and the tier's read
and removal steps, declared below. This module never imports tiled.cache.disk: disk imports
it, never the other way round. The fault points (`self._checkpoint`) and the file writes
(`self._write_file`) go through the tier, which looks them up in tiled.cache.disk when called:
that is where tests kill a writer (`_unsafe_fault_hook`) or fail its writes (`write_file`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tiled.cache.disk_layout import RECORD, Corrupt, encode_record, fsync_dir
from tiled.cache.disk_lru import writer_token
from tiled.errors import CacheWriteError

if TYPE_CHECKING:
    from tiled.cache.disk_layout import Layout
    from tiled.cache.disk_lru import Ledger, LedgerState
    from tiled.cache.entry import CacheEvents, Entry

# The tier's logger: an operator who filters on tiled.cache.disk sees the publish path's
# messages too, as before it moved here.
log = logging.getLogger("tiled.cache.disk")

LOW_WATER = 0.9  # eviction frees down to this fraction of the cap, so it runs rarely


class PublishPath:
    """The steps of DiskTier.put (module docstring): `_put` and the reserve, stage, commit
    and abandon it runs. Thread-safe and process-safe as DiskTier is: every change to the
    ledger, cas/ and ac/ happens under the ledger's lock."""

    if TYPE_CHECKING:  # provided by DiskTier (tiled.cache.disk)
        name: str
        root: Path
        max_bytes: int
        stale_after_s: float
        events: CacheEvents
        _layout: Layout
        _ledger: Ledger
        _staging: Path

        @staticmethod
        def _checkpoint(point: str) -> None: ...
        @staticmethod
        def _write_file(path: Path, data: bytes | Iterable[bytes], mode: int) -> str | None: ...
        def _load(self, key: str, touch: bool, keep: bool = True) -> tuple[
                str, Entry | None, Exception | None, tuple[int, int] | None]: ...
        def _remove_corrupt(self, key: str, ident: tuple[int, int] | None,
                            problem: Corrupt) -> bool: ...
        def _evict(self, led: LedgerState, target: int) -> None: ...
        def _drop_if_broken(self, led: LedgerState, key: str) -> bool: ...

    def _put(self, key: str, manifest: bytes, sizes: dict[str, int],
             data: Callable[[str], bytes | Iterator[bytes]]) -> None:
        """Publishes an entry whose blob `digest` has `sizes[digest]` bytes, given by
        `data(digest)` (verified as it is written). The entry was checked by the caller."""
        status, _, problem, ident = self._load(key, touch=True, keep=False)
        if status == "hit":
            return  # first complete put wins
        if status == "corrupt":
            assert isinstance(problem, Corrupt)
            self._remove_corrupt(key, ident, problem)
        record = encode_record(key, manifest, sizes)
        need = len(record) + sum(sizes.values())
        if need > self.max_bytes:
            self.events.error(self.name, "write")
            raise CacheWriteError(
                f"entry {key[:12]} needs {need} bytes, more than the whole disk cache cap "
                f"of {self.max_bytes} bytes at {self.root}; raise TILED_CACHE_MAX_BYTES")
        token = writer_token()
        stage = self._staging / f"w.{token}"
        try:
            self._reserve(token, need)
            try:
                self._stage(stage, record, sizes, data)
                shared = {d: ino for d, n in sizes.items()
                          if (ino := self._layout.stored_inode(d, n)) is not None}
                written = self._commit(token, stage, key, sizes, len(record), shared)
            except BaseException:
                self._abandon(token, stage)
                raise
        except CacheWriteError:
            self.events.error(self.name, "write")
            raise
        except OSError as e:
            self.events.error(self.name, "write")
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheWriteError(f"cache disk full at {self.root}: {e}") from e
            raise CacheWriteError(f"disk cache write at {self.root} failed: {e}") from e
        if written:
            self.events.bytes_written(self.name, written)

    def _reserve(self, token: str, need: int) -> None:
        with self._ledger.locked() as led:
            led.prune(self.stale_after_s)
            if led.used + led.reserved + need > self.max_bytes:
                self._evict(led, int(self.max_bytes * LOW_WATER) - need)
            if led.used + led.reserved + need > self.max_bytes:
                raise CacheWriteError(
                    f"disk cache at {self.root} is full: {led.used} bytes stored and "
                    f"{led.reserved} reserved by writes in flight, {need} more needed, cap "
                    f"{self.max_bytes}; the entries left are being read")
            led.reserve(token, need)
        self._checkpoint("reserved")

    def _stage(self, stage: Path, record: bytes, sizes: dict[str, int],
               data: Callable[[str], bytes | Iterator[bytes]]) -> None:
        os.mkdir(stage)
        for digest in sizes:
            try:
                written = self._write_file(stage / digest, data(digest), 0o444)
            except ValueError as e:  # a source file that ends early
                raise CacheWriteError(f"blob {digest[:12]}: {e}") from None
            if written is not None and written != digest:
                raise CacheWriteError(f"blob {digest[:12]} does not hash to its name "
                                      "(changed while it was copied?)")
        self._checkpoint("staged-blobs")
        self._write_file(stage / RECORD, record, 0o644)
        fsync_dir(stage)
        self._checkpoint("staged")

    def _commit(self, token: str, stage: Path, key: str, sizes: dict[str, int],
                record_len: int, shared: dict[str, tuple[int, int]]) -> int:
        """Links blobs into cas/ and publishes `stage`; returns the bytes newly stored (0 when
        another writer published a complete entry for the key first)."""
        final = self._layout.entry_dir(key)
        dirs = {final.parent}
        with self._ledger.locked() as led:
            # Count every staged byte, even those dedup is about to drop: counted before
            # any link, a crash from here on over-counts and never under-counts.
            planned = record_len + sum(sizes.values())
            led.release(token)
            led.used += planned
            led.save()
            self._checkpoint("committing")
            try:
                stored = record_len
                for digest, size in sizes.items():
                    dirs.add(self._layout.cas_path(digest).parent)
                    if not self._layout.link_blob(stage, digest, shared.get(digest)):
                        stored += size
                final.parent.mkdir(exist_ok=True)
                self._checkpoint("linked")
                try:
                    os.rename(stage, final)
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    if self._drop_if_broken(led, key):
                        os.rename(stage, final)  # a broken winner is no winner: replaced
                    else:  # lost the race: the winner's complete entry stands, ours goes
                        stored = max(0, stored - self._layout.free(stage))
            except BaseException:
                with contextlib.suppress(OSError):  # what free() could not remove stays counted
                    led.used -= self._layout.free(stage)
                raise
            led.used += stored - planned
        self._checkpoint("published")
        for d in dirs:
            with contextlib.suppress(OSError):  # published already; durability is best effort
                fsync_dir(d)
        return stored

    def _abandon(self, token: str, stage: Path) -> None:
        """Undoes a failed put: staged files, cas/ links they made, the reservation."""
        try:
            with self._ledger.locked() as led:
                led.release(token)
                if os.path.lexists(stage):
                    self._layout.free(stage)
        except OSError as e:
            log.warning("disk cache: cleaning %s failed (%s); gc() sweeps it", stage, e)
