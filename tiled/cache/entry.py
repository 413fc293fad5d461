"""What the cache stores: an action key mapped to a manifest that names content-addressed blobs.

Every tier (memory, local disk, Redis) stores and returns `Entry` objects and reports what
happens through a `CacheEvents` hook. Tiers know bytes and digests, never TVM or gRPC.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Protocol

_HEX64 = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    return isinstance(text, str) and _HEX64.fullmatch(text) is not None


@dataclass(frozen=True)
class Entry:
    """One compile result. `key`: the action key (sha256 hex, see tiled.cache.keys).
    `manifest`: the manifest bytes (JSON), stored verbatim. `blobs`: digest -> bytes of every
    blob the manifest names (the artifact; later also sources, TMA recipes). An Entry is valid
    when every blob's sha256 equals its digest; `validate()` raises ValueError otherwise."""

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
    incomplete entry is a miss, reported through events, never an exception). `put` publishes
    an entry atomically or raises CacheWriteError; a concurrent put of the same key is not an
    error (the first complete one wins; both are valid by construction)."""

    name: str

    def get(self, key: str) -> Entry | None: ...
    def put(self, entry: Entry) -> None: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> bool: ...
    def keys(self) -> list[str]: ...
