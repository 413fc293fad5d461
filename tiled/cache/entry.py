"""What the cache stores: an action key mapped to a manifest that names content-addressed blobs.

Every tier (memory, local disk, Redis) stores and returns `Entry` objects and reports what
happens through a `CacheEvents` hook. Tiers know bytes, digests and manifests (parsed on use by
the TVM-free tiled.runtime.manifest), never TVM, gRPC or the compiler.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tiled.runtime.manifest import Manifest

_HEX64 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20  # bytes per read when a blob is streamed (hashed or copied) from a file


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    return isinstance(text, str) and _HEX64.fullmatch(text) is not None


def load_manifest(data: bytes) -> Manifest:
    """The launch manifest (tiled.runtime.manifest) that `data` holds. Raises ValueError saying
    why not, and never another exception: a cache entry or a bundle member is untrusted input
    (JSON nested too deeply, a list where a name belongs)."""
    from tiled.runtime.manifest import Manifest

    try:
        return Manifest.from_json(data)
    except RecursionError:
        raise ValueError("manifest is not valid JSON: nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise ValueError(str(e) if str(e).startswith("manifest") else f"manifest: {e}") from None


def check_manifest(key: str, manifest: bytes, blobs: Collection[str]) -> Manifest:
    """The Manifest of an entry filed under `key` that holds `blobs` (digests), when the entry
    can be served: the manifest parses, every blob it names is held, and its action record, if
    it carries one, is a record of this key format whose digest is `key` and whose target is
    the manifest's. Raises ValueError naming the problem. A manifest without an action record
    (built by hand, or by a tiled before the manifest carried one) passes: nothing to check."""
    from tiled.cache.keys import KEY_VERSION, key_of_record, target_record

    m = load_manifest(manifest)
    if m.artifact_sha256 not in blobs:
        raise ValueError(f"manifest names blob {m.artifact_sha256[:12]}, which the entry lacks")
    if m.action is not None:
        if m.action.get("v") != KEY_VERSION:
            raise ValueError(f"action record version {m.action.get('v')!r} is not {KEY_VERSION}")
        try:
            hashed = key_of_record(m.action)
            target = target_record({"backend": m.backend, "arch": m.arch})
        except ValueError as e:
            raise ValueError(f"action record unusable: {e}") from None
        if hashed != key:
            raise ValueError(f"action record hashes to {hashed[:12]}, not to the key it is "
                             f"filed under ({key[:12]})")
        if m.action["target"] != target:
            raise ValueError(f"action record names target {m.action['target']!r}, the manifest "
                             f"{m.target!r}")
    return m


@dataclass(frozen=True)
class BlobFile:
    """`size` bytes at `offset` in the file at `path`: a blob to be streamed (a bundle member)
    rather than held in memory. Reading never returns more or fewer than `size` bytes: a file
    that ends early raises ValueError."""

    path: Path
    offset: int
    size: int

    def chunks(self) -> Iterator[bytes]:
        """The bytes in pieces of at most CHUNK. Raises OSError, or ValueError when short."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.size
            while left:
                data = f.read(min(CHUNK, left))
                if not data:
                    raise ValueError(f"{self.path}: expected {self.size} bytes at offset "
                                     f"{self.offset}, the file ends {left} bytes short")
                left -= len(data)
                yield data

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def sha256(self) -> str:
        h = hashlib.sha256()
        for data in self.chunks():
            h.update(data)
        return h.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One compile result. `key`: the action key (sha256 hex, see tiled.cache.keys).
    `manifest`: the manifest bytes (JSON), stored verbatim. `blobs`: digest -> bytes of every
    blob the manifest names (the artifact; later also sources, TMA recipes); a blob it does not
    name is kept but never served. An Entry is valid when every blob's sha256 equals its digest
    and its manifest passes check_manifest for its key and blobs; `validate()` raises
    ValueError naming the first problem otherwise."""

    key: str
    manifest: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)

    def validate(self) -> None:
        if not is_digest(self.key):
            raise ValueError(f"action key {self.key!r} is not a sha256 hex digest")
        for digest, data in self.blobs.items():
            if not is_digest(digest):
                raise ValueError(f"blob name {digest!r} is not a sha256 hex digest")
            if sha256_hex(data) != digest:
                raise ValueError(f"blob {digest[:12]} does not hash to its name")
        check_manifest(self.key, self.manifest, self.blobs)

    @property
    def nbytes(self) -> int:
        return len(self.manifest) + sum(len(b) for b in self.blobs.values())


class CacheEvents(Protocol):
    """Metrics hooks; the server exports them to Prometheus. Implementations must be cheap and
    thread-safe and must not raise. `tier` is "memory", "disk" or "redis"."""

    def lookup(self, tier: str, result: str) -> None: ...  # result: hit | miss | corrupt | error
    def bytes_written(self, tier: str, n: int) -> None: ...
    def bytes_read(self, tier: str, n: int) -> None: ...
    def evicted(self, tier: str, entries: int, nbytes: int) -> None: ...
    def error(self, tier: str, op: str) -> None: ...  # a failed read / write / delete


class NullEvents:
    def lookup(self, tier: str, result: str) -> None: pass
    def bytes_written(self, tier: str, n: int) -> None: pass
    def bytes_read(self, tier: str, n: int) -> None: pass
    def evicted(self, tier: str, entries: int, nbytes: int) -> None: pass
    def error(self, tier: str, op: str) -> None: pass


class CountingEvents:
    """CacheEvents that count into a dict, for tests and `tiled cache stats`."""

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self.counts: dict[tuple, int] = {}

    def _add(self, key: tuple, n: int = 1) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def lookup(self, tier, result): self._add(("lookup", tier, result))
    def bytes_written(self, tier, n): self._add(("bytes_written", tier), n)
    def bytes_read(self, tier, n): self._add(("bytes_read", tier), n)
    def evicted(self, tier, entries, nbytes):
        self._add(("evicted", tier), entries)
        self._add(("evicted_bytes", tier), nbytes)
    def error(self, tier, op): self._add(("error", tier, op))

    def get(self, *key) -> int:
        return self.counts.get(tuple(key), 0)


class Tier(Protocol):
    """A cache tier. Thread-safe; safe across processes for tiers that persist.
    `get` returns an Entry whose blobs were all present and verified, or None (a corrupt or
    incomplete entry is a miss, reported through events, never an exception). `put` validates
    the entry (Entry.validate) and publishes it atomically, or raises CacheWriteError; a
    concurrent put of the same key is not an error (the first complete one wins; both are
    valid by construction), and a put over a broken entry replaces it. A tier whose `get` also
    checks the manifest (check_manifest) sets `verifies_entries = True`; TieredCache checks
    what the others return."""

    name: str

    def get(self, key: str) -> Entry | None: ...
    def put(self, entry: Entry) -> None: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> bool: ...
    def keys(self) -> list[str]: ...
