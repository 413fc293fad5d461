"""TieredCache: read-through fills the faster tiers, puts reach every tier, and a dead remote
tier never costs more than counted errors."""

import sys
import time
import types

import pytest

from tests.cache.conftest import make_entry
from tests.cache.fakes import DictTier
from tiled import config
from tiled.cache.entry import CountingEvents, Entry
from tiled.cache.memory import MemoryTier
from tiled.cache.tiered import TieredCache, open_default_cache
from tiled.errors import CacheWriteError


def redis_tier(server, events):
    from tiled.cache.redis_tier import RedisTier

    return RedisTier(server.url, timeout_seconds=0.1, events=events, backoff_seconds=0.2,
                     max_backoff_seconds=0.4)


def test_read_through_fills_the_faster_tier():
    events = CountingEvents()
    memory, disk = MemoryTier(1 << 20, events), DictTier("disk")
    cache = TieredCache([memory, disk], events)
    e = make_entry(1)
    disk.put(e)
    assert cache.get(e.key) == e
    assert memory.contains(e.key)
    assert cache.get(e.key) == e
    assert disk.gets == 1  # the second get was served from memory
    assert events.get("lookup", "memory", "hit") == 1
    assert events.get("lookup", "memory", "miss") == 1
    assert cache.get(make_entry(2).key) is None


def test_put_writes_every_tier(redis_server):
    events = CountingEvents()
    memory, disk = MemoryTier(1 << 20, events), DictTier("disk")
    redis = redis_tier(redis_server, events)
    cache = TieredCache([memory, disk, redis], events)
    e = make_entry(1, blobs=2)
    cache.put(e)
    assert memory.get(e.key) == e and disk.get(e.key) == e and redis.get(e.key) == e
    assert cache.contains(e.key) and cache.keys() == [e.key]
    assert cache.delete(e.key)
    assert not any(t.contains(e.key) for t in (memory, disk, redis))


def test_a_hit_in_redis_only_fills_the_local_tiers(redis_server):
    events = CountingEvents()
    memory, disk = MemoryTier(1 << 20, events), DictTier("disk")
    redis = redis_tier(redis_server, events)
    cache = TieredCache([memory, disk, redis], events)
    e = make_entry(1)
    redis.put(e)  # as if another daemon compiled it
    assert cache.get(e.key) == e
    assert memory.get(e.key) == e and disk.entries[e.key] == e
    assert events.get("lookup", "redis", "hit") == 1
    assert cache.get(e.key) == e
    assert events.get("lookup", "redis", "hit") == 1  # served locally from now on


def test_redis_down_costs_counted_errors_only(redis_server):
    events = CountingEvents()
    memory, disk = MemoryTier(1 << 20, events), DictTier("disk")
    redis = redis_tier(redis_server, events)
    cache = TieredCache([memory, disk, redis], events)
    redis_server.stop()
    entries = [make_entry(i) for i in range(20)]
    start = time.monotonic()
    for e in entries:
        cache.put(e)  # does not raise: Redis is remote
        assert cache.get(e.key) == e
        assert cache.get(make_entry(1000).key) is None  # a miss falls through to dead Redis
    assert time.monotonic() - start < 1.0
    assert all(disk.contains(e.key) for e in entries)
    assert events.get("lookup", "redis", "error") == 20
    assert events.get("error", "redis", "put") + events.get("error", "redis", "get") >= 1
    assert events.get("error", "redis", "breaker_open") >= 1


def test_a_failed_local_put_still_reaches_the_other_tiers_then_raises():
    memory, disk, other = MemoryTier(1 << 20), DictTier("disk", fail_puts=True), DictTier("other")
    events = CountingEvents()
    cache = TieredCache([memory, disk, other], events)
    e = make_entry(1)
    with pytest.raises(CacheWriteError, match="disk"):
        cache.put(e)
    assert memory.contains(e.key) and other.contains(e.key)
    assert events.get("error", "disk", "put") == 1


