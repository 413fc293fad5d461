"""The disk tier's files (see tiled.cache.disk for the layout and its invariants): paths,
the entry record format, and the few file operations everything else is made of."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tiled.cache.disk_lru import token_is_stale
from tiled.cache.entry import CHUNK, is_digest, sha256_hex

log = logging.getLogger(__name__)

RECORD = "record"


@dataclass(frozen=True)
class Problem:
    """One thing `verify()` found wrong. kind: "entry" (an entry that cannot be served, or
    cannot be checked against its key; `key` names it), "unreadable" (an entry or blob an I/O
    error kept verify from reading: reported, never removed), "blob" (a cas/ file that does
    not hash to its name), "stray" (a file that does not belong in the layout) or "staging" (a
    stale leftover that gc() sweeps). `removed`: verify(repair=True) removed it."""

    kind: str
    path: str
    detail: str
    key: str | None = None
    removed: bool = False


@dataclass(frozen=True)
class DiskStats:
    entries: int
    blobs: int  # files in cas/
    bytes: int  # measured: unique inodes under ac/, cas/ and staging/
    ledger_bytes: int  # what the ledger counts as stored
    reserved_bytes: int  # reserved by writes in flight
    staging: int  # entries in staging/
    max_bytes: int


class Corrupt(Exception):
    def __init__(self, detail: str, digest: str | None = None):
        super().__init__(detail)
        self.detail, self.digest = detail, digest


def read_all(fd: int) -> bytes:
    parts, want = [], os.fstat(fd).st_size + 1
    while chunk := os.read(fd, max(want, 1 << 16)):
        parts.append(chunk)
    return b"".join(parts)


def hash_fd(fd: int) -> tuple[str, int]:
    """(sha256 hex, size) of what `fd` reads from its current offset, in CHUNK pieces."""
    h, n = hashlib.sha256(), 0
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def write_file(path: Path, data: bytes | Iterable[bytes], mode: int) -> str | None:
    """Writes `data` to a new file and fsyncs it. Given pieces (a blob streamed from a file)
    it returns the sha256 hex of what it wrote, so the pass that copies a blob also verifies
    it; given bytes (verified by the caller already) it returns None."""
    pieces: Iterable[bytes | bytearray | memoryview]
    if isinstance(data, bytes | bytearray | memoryview):
        pieces, h = (data,), None
    else:
        pieces, h = data, hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        for piece in pieces:
            if h is not None:
                h.update(piece)
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest() if h is not None else None


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_record(key: str, manifest: bytes, sizes: Mapping[str, int]) -> bytes:
    header = {"v": 1, "key": key, "blobs": [[d, n] for d, n in sorted(sizes.items())]}
    body = json.dumps(header, separators=(",", ":")).encode() + b"\n" + manifest
    return sha256_hex(body).encode() + b"\n" + body


def decode_record(data: bytes, key: str) -> tuple[bytes, list[tuple[str, int]]]:
    """(manifest, [(digest, size)]) of a record; raises Corrupt."""
    check, _, body = data.partition(b"\n")
    if check != sha256_hex(body).encode():
        raise Corrupt("record fails its checksum (truncated or garbled)")
    head, _, manifest = body.partition(b"\n")
    try:
        header = json.loads(head)
        blobs = [(str(d), int(n)) for d, n in header["blobs"]]
        ok = header["v"] == 1 and header["key"] == key
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
        raise Corrupt(f"record header unreadable: {e}") from None
    if not ok or not all(is_digest(d) and n >= 0 for d, n in blobs):
        raise Corrupt("record header names another key or a bad blob")
    return manifest, blobs


class Layout:
    """Paths under `root/v1`: ac/ (entries), cas/ (blobs), staging/ (work in flight)."""

    def __init__(self, root: Path):
        self.base = root / "v1"
        self.ac, self.cas, self.staging = self.base / "ac", self.base / "cas", self.base / "staging"

    def entry_dir(self, key: str) -> Path:
        return self.ac / key[:2] / key

    def cas_path(self, digest: str) -> Path:
        return self.cas / digest[:2] / digest

    @staticmethod
    def published(d: Path | str, ident: tuple[int, int] | None) -> bool:
        """Whether `d` is still the directory (dev, inode) `ident` that was opened."""
        try:
            st = os.stat(d)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == ident

    def stored_inode(self, digest: str, size: int) -> tuple[int, int] | None:
        """(dev, inode) of cas/<digest> when it exists and hashes to its name, else None."""
        try:
            fd = os.open(self.cas_path(digest), os.O_RDONLY)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size == size and hash_fd(fd) == (digest, size):
                return st.st_dev, st.st_ino
        except OSError:
            pass
        finally:
            os.close(fd)
        return None

    def link_blob(self, stage: Path, digest: str, shared: tuple[int, int] | None) -> bool:
        """Makes stage/<digest> share cas/'s inode (True) or enters it into cas/ (False)."""
        cas, staged = self.cas_path(digest), stage / digest
        if shared is not None:
            tmp = stage / f".{digest}"
            try:
                os.link(cas, tmp)
                st = os.lstat(tmp)
                if (st.st_dev, st.st_ino) == shared:
                    os.replace(tmp, staged)
                    return True
                os.unlink(tmp)  # cas/ changed since we hashed it: keep our own copy
            except OSError:
                pass  # gone, or no more links: our own copy stays
            return False
        cas.parent.mkdir(exist_ok=True)
        try:
            os.link(staged, cas)
        except FileExistsError:
            pass  # an unverified copy got there first; ours stays private to this entry
        except OSError as e:
            if e.errno not in (errno.EMLINK, errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            log.debug("disk cache: no hard link for %s (%s); not deduplicated", digest[:12], e)
        return False

    def free(self, path: Path | str, bad: str | None = None) -> int:
        """Removes an unpublished entry directory (or stray file) with the cas/ links that
        only it kept alive, and cas/<bad> if it is the same (corrupt) inode. Returns the bytes
        freed. Call under the lock. A file that cannot go now (an NFS client's silly-renamed
        open file) stays, with its directory, for a later sweep."""
        if not os.path.isdir(path) or os.path.islink(path):
            st = os.lstat(path)
            os.unlink(path)
            return st.st_size if st.st_nlink == 1 else 0
        freed = 0
        with os.scandir(path) as it:
            items = list(it)
        for e in items:
            try:
                freed += self._free_one(e, bad)
            except OSError as err:
                log.warning("disk cache: cannot remove %s yet: %s", e.path, err)
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return freed

    def _free_one(self, e: os.DirEntry, bad: str | None) -> int:
        st = e.stat(follow_symlinks=False)
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
            return 0
        gone = 1
        name = e.name.lstrip(".")
        if is_digest(name) and st.st_nlink >= 2:
            cas = self.cas_path(name)
            with contextlib.suppress(FileNotFoundError):
                cst = os.lstat(cas)
                if (cst.st_dev, cst.st_ino) == (st.st_dev, st.st_ino) and (
                        st.st_nlink == 2 or name == bad):
                    os.unlink(cas)
                    gone = 2
        os.unlink(e.path)
        return st.st_size if gone >= st.st_nlink else 0

    @staticmethod
    def files(top: Path) -> Iterator[tuple[str, os.stat_result]]:
        """(path, lstat) of every file in `top`'s shards (and stray files beside them)."""
        with contextlib.suppress(FileNotFoundError), os.scandir(top) as shards:
            for shard in list(shards):
                names = [shard]
                if shard.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError), os.scandir(shard.path) as it:
                        names = list(it)
                for e in names:
                    with contextlib.suppress(FileNotFoundError):
                        yield e.path, e.stat(follow_symlinks=False)

    def measure(self) -> int:
        """Bytes of the unique inodes under ac/, cas/ and staging/. O(files)."""
        seen: dict[tuple[int, int], int] = {}
        for top in (self.ac, self.cas, self.staging):
            for root, _dirs, files in os.walk(top):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        st = os.lstat(os.path.join(root, name))
                        seen[(st.st_dev, st.st_ino)] = st.st_size
        return sum(seen.values())

    def stale_staging(self, stale_after_s: float) -> list[str]:
        """Staging paths whose writer is gone (see disk_lru.token_is_stale)."""
        out, now = [], time.time()
        with contextlib.suppress(FileNotFoundError), os.scandir(self.staging) as it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    age = now - e.stat(follow_symlinks=False).st_mtime
                    if token_is_stale(e.name, age, stale_after_s):
                        out.append(e.path)
        return out

    def verify_blobs(self) -> list[Problem]:
        """Hashes every cas/ file; reports those that do not match their names or do not
        belong. O(bytes)."""
        problems = []
        for path, _ in self.files(self.cas):
            name = os.path.basename(path)
            if not is_digest(name) or os.path.basename(os.path.dirname(path)) != name[:2]:
                problems.append(Problem("stray", path, "not a blob name"))
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    ok = hash_fd(fd)[0] == name
                finally:
                    os.close(fd)
            except OSError as e:
                problems.append(Problem("unreadable", path, f"cannot read the blob: {e}"))
                continue
            if not ok:
                problems.append(Problem("blob", path, "does not hash to its name"))
        return problems
