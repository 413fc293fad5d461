"""The shared remote tier on Redis: what one daemon compiled, every daemon on the fleet reuses.

Key layout (`<ns>` defaults to `tiled:v1`; bump it to disown every entry at once):

    <ns>:cas:<sha256>   the blob's bytes
    <ns>:ac:<key>       the entry record: one JSON line
                        {"manifest": sha256, "blobs": [[sha256, size], ...]}
                        followed by the manifest bytes verbatim

Both kinds of key expire after `ttl_seconds`; a hit refreshes the expiry of the record and of
every blob it names (GETEX, so no extra round trip). A put writes the blobs, then the record,
in one MULTI/EXEC: a record is only ever visible with all its blobs. A blob that later
disappears (Redis eviction under maxmemory) makes the entry a miss and its record is deleted.

Redis is a cache, never a dependency: every call has a short connect/read timeout and no
retries, every Redis exception is counted and logged, `get` then returns None and `put`
returns without raising. After a connection failure a circuit breaker skips Redis for a backoff
(1 s, doubling to 5 s); one call then probes, and success closes the breaker. A dead Redis
therefore costs one timeout per backoff period, not one per request.

Events: lookup("redis", hit | miss | corrupt | error); error("redis", op) where op is the
failed call (get, put, contains, delete, keys), "too_large" (an entry not written because a
blob exceeds `max_blob_bytes`), or "breaker_open" (a call skipped while the breaker is open).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from tiled.cache.entry import CacheEvents, Entry, NullEvents, is_digest, sha256_hex
from tiled.errors import CacheWriteError, ConfigError

log = logging.getLogger(__name__)

_FAILED = object()


class CircuitBreaker:
    """Closed: calls go through. A failure opens it for `backoff` seconds, during which
    `allow()` is False. Once the backoff has passed, a single caller is let through to probe:
    its success closes the breaker and resets the backoff; its failure reopens it with the
    backoff doubled (capped at `max_backoff`). Thread-safe. Every allowed call must end in
    `success()` or `failure()`, or the breaker stays half-open."""

    def __init__(self, backoff: float = 1.0, max_backoff: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.initial_backoff, self.max_backoff, self._clock = backoff, max_backoff, clock
        self._lock = threading.Lock()
        self._backoff = backoff
        self._open_until: float | None = None  # None: closed
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> bool:
        """Records a call that reached Redis; True when this closed an open breaker."""
        with self._lock:
            if self._open_until is None:
                return False
            self._open_until, self._probing, self._backoff = None, False, self.initial_backoff
            return True

    def failure(self) -> bool:
        """Records a call that could not reach Redis; True when this opened a closed breaker."""
        with self._lock:
            now = self._clock()
            was_closed = self._open_until is None
            # Concurrent calls that failed together open the breaker once, not once each.
            if self._open_until is not None and not self._probing and now < self._open_until:
                return False
            self._open_until, self._probing = now + self._backoff, False
            self._backoff = min(self._backoff * 2, self.max_backoff)
            return was_closed


def _redacted(url: str) -> str:
    """The URL without its credentials, for log lines."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _encode_record(entry: Entry) -> bytes:
    head = {"manifest": sha256_hex(entry.manifest),
            "blobs": [[d, len(b)] for d, b in sorted(entry.blobs.items())]}
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + entry.manifest


def _decode_record(record: bytes) -> tuple[bytes, dict[str, int]] | None:
    """(manifest, digest -> size), or None for a record that is damaged in any way."""
    head, sep, manifest = record.partition(b"\n")
    if not sep:
        return None
    try:
        meta = json.loads(head)
        digest, blobs = meta["manifest"], {str(d): int(n) for d, n in meta["blobs"]}
    except (ValueError, KeyError, TypeError):
        return None
    if sha256_hex(manifest) != digest or not all(is_digest(d) for d in blobs):
        return None
    return manifest, blobs


