"""The disk tier in one process: layout, round trips, dedup, LRU eviction under the cap,
verify() and gc(). Processes, crashes and corruption: test_disk_concurrency.py and
test_disk_faults.py (which import the helpers below)."""

from __future__ import annotations

import fcntl
import json
import os
import random
import time
from pathlib import Path

import pytest

from tests.cache.conftest import entry_for, manifest_for
from tiled import config
from tiled.cache import disk
from tiled.cache.disk import DiskTier
from tiled.cache.disk_layout import encode_record
from tiled.cache.entry import CountingEvents, Entry, sha256_hex
from tiled.errors import CacheWriteError

# -- helpers shared with the other disk tests ------------------------------------------------


def key_of(name: str) -> str:
    return manifest_for(name, "0" * 64)[0]


def make(name: str, writer: int = 0, sizes: tuple[int, ...] = (1000,), shared: int = 0) -> Entry:
    """An entry that describes itself: its manifest's symbol names `name`, `writer` and the blob
    sizes, so `check` can rebuild exactly what this writer wrote. Blob i is random bytes seeded
    by (name, writer, i); the first `shared` blobs depend on the size only (shared by entries).
    The key depends on `name` only; blob 0 is the manifest's artifact."""
    datas = []
    for i, size in enumerate(sizes):
        seed = f"shared:{size}" if i < shared else f"{name}:{writer}:{i}"
        datas.append(random.Random(seed).randbytes(size))
    return entry_for(name, datas, symbol=json.dumps([name, writer, list(sizes), shared]))


def check(entry: Entry) -> None:
    """Raises AssertionError unless `entry` is byte for byte what make() gives for the name,
    writer and sizes its manifest states (so never one writer's manifest with another's blobs)."""
    name, writer, sizes, shared = json.loads(json.loads(entry.manifest)["symbol"])
    expected = make(name, writer, tuple(sizes), shared)
    assert entry == expected, f"torn or foreign entry for {name} (writer {writer})"


def disk_bytes(root: Path) -> int:
    """What the cache really holds: bytes of the unique inodes under root/v1 (ledger and lock
    files excluded, as the cap excludes them)."""
    seen = {}
    for top in ("ac", "cas", "staging"):
        for dirpath, _, files in os.walk(root / "v1" / top):
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except FileNotFoundError:
                    continue
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


@pytest.fixture
def events():
    return CountingEvents()


@pytest.fixture
def tier(tmp_path, events):
    return DiskTier(tmp_path / "cache", max_bytes=1 << 30, events=events)


# -- round trips and layout -------------------------------------------------------------------


def test_round_trip_and_events(tier, events):
    e = make("a", sizes=(10, 20_000, 0))
    assert tier.get(e.key) is None
    tier.put(e)
    got = tier.get(e.key)
    assert got == e
    assert tier.contains(e.key) and tier.keys() == [e.key]
    assert events.get("lookup", "disk", "miss") == 1
    assert events.get("lookup", "disk", "hit") == 1
    assert events.get("bytes_read", "disk") == e.nbytes
    assert events.get("bytes_written", "disk") >= e.nbytes
    assert tier.delete(e.key) and not tier.delete(e.key)
    assert tier.get(e.key) is None and not tier.contains(e.key)
    assert tier.verify() == []


def test_an_entry_must_hold_what_its_manifest_names_and_bad_keys_miss(tier, events):
    e = make("empty", sizes=(0,))
    tier.put(e)  # an empty artifact is still an artifact
    assert tier.get(e.key) == e
    for bad in (Entry(e.key, e.manifest, {}),  # names a blob it does not hold
                Entry(key_of("x"), b"{}", e.blobs),  # not a manifest
                Entry(key_of("other"), e.manifest, e.blobs)):  # action record of another key
        with pytest.raises(CacheWriteError, match="refused"):
            tier.put(bad)
    assert tier.keys() == [e.key] and events.get("error", "disk", "write") == 3
    assert tier.get("not-a-key") is None
    assert not tier.contains("../../etc") and not tier.delete("../x")


def test_layout_matches_the_docstring(tier, tmp_path):
    e = make("layout", sizes=(300, 400))
    tier.put(e)
    base = tmp_path / "cache" / "v1"
    d = base / "ac" / e.key[:2] / e.key
    assert sorted(os.listdir(d)) == sorted([*e.blobs, "record"])
    for digest, data in e.blobs.items():
        cas = base / "cas" / digest[:2] / digest
        assert cas.read_bytes() == data
        assert os.stat(cas).st_ino == os.stat(d / digest).st_ino  # one inode, two links
    check_line, body = (d / "record").read_bytes().split(b"\n", 1)
    assert check_line == sha256_hex(body).encode()
    header, manifest = body.split(b"\n", 1)
    assert manifest == e.manifest
    assert json.loads(header)["blobs"] == [[k, len(v)] for k, v in sorted(e.blobs.items())]
    assert os.listdir(base / "staging") == []


