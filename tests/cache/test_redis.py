"""The Redis tier against a real redis-server: layout, expiry, size limit, verification, and a
Redis that dies, freezes and comes back without the tier ever raising or waiting long."""

import os
import time

import pytest

from tests.cache.conftest import make_entry
from tiled.cache.entry import CountingEvents
from tiled.cache.redis_tier import CircuitBreaker, RedisTier
from tiled.errors import ConfigError

if not os.environ.get("CI"):  # under CI a missing client fails (redis_server fixture, imports)
    pytest.importorskip("redis")

QUICK = 0.5  # seconds: "well under 1 s" for any call against a dead or frozen Redis


def make_tier(server, events=None, **kw):
    kw = {"ttl_seconds": 3600, "max_blob_bytes": 1 << 20, "timeout_seconds": 0.1,
          "backoff_seconds": 0.2, "max_backoff_seconds": 0.4, **kw}
    return RedisTier(server.url, events=events or CountingEvents(), **kw)


def test_round_trip_with_the_documented_key_layout(redis_server):
    tier = make_tier(redis_server)
    e = make_entry(1, blobs=2)
    assert tier.get(e.key) is None
    tier.put(e)
    assert tier.get(e.key) == e
    with redis_server.client() as c:
        assert {k.decode() for k in c.keys("*")} == (
            {f"tiled:v1:ac:{e.key}"} | {f"tiled:v1:cas:{d}" for d in e.blobs})
        for digest, data in e.blobs.items():
            assert c.get(f"tiled:v1:cas:{digest}") == data
    assert tier.contains(e.key) and tier.keys() == [e.key]
    assert tier.delete(e.key) and not tier.contains(e.key) and tier.get(e.key) is None
    assert tier.events.get("lookup", "redis", "hit") == 1
    assert tier.events.get("lookup", "redis", "miss") == 2
    assert tier.events.get("bytes_read", "redis") == e.nbytes


def test_a_namespace_separates_entries(redis_server):
    e = make_entry(1)
    make_tier(redis_server).put(e)
    other = make_tier(redis_server, namespace="tiled:v2")
    assert other.get(e.key) is None and other.keys() == []


def test_ttl_is_applied_to_every_key_and_refreshed_on_a_hit(redis_server):
    tier = make_tier(redis_server, ttl_seconds=1000)
    e = make_entry(1, blobs=2)
    tier.put(e)
    with redis_server.client() as c:
        names = c.keys("tiled:v1:*")
        assert len(names) == 3 and all(990 < c.ttl(n) <= 1000 for n in names)
        for n in names:
            c.expire(n, 10)
        assert tier.get(e.key) == e
        assert all(990 < c.ttl(n) <= 1000 for n in names)
    forever = make_tier(redis_server, ttl_seconds=0)
    f = make_entry(2)
    forever.put(f)
    assert forever.get(f.key) == f
    with redis_server.client() as c:
        assert c.ttl(f"tiled:v1:ac:{f.key}") == -1  # no expiry


def test_an_entry_with_a_blob_over_the_limit_is_not_published(redis_server):
    tier = make_tier(redis_server, max_blob_bytes=1000)
    small_blobs = make_entry(1, size=100)
    big = make_entry(2, size=2000)
    mixed = make_entry(3, size=10)
    mixed.blobs.update(big.blobs)  # one small blob, one too large
    tier.put(big)
    tier.put(mixed)
    tier.put(small_blobs)
    assert tier.events.get("error", "redis", "too_large") == 2
    with redis_server.client() as c:  # not even the small blob of `mixed` was written
        assert {k.decode() for k in c.keys("*")} == (
            {f"tiled:v1:ac:{small_blobs.key}"} | {f"tiled:v1:cas:{d}" for d in small_blobs.blobs})
    assert tier.get(big.key) is None and tier.get(mixed.key) is None
    assert tier.get(small_blobs.key) == small_blobs


def test_a_corrupted_blob_is_a_counted_miss_and_its_keys_are_deleted(redis_server):
    tier = make_tier(redis_server)
    e = make_entry(1, blobs=2)
    tier.put(e)
    bad, good = sorted(e.blobs)
    with redis_server.client() as c:
        c.set(f"tiled:v1:cas:{bad}", b"x" * len(e.blobs[bad]))  # same size, wrong bytes
        assert tier.get(e.key) is None
        assert tier.events.get("lookup", "redis", "corrupt") == 1
        assert not c.exists(f"tiled:v1:ac:{e.key}", f"tiled:v1:cas:{bad}")
        assert c.exists(f"tiled:v1:cas:{good}")  # sound blobs may serve other entries
    tier.put(e)  # a later put repairs it
    assert tier.get(e.key) == e


