"""The persistent content-addressed kernel cache (see ARCHITECTURE.md, Cache). Knows bytes,
digests and manifests; never imports TVM or gRPC."""

from tiled.cache.entry import CacheEvents, CountingEvents, Entry, NullEvents, Tier, sha256_hex

__all__ = ["CacheEvents", "CountingEvents", "Entry", "NullEvents", "Tier", "sha256_hex"]