def test_first_complete_put_wins(tier):
    first, second = make("k", writer=1), make("k", writer=2)
    assert first.key == second.key and first != second
    tier.put(first)
    tier.put(second)  # not an error, and not a replacement
    assert tier.get(first.key) == first


def test_refuses_invalid_and_oversized_entries(tmp_path, events):
    tier = DiskTier(tmp_path, max_bytes=10_000, events=events)
    e = make("x")
    bad = Entry(e.key, e.manifest, {next(iter(e.blobs)): b"not the content"})
    with pytest.raises(CacheWriteError, match="does not hash"):
        tier.put(bad)
    with pytest.raises(CacheWriteError, match=r"more than the whole disk cache cap of 10000"):
        tier.put(make("big", sizes=(20_000,)))
    assert events.get("error", "disk", "write") == 2
    assert tier.keys() == [] and tier.total_bytes() == 0


def test_defaults_come_from_config(tmp_path):
    with config.override(cache_dir=tmp_path / "c", cache_max_bytes=12345):
        tier = DiskTier()
    assert tier.root == tmp_path / "c" and tier.max_bytes == 12345
    assert (tmp_path / "c" / "v1" / "ac").is_dir()


# -- blobs shared by entries ------------------------------------------------------------------


def test_shared_blob_is_stored_once_and_kept_while_named(tier, tmp_path):
    a = make("a", sizes=(5000, 100), shared=1)
    b = make("b", sizes=(5000, 200), shared=1)
    common = next(d for d in a.blobs if d in b.blobs)
    tier.put(a)
    tier.put(b)
    cas = tmp_path / "cache" / "v1" / "cas" / common[:2] / common
    assert os.stat(cas).st_nlink == 3  # cas/ + both entries
    assert disk_bytes(tmp_path / "cache") < a.nbytes + b.nbytes
    assert tier.delete(a.key)
    assert tier.get(b.key) == b and cas.exists()
    assert tier.delete(b.key)
    assert not cas.exists() and disk_bytes(tmp_path / "cache") == 0
    assert tier.total_bytes() == 0


def test_dedup_skips_a_corrupt_cas_copy(tier, tmp_path):
    a = make("a", sizes=(5000,), shared=1)
    tier.put(a)
    digest = next(iter(a.blobs))
    cas = tmp_path / "cache" / "v1" / "cas" / digest[:2] / digest
    tier.delete(a.key)
    cas.parent.mkdir(exist_ok=True)
    cas.write_bytes(b"x" * 5000)  # a damaged copy sitting in the dedup index
    b = make("b", sizes=(5000,), shared=1)
    tier.put(b)
    assert tier.get(b.key) == b


# -- the cap and the LRU order ----------------------------------------------------------------


def _age(tmp_path: Path, key: str, seconds_ago: float) -> None:
    record = tmp_path / "cache" / "v1" / "ac" / key[:2] / key / "record"
    t = time.time() - seconds_ago
    os.utime(record, (t, t))


def test_evicts_least_recently_used(tmp_path, events):
    tier = DiskTier(tmp_path / "cache", max_bytes=35_000, events=events)
    a, b, c = (make(n, sizes=(10_000,)) for n in "abc")
    for i, e in enumerate((a, b, c)):
        tier.put(e)
        _age(tmp_path, e.key, 300 - 100 * i)  # a oldest, then b, then c
    assert tier.get(a.key) == a  # a hit makes a the most recent
    tier.put(make("d", sizes=(10_000,)))
    assert tier.contains(a.key) and not tier.contains(b.key)
    assert events.get("evicted", "disk") >= 1
    assert disk_bytes(tmp_path / "cache") <= 35_000 <= tier.max_bytes


def test_eviction_skips_an_entry_being_read(tmp_path):
    tier = DiskTier(tmp_path / "cache", max_bytes=25_000)
    a, b = make("a", sizes=(10_000,)), make("b", sizes=(10_000,))
    tier.put(a)
    tier.put(b)
    _age(tmp_path, a.key, 200)
    _age(tmp_path, b.key, 100)
    record = tmp_path / "cache" / "v1" / "ac" / a.key[:2] / a.key / "record"
    with open(record, "rb") as reader:  # what get() holds while it reads a's blobs
        fcntl.flock(reader, fcntl.LOCK_SH)
        tier.put(make("c", sizes=(10_000,)))
        assert tier.contains(a.key) and not tier.contains(b.key)