class RedisTier:
    """A Tier on a Redis server (see the module docstring for layout and failure handling).
    Thread-safe (the client holds a connection pool); safe across processes and hosts.
    `get` returns a verified complete Entry or None and never raises; `put` raises
    CacheWriteError only for an entry that does not validate, never for a Redis failure.
    `contains` does not verify blobs. `delete` removes the record; blobs may be shared by
    other entries and are left to expire."""

    name = "redis"
    remote = True  # TieredCache: a failure here never fails a put

    def __init__(self, url: str, ttl_seconds: int = 7 * 24 * 3600,
                 max_blob_bytes: int = 16 << 20, timeout_seconds: float = 0.1,
                 events: CacheEvents | None = None, *, namespace: str = "tiled:v1",
                 backoff_seconds: float = 1.0, max_backoff_seconds: float = 5.0):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError("a Redis cache tier is configured (TILED_REDIS_URL) but the "
                              "'redis' package is missing: pip install 'tiled[server]'") from None
        self.url, self.ttl = url, max(0, int(ttl_seconds))
        self._where = _redacted(url)
        self.max_blob_bytes, self.timeout = int(max_blob_bytes), float(timeout_seconds)
        self.events: CacheEvents = events or NullEvents()
        self.namespace = namespace
        self.breaker = CircuitBreaker(backoff_seconds, max_backoff_seconds)
        try:
            # No retries: the breaker decides when Redis is worth another try.
            self._client = redis.Redis.from_url(
                url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        except ValueError as e:
            raise ConfigError(f"Redis URL {self._where!r} is not valid: {e}") from None
        self._unreachable = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                             OSError)
        self._redis_error = redis.exceptions.RedisError

    def _ac(self, key: str) -> str:
        return f"{self.namespace}:ac:{key}"

    def _cas(self, digest: str) -> str:
        return f"{self.namespace}:cas:{digest}"

    def _run(self, op: str, call: Callable[[], Any]) -> Any:
        """`call()`'s value, or _FAILED when Redis was skipped or failed (counted, logged)."""
        if not self.breaker.allow():
            self.events.error(self.name, "breaker_open")
            return _FAILED
        try:
            value = call()
        except self._unreachable as e:
            self.events.error(self.name, op)
            if self.breaker.failure():
                log.warning("redis cache %s unreachable (%s: %s); skipping it for %.1f s",
                            self._where, type(e).__name__, e, self.breaker.initial_backoff)
            else:
                log.debug("redis cache %s: %s failed: %s", self._where, op, e)
            return _FAILED
        except self._redis_error as e:  # Redis answered with an error: reachable, still a miss
            self.events.error(self.name, op)
            self._closed()
            log.warning("redis cache %s: %s failed: %s", self._where, op, e)
            return _FAILED
        except BaseException:
            self.breaker.failure()  # a bug must not leave a probe pending and Redis off for good
            raise
        self._closed()
        return value

    def _closed(self) -> None:
        if self.breaker.success():
            log.warning("redis cache %s reachable again", self._where)

    def get(self, key: str) -> Entry | None:
        found = self._run("get", lambda: self._fetch(key))
        if found is _FAILED:
            self.events.lookup(self.name, "error")
            return None
        result, entry = found
        self.events.lookup(self.name, result)
        if entry is not None:
            self.events.bytes_read(self.name, entry.nbytes)
        return entry

    def _read(self, target: Any, name: str) -> Any:
        return target.getex(name, ex=self.ttl) if self.ttl else target.get(name)

    def _fetch(self, key: str) -> tuple[str, Entry | None]:
        ac = self._ac(key)
        record = self._read(self._client, ac)
        if record is None:
            return "miss", None
        decoded = _decode_record(record)
        if decoded is None:
            log.warning("redis cache: damaged entry record %s deleted", key[:12])
            self._client.delete(ac)
            return "corrupt", None
        manifest, sizes = decoded
        pipe = self._client.pipeline(transaction=False)
        for digest in sizes:
            self._read(pipe, self._cas(digest))
        values = dict(zip(sizes, pipe.execute(), strict=True))
        if any(v is None for v in values.values()):
            # A blob was evicted: the record can never be served again.
            self._client.delete(ac)
            return "miss", None
        bad = [d for d, v in values.items() if len(v) != sizes[d] or sha256_hex(v) != d]
        if bad:
            log.warning("redis cache: entry %s has %d blob(s) that do not hash to their "
                        "names (%s); deleted", key[:12], len(bad), bad[0][:12])
            self._client.delete(ac, *(self._cas(d) for d in bad))
            return "corrupt", None
        return "hit", Entry(key, manifest, values)

    def put(self, entry: Entry) -> None:
        try:
            entry.validate()
        except ValueError as e:
            raise CacheWriteError(f"redis tier refused entry {entry.key[:12]}: {e}") from None
        record = _encode_record(entry)
        largest = max([len(record), *(len(b) for b in entry.blobs.values())])
        if largest > self.max_blob_bytes:
            self.events.error(self.name, "too_large")
            log.debug("redis cache: entry %s not written, a %d-byte value exceeds the %d-byte "
                      "limit", entry.key[:12], largest, self.max_blob_bytes)
            return
        ex = self.ttl or None

        def store() -> None:
            pipe = self._client.pipeline(transaction=True)
            for digest, data in entry.blobs.items():
                pipe.set(self._cas(digest), data, ex=ex)
            pipe.set(self._ac(entry.key), record, ex=ex)  # last: visible only when complete
            pipe.execute()

        if self._run("put", store) is not _FAILED:
            self.events.bytes_written(self.name, len(record) + entry.nbytes - len(entry.manifest))

    def contains(self, key: str) -> bool:
        found = self._run("contains", lambda: self._client.exists(self._ac(key)))
        return found is not _FAILED and bool(found)

    def delete(self, key: str) -> bool:
        found = self._run("delete", lambda: self._client.delete(self._ac(key)))
        return found is not _FAILED and bool(found)

    def keys(self) -> list[str]:
        """Every action key in the namespace (SCAN, so it does not block Redis); [] when
        Redis is unreachable."""
        prefix = self._ac("")

        def scan() -> list[str]:
            return [k.decode()[len(prefix):]
                    for k in self._client.scan_iter(match=prefix + "*", count=1000)]

        found = self._run("keys", scan)
        return [] if found is _FAILED else found

    def close(self) -> None:
        self._client.close()
