"""Bundles: export a set of entries to one file; import verifies everything or refuses the
whole bundle with a named reason. The hostile bundles are those of issue 10, finding 3."""

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from tests.cache.conftest import entry_for, make_entry, toolchain_of
from tests.cache.fakes import DictTier
from tiled.cache import bundle
from tiled.cache.bundle import export_bundle, import_bundle, read_bundle
from tiled.cache.disk import DiskTier
from tiled.cache.entry import Entry, sha256_hex
from tiled.errors import BundleError, CacheWriteError

ROOT = Path(__file__).resolve().parents[2]


def cuda_entry(i):
    return make_entry(i, size=1000, backend="cuda")


@pytest.fixture
def filled():
    tier = DictTier()
    for i in range(5):
        tier.put(cuda_entry(i))
    tier.put(make_entry(99))  # cpu
    return tier


@pytest.fixture
def good(filled, tmp_path):
    path = tmp_path / "good.tiled"
    export_bundle(filled, path)
    return path


def members(path):
    """[(name, bytes)] of a bundle, in order."""
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def write_tar(path, items):
    """A ustar file of `items` [(name, bytes)], in order (a hand-made bundle)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in items:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def rewrite_index(src, dst, mutate):
    items = members(src)
    index = json.loads(items[0][1])
    mutate(index)
    return write_tar(dst, [("index.json", json.dumps(index).encode()), *items[1:]])


def refused(path, match, tier=None):
    """Imports `path` into `tier` (a fresh DictTier), expecting a refusal matching `match`
    with nothing imported; returns the message."""
    tier = tier if tier is not None else DictTier()
    before = dict(tier.entries)
    with pytest.raises(BundleError, match=match) as info:
        import_bundle(tier, path, toolchain_of)
    assert tier.entries == before, "a refused bundle imported something"
    return str(info.value)


# -- round trips ------------------------------------------------------------------------------


def test_round_trip_into_memory_and_disk(filled, good, tmp_path):
    fresh = DictTier()
    report = import_bundle(fresh, good, toolchain_of)
    assert (report.entries, report.added) == (6, 6)
    assert report.targets == {"cuda:sm_90a": 5, "cpu": 1}
    assert fresh.entries == filled.entries
    disk = DiskTier(tmp_path / "cache")
    assert import_bundle(disk, good, toolchain_of).added == 6  # streamed: put_files
    assert all(disk.get(k) == e for k, e in filled.entries.items())
    assert disk.verify() == []
    assert import_bundle(disk, good, toolchain_of).added == 0  # held already: not an error


def test_export_by_target_and_by_keys(filled, tmp_path):
    export_bundle(filled, tmp_path / "gpu.tiled", target="cuda:sm_90a")
    assert len(read_bundle(tmp_path / "gpu.tiled")) == 5
    key = cuda_entry(2).key
    export_bundle(filled, tmp_path / "one.tiled", keys=[key])
    assert [e.key for e in read_bundle(tmp_path / "one.tiled")] == [key]
    with pytest.raises(BundleError, match="not in the cache"):
        export_bundle(filled, tmp_path / "x.tiled", keys=["0" * 64])


def test_export_leaves_out_entries_without_an_action_record(filled, tmp_path):
    old = entry_for("old", [b"old kernel"], action=False)
    filled.put(old)
    assert export_bundle(filled, tmp_path / "all.tiled").entries == 6
    with pytest.raises(BundleError, match=f"entry {old.key} has no action record"):
        export_bundle(filled, tmp_path / "old.tiled", keys=[old.key])
    assert not (tmp_path / "old.tiled").exists()


def test_export_is_deterministic(filled, tmp_path):
    export_bundle(filled, tmp_path / "a")
    export_bundle(filled, tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert members(tmp_path / "a")[0][0] == "index.json"


# -- entries that do not belong to their key or to this host ---------------------------------


def test_swapped_action_keys_are_refused(good, tmp_path):
    """Issue 10: two keys swapped in index.json imported cleanly, and the daemon served
    kernel Y to a client asking for X."""
    def swap(index):
        a, b = index["entries"][0], index["entries"][1]
        a["key"], b["key"] = b["key"], a["key"]

    bad = rewrite_index(good, tmp_path / "swapped", swap)
    first = json.loads(members(good)[0][1])["entries"][1]["key"]
    message = refused(bad, "action record hashes to")
    assert f"entry {first}" in message and "not to the key it is filed under" in message


def test_an_entry_whose_manifest_names_a_missing_blob_is_refused(filled, tmp_path):
    """Issue 10: such an entry was accepted, and broke its key for good."""
    e = cuda_entry(7)
    stray = b"some other blob"
    items = [("index.json", json.dumps({"format": "tiled-bundle", "version": 2, "entries": [
        {"key": e.key, "target": "cuda:sm_90a", "manifest": sha256_hex(e.manifest),
         "blobs": {sha256_hex(stray): len(stray)}}]}).encode()),
             (f"manifests/{sha256_hex(e.manifest)}", e.manifest),
             (f"blobs/{sha256_hex(stray)}", stray)]
    bad = write_tar(tmp_path / "bad", items)
    assert f"entry {e.key}" in refused(bad, "manifest names blob .* which the entry lacks")


def test_an_index_naming_a_member_the_bundle_lacks_is_refused(good, tmp_path):
    bad = rewrite_index(good, tmp_path / "bad",
                        lambda idx: idx["entries"][0]["blobs"].update({"f" * 64: 3}))
    refused(bad, f"names blobs/{'f' * 64}, which the bundle lacks")


def test_a_different_toolchain_or_namespace_is_refused(good):
    other = lambda target, options: sha256_hex(b"other compiler " + target.encode())  # noqa: E731
    with pytest.raises(BundleError, match=r"built by a different toolchain for (cpu|cuda:sm_90a)"):
        import_bundle(DictTier(), good, other)
    with pytest.raises(BundleError, match="cache namespace '', this host uses 'blue'"):
        import_bundle(DictTier(), good, toolchain_of, namespace="blue")

    def cannot(target, options):
        raise ValueError(f"unknown compile option for {target}")

    with pytest.raises(BundleError, match="this host does not compile for"):
        import_bundle(DictTier(), good, cannot)


def test_a_manifest_without_an_action_record_says_rebuild(tmp_path):
    old = entry_for("old", [b"old kernel"], action=False)
    (digest, data), = old.blobs.items()
    items = [("index.json", json.dumps({"format": "tiled-bundle", "version": 1,
                                        "toolchains": {"cpu": "0" * 64}, "entries": [
        {"key": old.key, "target": "cpu", "manifest": sha256_hex(old.manifest),
         "blobs": {digest: len(data)}}]}).encode()),
             (f"manifests/{sha256_hex(old.manifest)}", old.manifest), (f"blobs/{digest}", data)]
    refused(write_tar(tmp_path / "old", items), "no action record .* rebuild the bundle")


def test_manifests_that_are_not_manifests_are_refused(tmp_path):
    artifact = b"kernel"
    for i, manifest in enumerate([b"not json", b"[" * 100_000, b'{"name": "k"}',
                                  b'{"params": [{"kind": []}]}']):
        key = sha256_hex(f"k{i}".encode())
        items = [("index.json", json.dumps({"format": "tiled-bundle", "version": 2, "entries": [
            {"key": key, "target": "cpu", "manifest": sha256_hex(manifest),
             "blobs": {sha256_hex(artifact): len(artifact)}}]}).encode()),
                 (f"manifests/{sha256_hex(manifest)}", manifest),
                 (f"blobs/{sha256_hex(artifact)}", artifact)]
        assert f"entry {key}: manifest" in refused(write_tar(tmp_path / f"m{i}", items), None)


# -- hostile indexes and members --------------------------------------------------------------


@pytest.mark.parametrize("index, match", [
    (b"not json at all", "index.json is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"format": "tiled-bundle", "format": "x", "version": 2, "entries": []}',
     "duplicate key 'format'"),
    (b'{"format": "tar", "version": 2, "entries": []}', "is not tiled-bundle"),
    (b'{"format": "tiled-bundle", "version": true, "entries": []}', "version True is not"),
    (b'{"format": "tiled-bundle", "version": 2, "entries": [7]}', "entry 0 is not an object"),
])
def test_malformed_indexes_are_refused_without_a_traceback(tmp_path, index, match):
    refused(write_tar(tmp_path / "bad", [("index.json", index)]), match)


def test_an_index_declaring_huge_or_bogus_sizes_is_refused(good, tmp_path):
    def size(value):
        def mutate(idx):
            blobs = idx["entries"][0]["blobs"]
            blobs[next(iter(blobs))] = value
        return mutate

    refused(rewrite_index(good, tmp_path / "huge", size(10 ** 30)),
            "more than the whole .*-byte bundle")
    refused(rewrite_index(good, tmp_path / "neg", size(-1)), "expected a sha256 .* size >= 0")
    refused(rewrite_index(good, tmp_path / "str", size("12")), "expected a sha256")
    refused(rewrite_index(good, tmp_path / "off", size(999)), "index.json declares 999")

    def twice(idx):
        idx["entries"].append(dict(idx["entries"][0]))

    refused(rewrite_index(good, tmp_path / "twice", twice), "lists entry .* twice")


def test_a_second_index_is_refused_not_silently_preferred(good, tmp_path):
    """Issue 10: with two index.json members, the last one silently won."""
    items = members(good)
    other = json.loads(items[0][1])
    other["entries"] = other["entries"][:1]
    bad = write_tar(tmp_path / "two", [*items, ("index.json", json.dumps(other).encode())])
    refused(bad, "a second index.json")


def test_duplicate_unexpected_and_misplaced_members_are_refused(good, tmp_path):
    items = members(good)
    refused(write_tar(tmp_path / "dup", [*items, items[-1]]), "appears twice")
    refused(write_tar(tmp_path / "extra", [*items, ("etc/passwd", b"root")]),
            "unexpected member 'etc/passwd'")
    stray = b"not named by any entry"
    refused(write_tar(tmp_path / "stray", [*items, (f"blobs/{sha256_hex(stray)}", stray)]),
            "no entry of index.json names it")
    refused(write_tar(tmp_path / "late", [*items[1:], items[0]]), "first member is .*, not index")
    with tarfile.open(tmp_path / "link", "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("index.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    refused(tmp_path / "link", "regular files only")
    with tarfile.open(tmp_path / "pax", "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("index.json")
        info.pax_headers = {"comment": "x" * 1000}
        tar.addfile(info, io.BytesIO(b""))
    refused(tmp_path / "pax", "regular files only")


def test_a_member_declaring_a_huge_size_is_refused_before_reading(good, tmp_path):
    items = members(good)
    name, data = items[-1]
    header = tarfile.TarInfo(name)
    header.size = (8 << 30) - 1  # 8 GiB (the most ustar holds) in a bundle of a few KB
    with open(tmp_path / "huge", "wb") as f:
        f.write(b"".join(_ustar(n, d) for n, d in items[:-1]))
        f.write(header.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512))
        f.write(bytes(1024))
    refused(tmp_path / "huge", f"member '{name}' declares {(8 << 30) - 1} bytes, past the end")


def _ustar(name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def test_an_oversized_manifest_member_is_refused_before_reading(good, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "MAX_MANIFEST_BYTES", 100)
    refused(good, "over the 100-byte manifest limit")
    monkeypatch.setattr(bundle, "MAX_INDEX_BYTES", 100)
    refused(good, "index.json is .* bytes, over the 100-byte limit")


def test_corrupt_garbage_and_truncated_files_are_refused(good, tmp_path):
    items = members(good)
    name, data = items[-1]
    refused(write_tar(tmp_path / "flip", [*items[:-1], (name, bytes([data[0] ^ 1]) + data[1:])]),
            "does not match its sha256")
    (tmp_path / "junk").write_bytes(b"not a tar at all" * 100)
    refused(tmp_path / "junk", "no valid tar header at byte 0")
    raw = good.read_bytes()
    (tmp_path / "trunc").write_bytes(raw[: len(raw) // 2])
    refused(tmp_path / "trunc", None)
    (tmp_path / "empty").write_bytes(b"")
    refused(tmp_path / "empty", "truncated")
    refused(tmp_path / "missing", "cannot read the bundle")


def test_a_failed_put_midway_removes_what_the_import_added(good):
    class FailsThird(DictTier):
        def put(self, entry):
            if len(self.entries) == 2:
                raise CacheWriteError("disk full")
            super().put(entry)

    tier = FailsThird()
    message = refused(good, "storing entry .* failed", tier)
    assert "the 2 entries this import had added were removed" in message


# -- bounded memory ---------------------------------------------------------------------------

_MEASURE = textwrap.dedent("""
    import resource, sys, tracemalloc
    from pathlib import Path
    from tests.cache.conftest import toolchain_of
    from tiled.cache.bundle import import_bundle
    from tiled.cache.disk import DiskTier
    tier = DiskTier(Path(sys.argv[2]))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    report = import_bundle(tier, Path(sys.argv[1]), toolchain_of)
    peak = tracemalloc.get_traced_memory()[1]
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(report.nbytes, peak, grew * 1024)
""")


def test_a_large_blob_is_streamed_not_held(tmp_path):
    """Issue 10: a 300 MB blob was held whole in memory. Import a bundle with a 64 MiB blob in
    a fresh process: Python's peak allocation and the RSS growth stay far below the blob."""
    size = 64 << 20
    blob = os.urandom(1 << 20) * 64  # 64 MiB, cheap to make; its digest is what counts
    e = entry_for("big", [blob])
    path = tmp_path / "big.tiled"
    export_bundle(_holding(e), path)
    del blob, e
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    nbytes, peak, grew = map(int, out.stdout.split())
    assert nbytes > size
    assert peak < 8 << 20, f"import allocated {peak} bytes at its peak for a {size}-byte blob"
    assert grew < 32 << 20, f"import grew RSS by {grew} bytes for a {size}-byte blob"


def _holding(entry):
    tier = DictTier()
    tier.put(entry)
    return tier


def test_put_files_verifies_what_it_copies(tmp_path):
    e = make_entry(1, size=5000)
    (digest, data), = e.blobs.items()
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100 + data[:-1] + b"!")  # one byte differs from the blob's name
    tier = DiskTier(tmp_path / "cache")
    from tiled.cache.entry import BlobFile

    with pytest.raises(CacheWriteError, match="does not hash to its name"):
        tier.put_files(e.key, e.manifest, {digest: BlobFile(src, 100, len(data))})
    with pytest.raises(CacheWriteError, match="ends 1 bytes short"):
        tier.put_files(e.key, e.manifest, {digest: BlobFile(src, 101, len(data))})
    assert tier.keys() == [] and os.listdir(tmp_path / "cache" / "v1" / "staging") == []
    src.write_bytes(b"x" * 100 + data)
    tier.put_files(e.key, e.manifest, {digest: BlobFile(src, 100, len(data))})
    assert tier.get(e.key) == Entry(e.key, e.manifest, {digest: data})
