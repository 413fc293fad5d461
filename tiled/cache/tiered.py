"""Tiers stacked fastest first: memory -> local disk -> Redis (see ARCHITECTURE.md, Cache)."""

from __future__ import annotations

import logging

from tiled import config
from tiled.cache.entry import CacheEvents, Entry, NullEvents, Tier, check_manifest
from tiled.errors import CacheError, CacheWriteError

log = logging.getLogger(__name__)


def _is_remote(tier: Tier) -> bool:
    return bool(getattr(tier, "remote", False))


class TieredCache:
    """A Tier made of `tiers`, fastest first. Thread-safe when the tiers are.

    Read-through: `get` asks each tier in order and returns the first hit; an entry found in a
    lower tier is written back into every faster tier above it (a write-back failure is
    logged and counted as error(tier, "writeback"), never raised). A miss everywhere is None.
    A hit from a tier that does not check manifests itself (no `verifies_entries`, e.g. Redis,
    written by other hosts) is checked here (check_manifest: it parses, names only blobs it
    holds, its action record hashes to the key); one that fails is counted as
    lookup(tier, "corrupt"), deleted from that tier, and the next tier is asked: a broken entry
    is never returned nor promoted.

    Write-back to all: `put` stores the entry in every tier. A remote tier (one with
    `remote = True`, e.g. Redis) never fails a put: its failures are logged and counted. A
    local tier that fails is counted as error(tier, "put") and the remaining tiers still get
    the entry; `put` then raises CacheWriteError naming the failed local tiers, so the caller
    logs a skip."""

    name = "tiered"

    def __init__(self, tiers: list[Tier], events: CacheEvents | None = None):
        self.tiers: list[Tier] = list(tiers)
        self.events: CacheEvents = events or NullEvents()

    def get(self, key: str) -> Entry | None:
        for i, tier in enumerate(self.tiers):
            try:
                entry = tier.get(key)
            except OSError as e:  # a tier broke its never-raises contract: still only a miss
                self.events.lookup(tier.name, "error")
                log.warning("cache tier %s: get %s failed: %s", tier.name, key[:12], e)
                continue
            if entry is not None and not getattr(tier, "verifies_entries", False):
                try:
                    check_manifest(key, entry.manifest, entry.blobs)
                except ValueError as e:
                    self._drop_broken(tier, key, str(e))
                    continue
            if entry is not None:
                for faster in self.tiers[:i]:
                    self._store(faster, entry, "writeback")
                return entry
        return None

    def _drop_broken(self, tier: Tier, key: str, problem: str) -> None:
        self.events.lookup(tier.name, "corrupt")
        log.warning("cache tier %s: entry %s is unusable (%s); deleting it", tier.name,
                    key[:12], problem)
        try:
            tier.delete(key)
        except OSError as e:  # CacheError included
            self.events.error(tier.name, "delete")
            log.warning("cache tier %s: delete %s failed: %s", tier.name, key[:12], e)

    def _store(self, tier: Tier, entry: Entry, op: str) -> bool:
        try:
            tier.put(entry)
        except (CacheError, OSError) as e:
            self.events.error(tier.name, op)
            log.warning("cache tier %s: %s of %s failed: %s", tier.name, op, entry.key[:12], e)
            return False
        return True

    def put(self, entry: Entry) -> None:
        failed = [tier.name for tier in self.tiers
                  if not self._store(tier, entry, "put") and not _is_remote(tier)]
        if failed:
            raise CacheWriteError(f"entry {entry.key[:12]} not stored in the "
                                  f"{', '.join(failed)} tier(s); see the log")

    def get_blob(self, digest: str) -> bytes | None:
        """A blob by its sha256 from the first tier that can look blobs up (the disk tier
        keeps them by digest), or None."""
        for tier in self.tiers:
            get_blob = getattr(tier, "get_blob", None)
            data = get_blob(digest) if get_blob is not None else None
            if data is not None:
                return data
        return None

    def contains(self, key: str) -> bool:
        return any(tier.contains(key) for tier in self.tiers)

    def delete(self, key: str) -> bool:
        deleted = [tier.delete(key) for tier in self.tiers]  # every tier, no short circuit
        return any(deleted)

    def keys(self) -> list[str]:
        """The union of every tier's keys, each once, fastest tier's first."""
        seen: dict[str, None] = {}
        for tier in self.tiers:
            seen.update(dict.fromkeys(tier.keys()))
        return list(seen)

    def close(self) -> None:
        for tier in self.tiers:
            close = getattr(tier, "close", None)
            if close is not None:
                close()


def open_default_cache(events: CacheEvents | None = None) -> TieredCache:
    """The configured stack: memory (unless TILED_MEMORY_CACHE_BYTES=0) -> disk at
    TILED_CACHE_DIR capped at TILED_CACHE_MAX_BYTES -> Redis (only when TILED_REDIS_URL is
    set). Opening never contacts Redis; an unreachable Redis only shows as counted errors.
    Raises ConfigError for a bad setting or a Redis URL without the `redis` package."""
    from tiled.cache.disk import DiskTier  # on use: importing this module stays cheap
    from tiled.cache.memory import MemoryTier

    events = events or NullEvents()
    tiers: list[Tier] = []
    if config.get("memory_cache_bytes") > 0:
        tiers.append(MemoryTier(config.get("memory_cache_bytes"), events))
    tiers.append(DiskTier(config.get("cache_dir"), max_bytes=config.get("cache_max_bytes"),
                          events=events))
    url = config.get("redis_url")
    if url:
        from tiled.cache.redis_tier import RedisTier

        tiers.append(RedisTier(url, ttl_seconds=config.get("redis_ttl_seconds"),
                               max_blob_bytes=config.get("redis_max_blob_bytes"),
                               timeout_seconds=config.get("redis_timeout_seconds"),
                               events=events))
    return TieredCache(tiers, events)


_DEFAULT: dict[tuple, TieredCache] = {}


def default_cache() -> TieredCache:
    """This process's cache stack for the current settings (memory -> disk -> Redis), opened
    once per distinct configuration (tests change TILED_CACHE_DIR per test): the compile
    glue's and tiled.autotune's. Raises what open_default_cache raises."""
    key = tuple(config.get(k) for k in ("cache_dir", "cache_max_bytes", "memory_cache_bytes",
                                        "redis_url"))
    if key not in _DEFAULT:
        _DEFAULT[key] = open_default_cache()
    return _DEFAULT[key]
