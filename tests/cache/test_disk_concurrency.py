"""The disk tier shared by real processes (multiprocessing, spawn): writers racing on the same
keys, readers racing eviction. Every read must be None or exactly what one writer wrote."""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
import traceback
from collections import Counter

import pytest

from tests.cache.test_disk import check, disk_bytes, key_of, make
from tiled.cache.disk import DiskTier
from tiled.cache.entry import CountingEvents
from tiled.errors import CacheWriteError

CTX = mp.get_context("spawn")
SAME = [f"same{i}" for i in range(6)]  # every writer writes identical content
DIFF = [f"diff{i}" for i in range(6)]  # every writer writes its own valid content


def _sizes(name: str, writer: int) -> tuple[int, ...]:
    rng = random.Random(f"{name}:{writer}")
    return tuple(rng.choice((0, 700, 9000, 40_000)) for _ in range(rng.randint(1, 3)))


def _entry(name: str, writer: int):
    if name in SAME:
        return make(name, 0, _sizes(name, 0), shared=1)
    return make(name, writer, _sizes(name, writer), shared=writer % 2)


def _mixed_worker(root, cap, writer, seconds, barrier, results) -> None:
    counts: Counter = Counter()
    events = CountingEvents()
    try:
        tier = DiskTier(root, max_bytes=cap, events=events)
        rng = random.Random(writer)
        barrier.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            name, r = rng.choice(SAME + DIFF), rng.random()
            if r < 0.45:
                try:
                    tier.put(_entry(name, writer))
                    counts["put"] += 1
                except CacheWriteError as e:  # only "full": every entry busy or reserved
                    assert "is full" in str(e), e
                    counts["full"] += 1
            elif r < 0.48:
                tier.delete(key_of(name))
            else:
                got = tier.get(key_of(name))
                if got is not None:
                    check(got)
                    counts["hit"] += 1
                else:
                    counts["miss"] += 1
        # A race is never mistaken for damage: nothing here corrupts anything.
        assert events.get("lookup", "disk", "corrupt") == 0, "a race looked like corruption"
        assert events.get("lookup", "disk", "error") == 0, "a race caused a read error"
        results.put((writer, None, counts))
    except BaseException:
        results.put((writer, traceback.format_exc(), counts))


def _run(workers: int, target, args, seconds: float) -> Counter:
    barrier, results = CTX.Barrier(workers), CTX.Queue()
    procs = [CTX.Process(target=target, args=(*args, w, seconds, barrier, results))
             for w in range(workers)]
    for p in procs:
        p.start()
    total: Counter = Counter()
    failures = []
    for _ in procs:
        writer, error, counts = results.get(timeout=120)
        total.update(counts)
        if error:
            failures.append(f"worker {writer}:\n{error}")
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert not failures, "\n".join(failures)
    return total


@pytest.mark.parametrize("cap", [1 << 30, 400_000], ids=["roomy", "evicting"])
def test_sixteen_processes_race_on_the_same_keys(tmp_path, cap):
    root = tmp_path / "cache"
    total = _run(16, _mixed_worker, (str(root), cap), seconds=2.5)
    assert total["put"] > 50 and total["hit"] > 50, total
    tier = DiskTier(root, max_bytes=cap)
    assert tier.verify() == []
    assert disk_bytes(root) <= cap
    for name in SAME + DIFF:
        got = tier.get(key_of(name))
        if got is not None:
            check(got)
    tier.gc()
    assert tier.total_bytes() == disk_bytes(root) <= cap
    assert tier.verify() == []


def _reader(root, newest, stop, results) -> None:
    counts: Counter = Counter()
    events = CountingEvents()
    try:
        tier = DiskTier(root, max_bytes=1, events=events)  # a reader never writes
        rng = random.Random()
        while not stop.is_set():
            n = newest.value
            if n < 0:
                continue
            got = tier.get(key_of(f"e{rng.randint(max(0, n - 12), n)}"))
            if got is None:
                counts["miss"] += 1
            else:
                check(got)
                counts["hit"] += 1
        assert events.get("lookup", "disk", "corrupt") == 0, "eviction looked like corruption"
        assert events.get("lookup", "disk", "error") == 0, "eviction caused a read error"
        results.put((None, counts))
    except BaseException:
        results.put((traceback.format_exc(), counts))


def test_readers_never_see_an_entry_torn_by_eviction(tmp_path):
    """One process writes 400 entries of ~250 KiB into a cap of ten; three processes read the
    least recently written ones, the very entries eviction is removing."""
    root, cap = tmp_path / "cache", 2_600_000
    writer = DiskTier(root, max_bytes=cap)
    newest, stop, results = CTX.Value("i", -1), CTX.Event(), CTX.Queue()
    readers = [CTX.Process(target=_reader, args=(str(root), newest, stop, results))
               for _ in range(3)]
    for p in readers:
        p.start()
    rng = random.Random(3)
    try:
        for i in range(400):
            writer.put(make(f"e{i}", sizes=(rng.randint(150_000, 250_000), 4096), shared=1))
            newest.value = i
            if i % 20 == 0:
                assert disk_bytes(root) <= cap
    finally:
        stop.set()
    total: Counter = Counter()
    for _ in readers:
        error, counts = results.get(timeout=60)
        assert error is None, error
        total.update(counts)
    for p in readers:
        p.join(30)
    assert total["hit"] > 100, total
    assert disk_bytes(root) <= cap and writer.verify() == []


def test_threads_share_one_tier(tmp_path):
    """One DiskTier used by 8 threads (its in-process mutex plus per-call file locks)."""
    events = CountingEvents()
    tier = DiskTier(tmp_path / "cache", max_bytes=300_000, events=events)
    failures: list[str] = []

    def work(writer: int) -> None:
        rng = random.Random(writer)
        try:
            for _ in range(150):
                name = rng.choice(SAME + DIFF)
                if rng.random() < 0.4:
                    try:
                        tier.put(_entry(name, writer))
                    except CacheWriteError as e:
                        assert "is full" in str(e), e
                elif rng.random() < 0.05:
                    tier.delete(key_of(name))
                elif (got := tier.get(key_of(name))) is not None:
                    check(got)
        except BaseException:
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\n".join(failures)
    assert events.get("lookup", "disk", "hit") > 0
    assert events.get("lookup", "disk", "corrupt") == events.get("lookup", "disk", "error") == 0
    assert tier.verify() == [] and disk_bytes(tmp_path / "cache") <= 300_000
