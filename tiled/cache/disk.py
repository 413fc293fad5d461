"""The local disk tier: the embedded default, zero setup, shared by every process (and every
host, over NFS) that points at the same directory.

Layout, under `root` (TILED_CACHE_DIR); `v1` is the format, a later one sits beside it:

    root/v1/cas/ab/<sha256>        a blob, named by the sha256 of its bytes (mode 0444)
    root/v1/ac/ab/<key>/           one action entry, published by one rename
    root/v1/ac/ab/<key>/record     sha256(rest) hex, "\\n", rest, where rest is a JSON header
                                   {"v":1,"key":...,"blobs":[[sha256,size],...]}, "\\n", then
                                   the manifest bytes verbatim; its mtime is the entry's last use
    root/v1/ac/ab/<key>/<sha256>   a hard link to the blob's inode (the same one as cas/)
    root/v1/staging/w.<token>/     a put in progress;  t.<token>/  an entry being removed
    root/v1/lock                   flock'ed by every mutation (publish, evict, remove, gc)
    root/v1/ledger                 bytes stored + reservations of writes in flight

`ab` is the name's first two hex digits; `<token>` is `<host>.<pid>.<random>`.

Invariants:
- An entry directory holds its own hard link to every blob it names, so it is complete by
  itself: nothing that happens to `cas/` (eviction, a lost race, a stale NFS attribute) can
  leave a published entry without a blob. `cas/` is the dedup index: a new entry whose blob is
  already there (and re-hashes to its name) links that inode instead of keeping its own copy.
  A blob inode is freed when its last link goes; a `cas/` file with one link is an orphan.
- A put stages every file in `staging/w.<token>/` on the same filesystem, fsyncs the files
  and the directory, then (under `lock`) links blobs into `cas/` and renames the directory
  to `ac/ab/<key>` (the record is written last, the rename publishes). A reader therefore
  sees a whole entry or none. An existing entry is never replaced: the first complete put
  wins, a lost race is a success, and a corrupt entry is removed by the reader that finds it.
  (These steps, with the reservation below, are tiled.cache.disk_publish.)
- Space is reserved in the ledger, evicting least recently used entries under `lock`, before
  any byte is written: a put proceeds only when `used + reserved` stays within `max_bytes`.
  The ledger over-counts after a crash rather than under-counts (see tiled.cache.disk_lru).
- A reader takes a shared flock on the entry's record, then checks that the directory is still
  the published one; eviction and `delete` take the exclusive lock (eviction without waiting:
  an entry being read is skipped) and move the directory away while holding it. So an entry
  is never removed while a reader holds it, and a reader never reads a half-removed one.
- Every blob is hashed on read and the manifest checked against the key and the blobs
  (tiled.cache.entry.check_manifest); a missing or wrong blob, a manifest that does not parse
  or names a blob the entry lacks, an action record of another key, or a record that fails its
  checksum, is a miss counted as "corrupt", logged, and the entry (and the corrupt cas/ inode)
  removed, so the next put of the key publishes a good one.
- Stale staging (a dead pid of this host, or older than `stale_after_s`) is swept on open
  and by `gc()`, which also removes orphan blobs and re-measures the ledger
  (tiled.cache.disk_maintenance, with `verify` and `stats`).

A hit opens the entry directory, its record and its blobs, and touches the record's mtime:
no directory listing, so its cost does not grow with the number of entries.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from tiled import config
from tiled.cache import disk_maintenance
from tiled.cache.disk_layout import (
    RECORD,
    Corrupt,
    DiskStats,
    Layout,
    Problem,
    decode_record,
    hash_fd,
    read_all,
    write_file,
)
from tiled.cache.disk_lru import Ledger, LedgerState, lru_order, writer_token
from tiled.cache.disk_publish import PublishPath
from tiled.cache.entry import (
    BlobFile,
    CacheEvents,
    Entry,
    NullEvents,
    check_manifest,
    is_digest,
    sha256_hex,
)
from tiled.errors import CacheWriteError

log = logging.getLogger(__name__)

# Test-only: called with a point name ("reserved", "staged-blobs", "staged", "committing",
# "linked", "published", "evicting") so a test can kill the writer exactly there.
_unsafe_fault_hook = None


def _checkpoint(point: str) -> None:
    if _unsafe_fault_hook is not None:
        _unsafe_fault_hook(point)


class DiskTier(PublishPath):
    """The disk tier (name "disk"). Thread-safe and safe across processes and hosts sharing
    `root` (see the module docstring for the layout and invariants).

    `get` never raises: a miss, a corrupt entry or an OSError is None, reported through
    `events`; an Entry it returns has every blob its manifest names, verified. `put` (and
    `put_files`, which streams blobs from files) publishes atomically or raises
    CacheWriteError (an invalid entry, one larger than `max_bytes`, a full disk, a cache whose
    space is all held by readers and writers in flight, any other OSError); nothing already
    stored is lost by a failed put, and a broken entry under the same key is replaced."""

    name = "disk"
    verifies_entries = True
    # PublishPath's seams (tiled.cache.disk_publish), looked up in this module when called, so
    # a test that patches tiled.cache.disk._unsafe_fault_hook or .write_file reaches them.
    _checkpoint = staticmethod(_checkpoint)

    @staticmethod
    def _write_file(path: Path, data: bytes | Iterable[bytes], mode: int) -> str | None:
        return write_file(path, data, mode)

    def __init__(self, root: Path | str | None = None, max_bytes: int | None = None,
                 events: CacheEvents | None = None, stale_after_s: float = 3600.0):
        self.root = Path(root if root is not None else config.get("cache_dir"))
        self.max_bytes = int(max_bytes if max_bytes is not None else config.get("cache_max_bytes"))
        self.events: CacheEvents = events or NullEvents()
        self.stale_after_s = stale_after_s
        self._layout = layout = Layout(self.root)
        self._ac, self._cas, self._staging = layout.ac, layout.cas, layout.staging
        self._ledger = Ledger(layout.base, layout.measure)
        try:
            for d in (self._ac, self._cas, self._staging):
                d.mkdir(parents=True, exist_ok=True)
            with os.scandir(self._staging) as it:
                leftovers = any(True for _ in it)
            if leftovers:
                with self._ledger.locked(blocking=False) as led:
                    disk_maintenance.sweep(layout, led, stale_after_s)
        except BlockingIOError:
            pass  # someone else holds the lock; gc() or a later open sweeps
        except OSError as e:
            log.warning("disk cache at %s not usable yet: %s", self.root, e)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        if not is_digest(key):
            self.events.lookup(self.name, "miss")
            return None
        status, entry, problem, ident = self._load(key, touch=True)
        if status == "corrupt":
            assert isinstance(problem, Corrupt)
            self._remove_corrupt(key, ident, problem)
        elif status == "error":
            log.warning("disk cache: reading %s failed: %s", key[:12], problem)
            self.events.error(self.name, "read")
        self.events.lookup(self.name, status)
        if entry is not None:
            self.events.bytes_read(self.name, entry.nbytes)
        return entry

    def _load(self, key: str, touch: bool, keep: bool = True) -> tuple[
            str, Entry | None, Exception | None, tuple[int, int] | None]:
        """(status, entry, problem, identity) with status hit | miss | corrupt | error. With
        `keep` false the blobs are hashed as they stream by and the entry has none (`blobs`
        {}): how put and verify check an entry without holding its blobs in memory."""
        d = self._layout.entry_dir(key)
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return "miss", None, None, None
        except NotADirectoryError:
            try:
                st = os.lstat(d)
            except OSError:
                return "miss", None, None, None
            return "corrupt", None, Corrupt("entry is not a directory"), (st.st_dev, st.st_ino)
        except OSError as e:
            return "error", None, e, None
        try:
            st = os.fstat(dfd)
            ident = (st.st_dev, st.st_ino)
            try:
                entry = self._read_entry(key, d, dfd, ident, touch, keep)
            except Corrupt as c:
                if not self._layout.published(d, ident):
                    return "miss", None, None, None  # removed while we read: not corruption
                return "corrupt", None, c, ident
            if entry is None:
                return "miss", None, None, None
            return "hit", entry, None, ident
        except OSError as e:
            return "error", None, e, None
        finally:
            os.close(dfd)

    def _read_entry(self, key: str, d: Path, dfd: int, ident: tuple[int, int],
                    touch: bool, keep: bool) -> Entry | None:
        try:
            rfd = os.open(RECORD, os.O_RDONLY, dir_fd=dfd)
        except FileNotFoundError:
            raise Corrupt("entry has no record") from None
        try:
            # Holding LOCK_SH on a still-published entry: no eviction can remove it now.
            fcntl.flock(rfd, fcntl.LOCK_SH)
            if not self._layout.published(d, ident):
                return None
            manifest, names = decode_record(read_all(rfd), key)
            try:
                check_manifest(key, manifest, {digest for digest, _ in names})
            except ValueError as e:
                raise Corrupt(str(e)) from None
            blobs: dict[str, bytes] = {}
            for digest, size in names:
                try:
                    bfd = os.open(digest, os.O_RDONLY, dir_fd=dfd)
                except FileNotFoundError:
                    raise Corrupt(f"blob {digest[:12]} is missing") from None
                try:
                    if keep:
                        data = read_all(bfd)
                        found = sha256_hex(data), len(data)
                        blobs[digest] = data
                    else:
                        found = hash_fd(bfd)
                finally:
                    os.close(bfd)
                if found != (digest, size):
                    raise Corrupt(f"blob {digest[:12]} does not hash to its name", digest)
            if touch:
                with contextlib.suppress(OSError):  # recency is best effort (read-only mounts)
                    os.utime(rfd)
            return Entry(key, manifest, blobs)
        finally:
            os.close(rfd)

    def get_blob(self, digest: str) -> bytes | None:
        """The blob whose sha256 is `digest`, from cas/ (verified), or None. Not a use of any
        entry: the blob may outlive its entries until gc() removes it as an orphan."""
        if not is_digest(digest):
            return None
        try:
            fd = os.open(self._layout.cas_path(digest), os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("disk cache: reading blob %s failed: %s", digest[:12], e)
            return None
        try:
            data = read_all(fd)
        except OSError as e:
            log.warning("disk cache: reading blob %s failed: %s", digest[:12], e)
            return None
        finally:
            os.close(fd)
        if sha256_hex(data) != digest:
            log.warning("disk cache: blob %s does not hash to its name (run `tiled cache "
                        "verify`)", digest[:12])
            return None
        return data

    def contains(self, key: str) -> bool:
        """Whether an entry is published under `key` (not verified; not a use)."""
        return is_digest(key) and os.path.isfile(self._layout.entry_dir(key) / RECORD)

    def keys(self) -> list[str]:
        """Every published key. O(entries): lists the directory."""
        return [path.rsplit(os.sep, 1)[-1] for _, path in lru_order(self._ac, RECORD)
                if is_digest(path.rsplit(os.sep, 1)[-1])]

    # -- writes (the publish steps: tiled.cache.disk_publish) ------------------------------

    def put(self, entry: Entry) -> None:
        try:
            entry.validate()
        except ValueError as e:
            self.events.error(self.name, "write")
            raise CacheWriteError(f"disk cache refused entry {entry.key[:12]}: {e}") from None
        self._put(entry.key, entry.manifest, {d: len(b) for d, b in entry.blobs.items()},
                  lambda digest: entry.blobs[digest])

    def put_files(self, key: str, manifest: bytes, blobs: dict[str, BlobFile]) -> None:
        """put() of the entry (key, manifest, blobs) whose blobs are read from files (bundle
        members) in CHUNK pieces, hashed as they are copied into the cache: memory stays
        bounded whatever the blob sizes. A blob whose bytes do not hash to its digest, or a
        file that ends early, is a CacheWriteError, and nothing is published."""
        try:
            if not is_digest(key) or not all(is_digest(d) for d in blobs):
                raise ValueError("the key and every blob name must be sha256 hex digests")
            check_manifest(key, manifest, blobs)
        except ValueError as e:
            self.events.error(self.name, "write")
            raise CacheWriteError(f"disk cache refused entry {key[:12]}: {e}") from None
        self._put(key, manifest, {d: f.size for d, f in blobs.items()},
                  lambda digest: blobs[digest].chunks())

    # -- removal ---------------------------------------------------------------------------

    def _unpublish(self, d: Path | str, wait: bool) -> int | None:
        """Moves a published entry away and frees it; None when a reader holds it (and `wait`
        is false) or it is gone. Call under the lock."""
        try:
            rfd = os.open(os.path.join(d, RECORD), os.O_RDWR)  # write mode: NFS needs it for
        except FileNotFoundError:                              # an exclusive lock
            rfd = None
        except NotADirectoryError:
            rfd = None
        try:
            if rfd is not None:
                try:
                    fcntl.flock(rfd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    return None
            trash = self._staging / f"t.{writer_token()}"
            try:
                os.rename(d, trash)
            except FileNotFoundError:
                return None
        finally:
            if rfd is not None:
                os.close(rfd)
        _checkpoint("evicting")
        return self._layout.free(trash)

    def _evict(self, led: LedgerState, target: int) -> None:
        """Evicts least recently used entries until used + reserved <= target. The ledger is
        saved once, when the lock is left: a crash before that over-counts, which is safe."""
        if led.recount:
            led.used, led.recount = self._layout.measure(), False
        count = nbytes = 0
        for _, path in lru_order(self._ac, RECORD):
            if led.used + led.reserved <= target:
                break
            freed = self._unpublish(path, wait=False)
            if freed is not None:
                led.used = max(0, led.used - freed)
                count, nbytes = count + 1, nbytes + freed
        if count:
            self.events.evicted(self.name, count, nbytes)

    def _remove_corrupt(self, key: str, ident: tuple[int, int] | None,
                        problem: Corrupt) -> bool:
        """Removes the corrupt entry directory (dev, inode) `ident` filed under `key`, if it is
        still the published one; True when it was removed."""
        log.warning("disk cache: entry %s at %s is corrupt (%s); removing it so the next put "
                    "replaces it", key[:12], self._layout.entry_dir(key), problem.detail)
        try:
            with self._ledger.locked() as led:
                return self._drop_corrupt(led, key, ident, problem)
        except OSError as e:
            log.warning("disk cache: removing corrupt entry %s failed: %s", key[:12], e)
            self.events.error(self.name, "delete")
            return False

    def _drop_corrupt(self, led: LedgerState, key: str, ident: tuple[int, int] | None,
                      problem: Corrupt) -> bool:
        """_remove_corrupt's work; call under the lock."""
        d = self._layout.entry_dir(key)
        if ident is None or not self._layout.published(d, ident):
            return False  # already removed or replaced
        trash = self._staging / f"t.{writer_token()}"
        os.rename(d, trash)
        led.used = max(0, led.used - self._layout.free(trash, bad=problem.digest))
        return True

    def _drop_if_broken(self, led: LedgerState, key: str) -> bool:
        """Removes the entry published under `key` when it is corrupt (call under the lock):
        a put that finds a broken entry where it meant to publish replaces it."""
        status, _, problem, ident = self._load(key, touch=False, keep=False)
        if status != "corrupt":
            return False
        assert isinstance(problem, Corrupt)
        log.warning("disk cache: entry %s is corrupt (%s); replacing it", key[:12],
                    problem.detail)
        return self._drop_corrupt(led, key, ident, problem)

    def delete(self, key: str) -> bool:
        """Removes `key`'s entry, waiting for its readers; False when there was none."""
        if not is_digest(key):
            return False
        try:
            with self._ledger.locked() as led:
                freed = self._unpublish(self._layout.entry_dir(key), wait=True)
                if freed is not None:
                    led.used = max(0, led.used - freed)
                return freed is not None
        except OSError as e:
            log.warning("disk cache: deleting %s failed: %s", key[:12], e)
            self.events.error(self.name, "delete")
            return False

    def clear(self) -> None:
        """Removes every entry (waiting for readers) and every blob."""
        with self._ledger.locked() as led:
            for _, path in lru_order(self._ac, RECORD):
                self._unpublish(path, wait=True)
            for path, _ in self._layout.files(self._cas):
                os.unlink(path)
            led.used, led.recount = self._layout.measure(), False

    # -- maintenance (tiled.cache.disk_maintenance) ----------------------------------------

    def gc(self) -> dict[str, int]:
        """Sweeps stale staging, removes orphan blobs (in cas/ only, named by no entry),
        re-measures the ledger and evicts down to the cap. O(files). Returns counts."""
        return disk_maintenance.gc(self)

    def total_bytes(self) -> int:
        """Bytes the ledger counts as stored or reserved: O(1), an upper bound of what the
        cache holds on disk (records and blobs; not directories, `lock` or `ledger`)."""
        with self._ledger.locked() as led:
            return led.used + led.reserved

    def stats(self) -> DiskStats:
        """Counts and measured bytes. O(files)."""
        return disk_maintenance.stats(self)

    def verify(self, repair: bool = False) -> list[Problem]:
        """Reads and hashes everything, streaming (O(bytes) time, O(1) memory per blob).
        Returns what is wrong: entries that get() would refuse (see the module docstring) or
        whose manifest carries no action record to check them against their key (written by
        a tiled before manifests carried one; no current compile looks them up), cas/ blobs
        that do not hash to their names, strays, stale staging. Without `repair` it changes
        nothing. With `repair` it removes each of them (an entry only while it is still the
        broken directory found, so a good entry published meanwhile stays) and marks the
        Problem `removed`; an "unreadable" entry or blob (an I/O error hid its contents) is
        left for the operator. The ledger is then re-measured."""
        return disk_maintenance.verify(self, repair)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""
