"""The disk tier under damage: writers killed with SIGKILL (at every named point, and at random
moments), flipped bytes, truncated and missing files, a full disk, failing system calls.
Never a wrong entry, never an exception from get(), and gc() leaves verify() clean."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import multiprocessing as mp
import os
import random
import re
import signal
import time

import pytest

from tests.cache.conftest import entry_for
from tests.cache.test_disk import check, disk_bytes, key_of, make
from tiled.cache import disk
from tiled.cache.disk import DiskTier
from tiled.cache.disk_layout import encode_record
from tiled.cache.entry import CountingEvents, Entry
from tiled.errors import CacheWriteError

CTX = mp.get_context("spawn")


def _entry_dir(root, key):
    return root / "v1" / "ac" / key[:2] / key


def _assert_sound(tier: DiskTier, root, names) -> None:
    """No entry is partial (only staging leftovers, which gc() sweeps, may be wrong); every
    key is absent or whole; the ledger never counts less than the directory holds."""
    assert {p.kind for p in tier.verify()} <= {"staging"}
    events = tier.events
    for name in names:
        got = tier.get(key_of(name))
        if got is not None:
            check(got)
    assert isinstance(events, CountingEvents)
    assert events.get("lookup", "disk", "corrupt") == events.get("lookup", "disk", "error") == 0
    assert tier.total_bytes() >= disk_bytes(root)


def _assert_clean_after_gc(tier: DiskTier, root) -> None:
    tier.gc()
    assert tier.verify() == []
    assert os.listdir(root / "v1" / "staging") == []
    assert tier.total_bytes() == disk_bytes(root) <= tier.max_bytes


# -- SIGKILL ----------------------------------------------------------------------------------


def _die_at(point: str, root: str, cap: int, name: str) -> None:
    def hook(at: str) -> None:
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    disk._unsafe_fault_hook = hook
    DiskTier(root, max_bytes=cap).put(make(name, sizes=(10_000, 500)))


POINTS = ["reserved", "staged-blobs", "staged", "committing", "linked", "published", "evicting"]


@pytest.mark.parametrize("point", POINTS)
def test_writer_killed_at_each_point_leaves_no_partial_entry(tmp_path, point):
    root, cap = tmp_path / "cache", 40_000  # three entries fit; a fourth evicts one
    tier = DiskTier(root, max_bytes=cap, events=CountingEvents())
    old = [f"old{i}" for i in range(3)]
    for name in old:
        tier.put(make(name, sizes=(10_000, 500)))
    p = CTX.Process(target=_die_at, args=(point, str(root), cap, "new"))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL, f"the writer did not reach {point!r}"
    _assert_sound(tier, root, [*old, "new"])
    if point == "published":
        assert tier.get(key_of("new")) == make("new", sizes=(10_000, 500))
    elif point != "evicting":
        assert tier.get(key_of("new")) is None
    _assert_clean_after_gc(tier, root)
    tier.put(make("after", sizes=(10_000,)))  # the cache still works, within its cap
    assert tier.get(key_of("after")) is not None
    _assert_clean_after_gc(tier, root)


def _write_forever(root: str, cap: int, seed: int, ready) -> None:
    tier = DiskTier(root, max_bytes=cap)
    rng = random.Random(seed)
    ready.set()
    while True:
        sizes = tuple(rng.choice((100, 5000, 30_000)) for _ in range(rng.randint(1, 3)))
        name = f"r{rng.randrange(40)}"
        if rng.random() < 0.2:
            tier.delete(key_of(name))
        tier.put(make(name, sizes=sizes, shared=rng.randint(0, 1)))


def test_writers_killed_at_random_moments(tmp_path):
    """30 writers, each SIGKILLed after a random delay while it puts, evicts and deletes."""
    root, cap = tmp_path / "cache", 300_000
    tier = DiskTier(root, max_bytes=cap, events=CountingEvents())
    rng = random.Random(11)
    names = [f"r{i}" for i in range(40)]
    for i in range(30):
        ready = CTX.Event()
        p = CTX.Process(target=_write_forever, args=(str(root), cap, i, ready))
        p.start()
        assert ready.wait(60)
        time.sleep(rng.uniform(0.0, 0.15))  # the fault's timing, not a synchronization
        p.kill()
        p.join(30)
        _assert_sound(tier, root, names)
    _assert_clean_after_gc(tier, root)
    assert any(tier.contains(key_of(n)) for n in names)


# -- damaged files ----------------------------------------------------------------------------


@pytest.fixture
def events():
    return CountingEvents()


@pytest.fixture
def root(tmp_path):
    return tmp_path / "cache"


def _corrupt_then_repair(root, events, caplog, damage) -> None:
    tier = DiskTier(root, events=events)
    e, other = make("victim", sizes=(4000, 300)), make("bystander", sizes=(4000,))
    tier.put(e)
    tier.put(other)
    damage(e)
    with caplog.at_level(logging.WARNING, logger="tiled.cache"):
        assert tier.get(e.key) is None
    assert events.get("lookup", "disk", "corrupt") == 1
    assert any("corrupt" in r.getMessage() and e.key[:12] in r.getMessage()
               for r in caplog.records)
    assert not _entry_dir(root, e.key).exists()  # removed, so a recompile can replace it
    assert tier.get(e.key) is None and events.get("lookup", "disk", "miss") == 1
    tier.put(e)
    assert tier.get(e.key) == e and tier.get(other.key) == other
    assert tier.verify() == []
    assert tier.total_bytes() >= disk_bytes(root)  # the damage itself may have shrunk files
    _assert_clean_after_gc(tier, root)


def test_flipped_byte_in_a_blob(root, events, caplog):
    def flip(e: Entry) -> None:
        digest = max(e.blobs, key=lambda d: len(e.blobs[d]))
        path = root / "v1" / "cas" / digest[:2] / digest  # the same inode as the entry's link
        data = bytearray(path.read_bytes())
        data[1234] ^= 0x40
        path.write_bytes(bytes(data))

    _corrupt_then_repair(root, events, caplog, flip)


def test_truncated_record(root, events, caplog):
    def truncate(e: Entry) -> None:
        record = _entry_dir(root, e.key) / "record"
        os.truncate(record, os.path.getsize(record) // 2)

    _corrupt_then_repair(root, events, caplog, truncate)


def test_garbled_record(root, events, caplog):
    def garble(e: Entry) -> None:
        record = _entry_dir(root, e.key) / "record"
        data = bytearray(record.read_bytes())
        data[-2] ^= 0x01
        record.write_bytes(bytes(data))

    _corrupt_then_repair(root, events, caplog, garble)


def test_missing_blob(root, events, caplog):
    def unlink(e: Entry) -> None:
        os.unlink(_entry_dir(root, e.key) / min(e.blobs))

    _corrupt_then_repair(root, events, caplog, unlink)


def test_missing_record(root, events, caplog):
    _corrupt_then_repair(root, events, caplog,
                         lambda e: os.unlink(_entry_dir(root, e.key) / "record"))


def test_entry_of_another_key(root, events, caplog):
    def swap(e: Entry) -> None:  # a valid record, filed under the wrong key
        d = _entry_dir(root, e.key)
        for name in os.listdir(d):
            os.unlink(d / name)
        other = _entry_dir(root, key_of("bystander"))
        for name in os.listdir(other):
            os.link(other / name, d / name)

    _corrupt_then_repair(root, events, caplog, swap)


def test_a_file_where_an_entry_directory_belongs(root, events, caplog):
    def replace(e: Entry) -> None:
        d = _entry_dir(root, e.key)
        for name in os.listdir(d):
            os.unlink(d / name)
        d.rmdir()
        d.write_bytes(b"junk")

    _corrupt_then_repair(root, events, caplog, replace)


def _rewrite_record(root, e: Entry, manifest: bytes, blobs=None) -> None:
    """Replaces e's record with one that passes its checksum: what a writer that checked
    nothing (a tiled before manifests were checked, a bundle import) would have published."""
    sizes = {d: len(b) for d, b in (e.blobs if blobs is None else blobs).items()}
    record = _entry_dir(root, e.key) / "record"
    record.unlink()
    record.write_bytes(encode_record(e.key, manifest, sizes))


def test_manifest_not_json(root, events, caplog):
    _corrupt_then_repair(root, events, caplog, lambda e: _rewrite_record(root, e, b"{not json"))


def test_manifest_nested_too_deeply(root, events):
    # Not _corrupt_then_repair: this damage grows the record past what the ledger counts.
    tier = DiskTier(root, events=events)
    e = make("victim")
    tier.put(e)
    _rewrite_record(root, e, b"[" * 100_000 + b"]" * 100_000)
    assert tier.get(e.key) is None and events.get("lookup", "disk", "corrupt") == 1
    tier.put(e)
    assert tier.get(e.key) == e


def test_json_that_is_not_a_manifest(root, events, caplog):
    _corrupt_then_repair(root, events, caplog,
                         lambda e: _rewrite_record(root, e, b'{"artifact_sha256": "x"}'))


def test_manifest_naming_a_blob_the_entry_lacks(root, events, caplog):
    """Issue 10: such an entry (from a bundle) was a hit whose artifact lookup failed on every
    later request, and no put replaced it: the key was broken for good."""
    def drop_artifact(e: Entry) -> None:
        artifact = json.loads(e.manifest)["artifact_sha256"]
        _rewrite_record(root, e, e.manifest, {d: b for d, b in e.blobs.items() if d != artifact})
        os.unlink(_entry_dir(root, e.key) / artifact)

    _corrupt_then_repair(root, events, caplog, drop_artifact)


def test_action_record_of_another_key(root, events, caplog):
    def foreign(e: Entry) -> None:  # the same artifact, described as another program's
        (artifact, *_) = e.blobs.values()
        _rewrite_record(root, e, entry_for("intruder", [artifact]).manifest)

    _corrupt_then_repair(root, events, caplog, foreign)


def test_a_put_racing_a_broken_entry_replaces_it(root, events, monkeypatch):
    """A broken entry published under the key after put looked (by a writer that checks
    nothing) does not win the rename race: the put removes it and publishes its own."""
    tier = DiskTier(root, events=events)
    e = make("victim", sizes=(4000,))

    def publish_broken(point: str) -> None:
        if point == "linked":
            d = _entry_dir(root, e.key)
            d.mkdir()
            (d / "record").write_bytes(encode_record(e.key, b"{not json", {}))

    monkeypatch.setattr(disk, "_unsafe_fault_hook", publish_broken)
    tier.put(e)
    monkeypatch.setattr(disk, "_unsafe_fault_hook", None)
    assert tier.get(e.key) == e
    _assert_clean_after_gc(tier, root)


def test_put_over_a_corrupt_entry_replaces_it(root, events):
    tier = DiskTier(root, events=events)
    e = make("victim", sizes=(4000,))
    tier.put(e)
    record = _entry_dir(root, e.key) / "record"
    os.truncate(record, 10)
    tier.put(e)  # without a get first
    assert tier.get(e.key) == e
    _rewrite_record(root, e, e.manifest, {})  # a manifest naming a blob the entry lacks
    tier.put(e)  # "the first complete put wins": a broken entry is not complete
    assert tier.get(e.key) == e and tier.verify() == []


# -- failing system calls ---------------------------------------------------------------------


def _eio(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error (injected)")


def test_a_read_error_is_a_counted_miss(root, events, monkeypatch):
    tier = DiskTier(root, events=events)
    e = make("a")
    tier.put(e)
    monkeypatch.setattr(disk, "read_all", _eio)
    assert tier.get(e.key) is None
    assert events.get("lookup", "disk", "error") == 1 and events.get("error", "disk", "read") == 1
    monkeypatch.undo()
    assert tier.get(e.key) == e  # an I/O error is not corruption: the entry stays


def test_repair_leaves_an_entry_an_io_error_hides(root, events, monkeypatch):
    tier = DiskTier(root, events=events)
    e = make("a")
    tier.put(e)
    monkeypatch.setattr(disk, "read_all", _eio)
    problems = tier.verify(repair=True)
    assert [(p.kind, p.key, p.removed) for p in problems] == [("unreadable", e.key, False)]
    monkeypatch.undo()
    assert tier.get(e.key) == e and tier.verify() == []


@pytest.mark.parametrize("where", ["stage", "commit"])
def test_a_write_error_is_a_cache_write_error_and_loses_nothing(root, events, monkeypatch, where):
    tier = DiskTier(root, events=events)
    kept = make("kept")
    tier.put(kept)
    before = tier.total_bytes()
    if where == "stage":
        monkeypatch.setattr(disk, "write_file", _eio)
    else:
        monkeypatch.setattr(disk.Layout, "link_blob", _eio)
    with pytest.raises(CacheWriteError, match=r"failed: .*Input/output error"):
        tier.put(make("new", sizes=(3000, 4000)))
    monkeypatch.undo()
    assert events.get("error", "disk", "write") == 1
    assert tier.get(kept.key) == kept and tier.get(key_of("new")) is None
    assert os.listdir(root / "v1" / "staging") == []
    assert tier.total_bytes() == before == disk_bytes(root)
    assert tier.verify() == []


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs: a disk that really fills up."""
    target = tmp_path / "small"
    target.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, b"size=2m") != 0:
        err = ctypes.get_errno()
        if err == errno.EPERM:
            pytest.skip("mounting a 2 MiB tmpfs failed with EPERM (needs CAP_SYS_ADMIN)")
        pytest.fail(f"mounting a tmpfs at {target} failed: {os.strerror(err)}")
    try:
        yield target
    finally:
        if libc.umount2(str(target).encode(), 0) != 0:
            libc.umount2(str(target).encode(), 2)  # MNT_DETACH: still busy, let go lazily


def test_a_full_disk_is_a_clear_error_and_keeps_what_is_stored(small_fs, events):
    root = small_fs / "cache"
    tier = DiskTier(root, max_bytes=1 << 30, events=events)  # the cap is not what stops it
    stored = []
    full = rf"cache disk full at {re.escape(str(root))}: .*No space left"
    with pytest.raises(CacheWriteError, match=full):
        for i in range(50):
            e = make(f"f{i}", sizes=(150_000, 3000))
            tier.put(e)
            stored.append(e)
    assert len(stored) >= 5
    assert events.get("error", "disk", "write") == 1
    for e in stored:
        assert tier.get(e.key) == e
    assert os.listdir(root / "v1" / "staging") == []
    assert tier.total_bytes() == disk_bytes(root)  # the failed put's reservation is gone
    assert tier.verify() == []
    assert tier.delete(stored[0].key) and tier.delete(stored[1].key)
    tier.put(make("after", sizes=(150_000,)))  # room again: writes work again
    assert tier.get(key_of("after")) is not None
