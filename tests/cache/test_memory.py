"""The memory tier: a byte-bounded, thread-safe LRU that hands out entries nobody can alter."""

import random
import threading

import pytest

from tests.cache.conftest import make_entry, manifest_for
from tiled.cache.entry import CountingEvents, Entry, sha256_hex
from tiled.cache.memory import MemoryTier
from tiled.errors import CacheWriteError


def test_round_trip_and_events():
    events = CountingEvents()
    tier = MemoryTier(1 << 20, events)
    e = make_entry(1)
    assert tier.get(e.key) is None
    tier.put(e)
    assert tier.get(e.key) == e
    assert tier.contains(e.key) and tier.keys() == [e.key]
    assert events.get("lookup", "memory", "hit") == 1
    assert events.get("lookup", "memory", "miss") == 1
    assert events.get("bytes_written", "memory") == e.nbytes
    assert tier.delete(e.key) and not tier.delete(e.key)
    assert tier.get(e.key) is None and tier.nbytes == 0


def test_least_recently_used_is_evicted_first():
    a, b, c, d = (make_entry(i) for i in range(4))
    events = CountingEvents()
    tier = MemoryTier(3 * a.nbytes, events)  # all entries are the same size
    for e in (a, b, c):
        tier.put(e)
    assert tier.get(a.key) is not None  # a is now the most recent; b the least
    tier.put(d)
    assert tier.keys() == [c.key, a.key, d.key]
    assert not tier.contains(b.key)
    assert events.get("evicted", "memory") == 1
    assert events.get("evicted_bytes", "memory") == b.nbytes
    tier.contains(c.key)  # contains is not a use
    tier.put(b)
    assert tier.keys() == [a.key, d.key, b.key]


def test_byte_bound_holds_for_any_sequence_of_puts():
    rng = random.Random(0)
    tier = MemoryTier(10_000)
    for i in range(300):
        tier.put(make_entry(i % 40, size=rng.randrange(1, 3000), blobs=rng.randrange(1, 3)))
        held = [tier._entries[k] for k in tier.keys()]
        assert tier.nbytes == sum(e.nbytes for e in held) <= 10_000


def test_replacing_a_key_does_not_count_it_twice():
    tier = MemoryTier(1 << 20)
    small, big = make_entry(1, size=10), make_entry(1, size=1000)
    tier.put(small)
    tier.put(big)
    assert tier.nbytes == big.nbytes and tier.get(big.key) == big


def test_an_entry_larger_than_the_cap_is_not_kept():
    kept = make_entry(1, size=100)
    tier = MemoryTier(kept.nbytes + 400)
    tier.put(kept)
    tier.put(make_entry(2, size=1000))  # not kept, and evicts nothing
    assert tier.keys() == [kept.key]
    off = MemoryTier(0)
    off.put(kept)
    assert off.get(kept.key) is None


def test_an_entry_that_does_not_verify_is_refused():
    tier = MemoryTier(1 << 20)
    e = make_entry(1)
    bad = Entry(e.key, e.manifest, {sha256_hex(b"other"): b"not other"})
    with pytest.raises(CacheWriteError, match="does not hash"):
        tier.put(bad)
    assert tier.keys() == []


def test_entries_handed_out_and_taken_in_are_copies():
    tier = MemoryTier(1 << 20)
    data = bytearray(b"cubin" * 20)
    digest = sha256_hex(bytes(data))
    key, manifest = manifest_for("k", digest)
    tier.put(Entry(key, manifest, {digest: data}))
    data[:5] = b"XXXXX"  # the caller's buffer changes after the put
    got = tier.get(key)
    assert type(got.blobs[digest]) is bytes
    got.validate()
    got.blobs.clear()  # the caller's dict changes after the get
    tier.get(key).validate()
    assert tier.get(key).blobs


def test_threads_hammering_one_tier_keep_it_consistent():
    entries = [make_entry(i, size=50 + 37 * i) for i in range(60)]
    cap = sum(e.nbytes for e in entries) // 4
    tier = MemoryTier(cap)
    errors = []

    def work(seed):
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                e = rng.choice(entries)
                op = rng.random()
                if op < 0.45:
                    tier.put(e)
                elif op < 0.9:
                    got = tier.get(e.key)
                    assert got is None or got == e
                elif op < 0.95:
                    tier.delete(e.key)
                else:
                    tier.keys()
        except Exception as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    held = [tier._entries[k] for k in tier.keys()]
    assert tier.nbytes == sum(e.nbytes for e in held) <= cap


def test_a_broken_entry_is_refused_and_a_good_put_replaces_what_was_held():
    tier = MemoryTier(1 << 20)
    e, other = make_entry(1), make_entry(2)
    for bad, why in [(Entry(e.key, e.manifest, {}), "which the entry lacks"),
                     (Entry(e.key, b"{not json", e.blobs), "not valid JSON"),
                     (Entry(e.key, other.manifest, other.blobs), "action record hashes to")]:
        with pytest.raises(CacheWriteError, match=why):
            tier.put(bad)
    assert tier.keys() == []
    small, big = make_entry(1, size=10), make_entry(1, size=1000)
    tier.put(small)
    tier.put(big)
    assert tier.get(e.key) == big