def test_full_of_entries_being_read_is_a_write_error(tmp_path):
    tier = DiskTier(tmp_path / "cache", max_bytes=15_000)
    a = make("a", sizes=(10_000,))
    tier.put(a)
    record = tmp_path / "cache" / "v1" / "ac" / a.key[:2] / a.key / "record"
    with open(record, "rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)
        with pytest.raises(CacheWriteError, match="is full"):
            tier.put(make("b", sizes=(10_000,)))
    assert tier.get(a.key) == a
    tier.put(make("b", sizes=(10_000,)))  # reader gone: a is evicted now
    assert not tier.contains(a.key)


def test_randomized_puts_stay_under_the_cap(tmp_path, events):
    """2,000 puts of random sizes (some sharing a blob), gets interleaved: the directory never
    exceeds the cap, the ledger never under-counts, every hit is intact, verify() is clean."""
    rng = random.Random(7)
    cap = 400_000
    tier = DiskTier(tmp_path / "cache", max_bytes=cap, events=events)
    root = tmp_path / "cache"
    names = []
    for i in range(2000):
        sizes = tuple(rng.choice((100, 3000, 20_000, 60_000)) for _ in range(rng.randint(1, 3)))
        tier.put(make(f"e{i}", sizes=sizes, shared=rng.randint(0, 1)))
        names.append(f"e{i}")
        for name in rng.sample(names[-30:], min(3, len(names))):
            got = tier.get(key_of(name))
            if got is not None:
                check(got)
        if i % 50 == 0 or i > 1990:
            measured = disk_bytes(root)
            assert measured <= cap
            assert tier.total_bytes() >= measured
    assert events.get("evicted", "disk") > 100
    assert events.get("lookup", "disk", "hit") > 1000
    assert tier.verify() == []
    tier.gc()
    assert tier.total_bytes() == disk_bytes(root) <= cap


# -- maintenance ------------------------------------------------------------------------------


def _damaged_cache(tier, tmp_path):
    """A cache holding one good entry and one of each kind of broken one; returns
    (good, {key: what is wrong with it})."""
    base = tmp_path / "cache" / "v1"
    names = ("good", "torn", "trunc", "notjson", "notmanifest", "noblob", "foreign", "old")
    e = {n: make(n, sizes=(100, 200)) for n in names}
    e["old"] = entry_for("old", [b"built before manifests carried actions"], action=False)
    for entry in e.values():
        tier.put(entry)

    def rewrite(entry, manifest, blobs=None):
        sizes = {d: len(b) for d, b in (entry.blobs if blobs is None else blobs).items()}
        (base / "ac" / entry.key[:2] / entry.key / "record").write_bytes(
            encode_record(entry.key, manifest, sizes))

    os.unlink(base / "ac" / e["torn"].key[:2] / e["torn"].key / max(e["torn"].blobs))
    record = base / "ac" / e["trunc"].key[:2] / e["trunc"].key / "record"
    record.write_bytes(record.read_bytes()[:-3])
    rewrite(e["notjson"], b"{not json")
    rewrite(e["notmanifest"], b'{"name": "k"}')
    artifact = json.loads(e["noblob"].manifest)["artifact_sha256"]
    rewrite(e["noblob"], e["noblob"].manifest,
            {d: b for d, b in e["noblob"].blobs.items() if d != artifact})
    rewrite(e["foreign"], entry_for("intruder", list(e["foreign"].blobs.values())).manifest)
    return e["good"], {e[n].key: n for n in names if n != "good"}


def test_verify_names_each_broken_thing(tier, tmp_path):
    good, broken = _damaged_cache(tier, tmp_path)
    base = tmp_path / "cache" / "v1"
    bad_blob = base / "cas" / "00" / ("00" * 32)
    bad_blob.parent.mkdir(exist_ok=True)
    bad_blob.write_bytes(b"junk")
    (base / "ac" / "zz").mkdir()
    (base / "ac" / "zz" / "stray").write_bytes(b"")
    problems = tier.verify()
    details = {p.key: p.detail for p in problems if p.kind == "entry"}
    assert set(details) == set(broken)
    why = {broken[k]: d for k, d in details.items()}
    assert "is missing" in why["torn"] and "checksum" in why["trunc"]
    assert "not valid JSON" in why["notjson"] and "missing field" in why["notmanifest"]
    assert "which the entry lacks" in why["noblob"]
    assert "action record hashes to" in why["foreign"]
    assert "no action record" in why["old"]
    assert {p.kind for p in problems} == {"entry", "blob", "stray"}
    assert not any(p.removed for p in problems)
    assert tier.get(good.key) == good  # verify changed nothing
    assert all(tier.contains(k) for k in broken)


def test_verify_repair_removes_what_verify_reports(tier, tmp_path):
    good, broken = _damaged_cache(tier, tmp_path)
    base = tmp_path / "cache" / "v1"
    bad_blob = base / "cas" / "00" / ("00" * 32)
    bad_blob.parent.mkdir(exist_ok=True)
    bad_blob.write_bytes(b"junk")
    dead = base / "staging" / f"w.{disk.writer_token().rsplit('.', 2)[0]}.999999999.abc"
    dead.mkdir()
    (base / "ac" / "zz").mkdir()
    (base / "ac" / "zz" / "stray").write_bytes(b"")
    repaired = tier.verify(repair=True)
    assert {p.key for p in repaired if p.kind == "entry"} == set(broken)
    assert all(p.removed for p in repaired), [p for p in repaired if not p.removed]
    assert {p.kind for p in repaired} == {"entry", "blob", "stray", "staging"}
    assert not bad_blob.exists() and not dead.exists()
    assert not (base / "ac" / "zz" / "stray").exists()
    assert tier.verify() == [] and tier.keys() == [good.key] and tier.get(good.key) == good
    assert tier.total_bytes() == disk_bytes(tmp_path / "cache")
    for key, name in broken.items():  # every broken key recovers with the next put
        if name != "old":
            tier.put(make(name, sizes=(100, 200)))
            assert tier.get(key) == make(name, sizes=(100, 200))


def test_gc_sweeps_stale_staging_and_orphans(tmp_path):
    root = tmp_path / "cache"
    tier = DiskTier(root, max_bytes=1 << 20)
    e = make("kept")
    tier.put(e)
    staging = root / "v1" / "staging"
    dead = staging / f"w.{disk.writer_token().rsplit('.', 2)[0]}.999999999.abc"
    dead.mkdir()
    (dead / "record").write_bytes(b"half")
    remote = staging / "w.otherhost-1.42.def"
    remote.mkdir()
    old = time.time() - 7200
    os.utime(remote, (old, old))
    fresh_remote = staging / "w.otherhost-1.43.fed"  # another host's write in flight
    fresh_remote.mkdir()
    orphan = root / "v1" / "cas" / "ab" / ("ab" * 32)
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"o")
    assert {p.kind for p in tier.verify()} >= {"staging"}
    report = tier.gc()
    assert report["swept"] == 2 and report["orphans"] == 1
    assert os.listdir(staging) == [fresh_remote.name]
    assert tier.verify() == [] and tier.get(e.key) == e
    assert tier.total_bytes() == disk_bytes(root) - 0  # fresh_remote holds no files


