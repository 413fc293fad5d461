"""The persistent content-addressed kernel cache (see ARCHITECTURE.md, Cache). Knows bytes,
digests and manifests; never imports TVM or gRPC. Tiers: MemoryTier, DiskTier (tiled.cache.disk,
the embedded default), RedisTier (tiled.cache.redis_tier, needs the `redis` package), stacked by
TieredCache; bundles in tiled.cache.bundle; action keys in tiled.cache.keys."""

from tiled.cache.entry import CacheEvents, CountingEvents, Entry, NullEvents, Tier, sha256_hex

__all__ = ["CacheEvents", "CountingEvents", "Entry", "NullEvents", "Tier", "sha256_hex"]
