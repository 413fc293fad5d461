"""The memory tier: a byte-bounded LRU of entries in this process, in front of the disk tier."""

from __future__ import annotations

import threading
from collections import OrderedDict

from tiled.cache.entry import CacheEvents, Entry, NullEvents
from tiled.errors import CacheWriteError


class MemoryTier:
    """A least-recently-used map of action key -> Entry holding at most `max_bytes` (the sum of
    `Entry.nbytes`). Thread-safe: one lock guards the map; hashing happens outside it.

    `put` validates the entry once, on the way in (its digests, and its manifest against its
    key and blobs: Entry.validate), so nothing broken is ever held and a put of a key replaces
    what was held; `get` trusts process memory and does not check again. Stored and returned
    entries own their blob dicts (blob values are immutable `bytes`), so a caller mutating a
    returned Entry's dict changes nothing here.
    An entry larger than `max_bytes` is not kept (a miss later, not an error); `max_bytes=0`
    keeps nothing. `put` raises CacheWriteError only for an entry that does not validate."""

    name = "memory"
    verifies_entries = True  # put validates: get hands out only entries that passed

    def __init__(self, max_bytes: int, events: CacheEvents | None = None):
        self.max_bytes = max(0, int(max_bytes))
        self.events: CacheEvents = events or NullEvents()
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            self.events.lookup(self.name, "miss")
            return None
        self.events.lookup(self.name, "hit")
        self.events.bytes_read(self.name, entry.nbytes)
        return Entry(entry.key, entry.manifest, dict(entry.blobs))

    def put(self, entry: Entry) -> None:
        stored = Entry(entry.key, bytes(entry.manifest),
                       {d: bytes(b) for d, b in entry.blobs.items()})
        try:
            stored.validate()
        except ValueError as e:
            raise CacheWriteError(f"memory tier refused entry {entry.key[:12]}: {e}") from None
        size = stored.nbytes
        if size > self.max_bytes:
            return
        evicted, evicted_bytes = 0, 0
        with self._lock:
            old = self._entries.pop(stored.key, None)
            if old is not None:
                self._nbytes -= old.nbytes
            self._entries[stored.key] = stored
            self._nbytes += size
            while self._nbytes > self.max_bytes:
                _, victim = self._entries.popitem(last=False)
                self._nbytes -= victim.nbytes
                evicted, evicted_bytes = evicted + 1, evicted_bytes + victim.nbytes
        self.events.bytes_written(self.name, size)
        if evicted:
            self.events.evicted(self.name, evicted, evicted_bytes)

    def contains(self, key: str) -> bool:
        """Whether `key` is held; does not count as a use for the LRU order."""
        with self._lock:
            return key in self._entries

    def delete(self, key: str) -> bool:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old.nbytes
        return old is not None

    def keys(self) -> list[str]:
        """Held keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._nbytes = 0