def test_opening_sweeps_dead_writers(tmp_path):
    root = tmp_path / "cache"
    DiskTier(root)
    dead = root / "v1" / "staging" / f"w.{disk.writer_token().rsplit('.', 2)[0]}.999999999.a"
    dead.mkdir()
    DiskTier(root)
    assert not dead.exists()


def test_gc_enforces_a_lowered_cap_and_clear_empties(tmp_path):
    root = tmp_path / "cache"
    big = DiskTier(root, max_bytes=1 << 20)
    for i in range(10):
        big.put(make(f"e{i}", sizes=(10_000,)))
    small = DiskTier(root, max_bytes=50_000)
    small.gc()
    assert disk_bytes(root) <= 50_000 and len(small.keys()) < 10
    stats = small.stats()
    assert stats.entries == len(small.keys()) and stats.bytes == disk_bytes(root)
    assert stats.ledger_bytes == stats.bytes and stats.reserved_bytes == 0
    small.clear()
    assert small.keys() == [] and disk_bytes(root) == 0 and small.total_bytes() == 0
    assert small.verify() == []


def test_a_garbled_ledger_is_rebuilt(tmp_path):
    root = tmp_path / "cache"
    tier = DiskTier(root)
    tier.put(make("a"))
    (root / "v1" / "ledger").write_bytes(b"{garbage")
    assert tier.total_bytes() == disk_bytes(root) > 0
