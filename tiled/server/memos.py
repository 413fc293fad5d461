"""The Compiler service's per-request memos, each bounded: what a repeat request can skip.

- `KeyMemo`: requests already verified and keyed (digest of program bytes, target text,
  options text, namespace -> action key and target), so a cache hit costs a hash, not a verify.
- `ResponseMemo`: serialized hit responses by the digest of the request's bytes, so an exact
  repeat costs a hash and a cache lookup, not a decode.
- `ArtifactIndex`: artifact sha256 -> the action key naming it, for GetArtifact.

The first two are bounded in bytes (KEY_MEMO_BYTES, RESPONSE_MEMO_BYTES: each entry counts its
payload plus MEMO_ENTRY_OVERHEAD), the index in entries; each evicts the least recently used.
Every memo is keyed by digests, never by the text a client sent. Thread-safe: each has its own
lock. The bounds are read at each insertion (tests lower them with monkeypatch).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

KEY_MEMO_BYTES = 32 << 20  # requests remembered as verified and keyed (~700 bytes each)
RESPONSE_MEMO_BYTES = 64 << 20  # serialized hit responses remembered by request bytes
MEMO_ENTRY_OVERHEAD = 512  # dict slot, tuple, digest and key objects of one memo entry
ARTIFACT_INDEX_ENTRIES = 100_000  # artifact digests -> action key, for GetArtifact (~300 B)


def request_digest(program_bytes: bytes, *texts: str) -> bytes:
    """sha256 of a program's bytes and `texts`, each length-prefixed (so unambiguous)."""
    h = hashlib.sha256(program_bytes)
    for text in texts:
        data = text.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.digest()


class _ByteBoundedLRU(Mapping):
    """digest -> payload tuple, least recently used evicted past `limit()` bytes. As a Mapping
    it is a read-only view (no recency update): for tests and tooling."""

    def __init__(self):
        # digest -> (payload, the bytes it accounts for)
        self._entries: collections.OrderedDict[bytes, tuple[tuple, int]] = \
            collections.OrderedDict()
        self.nbytes = 0  # what the entries held now account for
        self._lock = threading.Lock()

    def limit(self) -> int:
        raise NotImplementedError

    def lookup(self, digest: bytes) -> tuple | None:
        """The payload remembered for `digest` (now the most recently used), or None."""
        with self._lock:
            known = self._entries.get(digest)
            if known is None:
                return None
            self._entries.move_to_end(digest)
            return known[0]

    def _remember(self, digest: bytes, payload: tuple, size: int) -> None:
        with self._lock:
            if digest not in self._entries:
                self._entries[digest] = (payload, size)
                self.nbytes += size
            while self.nbytes > self.limit():
                self.nbytes -= self._entries.popitem(last=False)[1][1]

    def forget(self, digest: bytes) -> None:
        with self._lock:
            known = self._entries.pop(digest, None)
            if known is not None:
                self.nbytes -= known[1]

    def __getitem__(self, digest: bytes) -> tuple:
        with self._lock:
            return self._entries[digest][0]

    def __iter__(self) -> Iterator[bytes]:
        with self._lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


class KeyMemo(_ByteBoundedLRU):
    """Admitted requests: request_digest(...) -> (ActionKey, Target). A verified program stays
    verified, and this process's toolchain digest does not change while it runs."""

    def limit(self) -> int:
        return KEY_MEMO_BYTES

    def remember(self, digest: bytes, key: Any, target: Any, text_bytes: int) -> None:
        """`text_bytes`: the length of the request text the entry stands for (options and
        namespace), counted though not kept."""
        self._remember(digest, (key, target), MEMO_ENTRY_OVERHEAD + text_bytes)


class ResponseMemo(_ByteBoundedLRU):
    """Hit responses: sha256 of a Compile request's bytes -> (action key, Target, the bytes of
    its hit response). A response past 1/16 of the bound is not remembered."""

    def limit(self) -> int:
        return RESPONSE_MEMO_BYTES

    def admits(self, body: bytes) -> bool:
        return len(body) <= RESPONSE_MEMO_BYTES // 16

    def remember(self, digest: bytes, key: str, target: Any, body: bytes) -> None:
        if self.admits(body):
            self._remember(digest, (key, target, body), len(body) + MEMO_ENTRY_OVERHEAD)


class ArtifactIndex(Mapping):
    """artifact sha256 -> the action key that names it, most recent last, at most
    ARTIFACT_INDEX_ENTRIES. GetArtifact reads an artifact through its entry; one no longer
    here is read by digest instead (cache.get_blob)."""

    def __init__(self):
        self._keys: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    def note(self, sha256: str, key: str) -> None:
        with self._lock:
            self._keys[sha256] = key
            self._keys.move_to_end(sha256)
            if len(self._keys) > ARTIFACT_INDEX_ENTRIES:
                self._keys.popitem(last=False)

    def __getitem__(self, sha256: str) -> str:
        with self._lock:
            return self._keys[sha256]

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)