def test_a_failed_remote_put_is_not_raised():
    remote = DictTier("remote", fail_puts=True)
    remote.remote = True
    events = CountingEvents()
    cache = TieredCache([MemoryTier(1 << 20), remote], events)
    cache.put(make_entry(1))
    assert events.get("error", "remote", "put") == 1


def test_a_failed_write_back_is_counted_not_raised():
    events = CountingEvents()
    broken, disk = DictTier("memory", fail_puts=True), DictTier("disk")
    e = make_entry(1)
    disk.put(e)
    assert TieredCache([broken, disk], events).get(e.key) == e
    assert events.get("error", "memory", "writeback") == 1


class FakeDiskTier(DictTier):
    def __init__(self, root, max_bytes, events):
        super().__init__("disk")
        self.root, self.max_bytes, self.events = root, max_bytes, events


def test_open_default_cache_builds_the_configured_stack(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiled.cache.disk",
                        types.SimpleNamespace(DiskTier=FakeDiskTier))
    events = CountingEvents()
    with config.override(cache_dir=tmp_path, cache_max_bytes=1 << 30, memory_cache_bytes=1000,
                         redis_url=""):
        cache = open_default_cache(events)
    assert [t.name for t in cache.tiers] == ["memory", "disk"]
    memory, disk = cache.tiers
    assert memory.max_bytes == 1000 and memory.events is events
    assert (disk.root, disk.max_bytes, disk.events) == (tmp_path, 1 << 30, events)


def test_open_default_cache_adds_redis_when_a_url_is_set(tmp_path, monkeypatch):
    pytest.importorskip("redis")
    monkeypatch.setitem(sys.modules, "tiled.cache.disk",
                        types.SimpleNamespace(DiskTier=FakeDiskTier))
    url = "redis://127.0.0.1:1/0"  # nothing listens there: opening does not connect
    with config.override(cache_dir=tmp_path, memory_cache_bytes=0, redis_url=url,
                         redis_ttl_seconds=60, redis_max_blob_bytes=5000,
                         redis_timeout_seconds=0.25):
        cache = open_default_cache()
    assert [t.name for t in cache.tiers] == ["disk", "redis"]
    redis = cache.tiers[1]
    assert (redis.url, redis.ttl, redis.max_blob_bytes, redis.timeout) == (url, 60, 5000, 0.25)
    cache.close()


def test_open_default_cache_with_the_real_disk_tier(tmp_path):
    pytest.importorskip("tiled.cache.disk")
    with config.override(cache_dir=tmp_path, redis_url=""):
        cache = open_default_cache(CountingEvents())
    assert [t.name for t in cache.tiers] == ["memory", "disk"]
    e = make_entry(1)
    cache.put(e)
    with config.override(cache_dir=tmp_path, redis_url="", memory_cache_bytes=0):
        assert open_default_cache().get(e.key) == e  # it reached the disk


def _broken(e):
    """e's manifest with none of the blobs it names: what a foreign writer could leave."""
    return Entry(e.key, e.manifest, {})


def test_a_broken_entry_in_a_tier_that_does_not_check_is_never_returned_nor_promoted():
    events = CountingEvents()
    memory, remote, good = MemoryTier(1 << 20, events), DictTier("remote"), DictTier("disk")
    cache = TieredCache([memory, remote, good], events)
    e = make_entry(1)
    remote.entries[e.key] = _broken(e)  # bypasses put, which would refuse it
    good.put(e)
    assert cache.get(e.key) == e  # the next tier answered
    assert events.get("lookup", "remote", "corrupt") == 1
    assert remote.entries[e.key] == e and memory.get(e.key) == e  # deleted, then written back
    alone = TieredCache([MemoryTier(1 << 20), remote], events)
    remote.entries[e.key] = _broken(e)
    assert alone.get(e.key) is None and not alone.tiers[0].contains(e.key)
    alone.put(e)  # the key recovers with the next put
    assert alone.get(e.key) == e


def test_an_action_record_of_another_key_is_a_miss():
    remote = DictTier("remote")
    e, other = make_entry(1), make_entry(2)
    remote.entries[e.key] = Entry(e.key, other.manifest, other.blobs)
    assert TieredCache([MemoryTier(1 << 20), remote]).get(e.key) is None