def test_a_damaged_record_is_corrupt_and_a_missing_blob_a_miss(redis_server):
    tier = make_tier(redis_server)
    e, f = make_entry(1), make_entry(2)
    tier.put(e)
    tier.put(f)
    with redis_server.client() as c:
        record = c.get(f"tiled:v1:ac:{e.key}")
        c.set(f"tiled:v1:ac:{e.key}", record[:-1] + b"!")  # the manifest no longer hashes
        assert tier.get(e.key) is None
        assert tier.events.get("lookup", "redis", "corrupt") == 1
        assert not c.exists(f"tiled:v1:ac:{e.key}")
        c.delete(*(f"tiled:v1:cas:{d}" for d in f.blobs))  # as if Redis evicted it
        assert tier.get(f.key) is None
        assert tier.events.get("lookup", "redis", "miss") == 1
        assert not c.exists(f"tiled:v1:ac:{f.key}")


def _timed(call):
    start = time.monotonic()
    value = call()
    return value, time.monotonic() - start


def test_redis_stopped_mid_run_costs_nothing_and_recovers(redis_server):
    tier = make_tier(redis_server)
    e = make_entry(1)
    tier.put(e)
    assert tier.get(e.key) == e
    redis_server.stop()
    for i in range(30):
        got, took = _timed(lambda: tier.get(e.key))
        assert got is None and took < QUICK
        _, took = _timed(lambda i=i: tier.put(make_entry(100 + i)))
        assert took < QUICK
    assert not tier.contains(e.key) and not tier.delete(e.key) and tier.keys() == []
    ev = tier.events
    assert ev.get("lookup", "redis", "error") == 30 and ev.get("lookup", "redis", "hit") == 1
    assert ev.get("error", "redis", "get") + ev.get("error", "redis", "put") >= 1
    assert ev.get("error", "redis", "breaker_open") >= 1  # most calls never touched Redis
    assert tier.breaker.is_open

    redis_server.start()  # empty: no persistence
    deadline = time.monotonic() + 5
    while tier.breaker.is_open and time.monotonic() < deadline:
        tier.put(e)
        time.sleep(0.05)
    assert not tier.breaker.is_open
    tier.put(e)
    assert tier.get(e.key) == e


def test_a_frozen_redis_times_out_quickly_and_recovers(redis_server):
    tier = make_tier(redis_server)
    e = make_entry(1)
    tier.put(e)
    redis_server.pause()
    try:
        for _ in range(10):
            got, took = _timed(lambda: tier.get(e.key))
            assert got is None and took < QUICK
        assert tier.events.get("error", "redis", "get") >= 1
    finally:
        redis_server.resume()
    deadline = time.monotonic() + 5
    while tier.get(e.key) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tier.get(e.key) == e


def test_a_redis_that_was_never_there_is_only_counted(redis_server):
    port = redis_server.port
    redis_server.stop()
    tier = RedisTier(f"redis://127.0.0.1:{port}/0", timeout_seconds=0.1,
                     events=CountingEvents())
    e = make_entry(1)
    _, took = _timed(lambda: (tier.put(e), tier.get(e.key), tier.get(e.key)))
    assert took < QUICK
    assert tier.events.get("lookup", "redis", "error") == 2


def test_a_bad_url_is_a_config_error():
    with pytest.raises(ConfigError, match="not valid"):
        RedisTier("http://nowhere:1")


def test_circuit_breaker_backs_off_doubling_and_probes_once():
    now = [0.0]
    b = CircuitBreaker(1.0, 3.0, clock=lambda: now[0])
    assert b.allow() and not b.is_open
    assert b.failure() and not b.failure()  # concurrent failures open it once
    assert not b.allow()
    now[0] = 1.0
    assert b.allow() and not b.allow()  # one probe at a time
    assert not b.failure()  # the probe failed: open again, for 2 s
    now[0] = 2.9
    assert not b.allow()
    now[0] = 3.0
    assert b.allow() and not b.failure()  # 4 s would exceed the cap: 3 s
    now[0] = 5.9
    assert not b.allow()
    now[0] = 6.0
    assert b.allow() and b.success() and not b.is_open
    assert b.failure()
    now[0] = 7.0
    assert b.allow()  # backoff was reset to 1 s by the success
