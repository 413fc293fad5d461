"""Bundles: export a set of entries to one file; import verifies everything or refuses."""

import json
import tarfile

import pytest

from tests.cache.fakes import DictTier
from tiled.cache.bundle import export_bundle, import_bundle, read_bundle
from tiled.cache.entry import Entry, sha256_hex
from tiled.errors import BundleError


def make_entry(i, target="cuda:sm_90a"):
    artifact = f"artifact-{i}".encode() * 100
    manifest = json.dumps({"target": target, "artifact_sha256": sha256_hex(artifact),
                           "i": i}).encode()
    return Entry(sha256_hex(f"key{i}".encode()), manifest, {sha256_hex(artifact): artifact})


def toolchains(target):
    return sha256_hex(f"toolchain for {target}".encode())


@pytest.fixture
def filled():
    tier = DictTier()
    for i in range(5):
        tier.put(make_entry(i))
    tier.put(make_entry(99, target="cpu"))
    return tier


def test_round_trip_all_entries(filled, tmp_path):
    path = tmp_path / "deploy.tiled"
    report = export_bundle(filled, path, toolchains)
    assert report.entries == 6 and set(report.targets) == {"cpu", "cuda:sm_90a"}
    fresh = DictTier()
    imported = import_bundle(fresh, path, toolchains)
    assert imported.entries == 6
    assert fresh.entries == filled.entries


def test_export_by_target_and_by_keys(filled, tmp_path):
    export_bundle(filled, tmp_path / "gpu.tiled", toolchains, target="cuda:sm_90a")
    _, entries = read_bundle(tmp_path / "gpu.tiled")
    assert len(entries) == 5
    key = make_entry(2).key
    export_bundle(filled, tmp_path / "one.tiled", toolchains, keys=[key])
    _, entries = read_bundle(tmp_path / "one.tiled")
    assert [e.key for e in entries] == [key]
    with pytest.raises(BundleError, match="not in the cache"):
        export_bundle(filled, tmp_path / "x.tiled", toolchains, keys=["0" * 64])


def test_export_is_deterministic(filled, tmp_path):
    export_bundle(filled, tmp_path / "a", toolchains)
    export_bundle(filled, tmp_path / "b", toolchains)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_mismatched_toolchain_is_refused_whole(filled, tmp_path):
    path = tmp_path / "deploy.tiled"
    export_bundle(filled, path, toolchains)
    fresh = DictTier()
    other = lambda t: sha256_hex(b"other compiler" + t.encode())  # noqa: E731
    with pytest.raises(BundleError, match="different toolchain for"):
        import_bundle(fresh, path, other)
    assert fresh.entries == {}


def _rewrite_member(src, dst, name, mutate):
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin:
            data = tin.extractfile(m).read()
            if m.name.startswith(name):
                data = mutate(data)
                m.size = len(data)
            import io
            tout.addfile(m, io.BytesIO(data))


def test_corrupt_blob_is_refused(filled, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    export_bundle(filled, good, toolchains)
    _rewrite_member(good, bad, "blobs/", lambda d: bytes([d[0] ^ 1]) + d[1:])
    fresh = DictTier()
    with pytest.raises(BundleError, match="does not match its sha256"):
        import_bundle(fresh, bad, toolchains)
    assert fresh.entries == {}


def test_garbage_and_truncated_files_are_refused(filled, tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(BundleError):
        read_bundle(junk)
    good = tmp_path / "good"
    export_bundle(filled, good, toolchains)
    trunc = tmp_path / "trunc"
    trunc.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(BundleError):
        import_bundle(DictTier(), trunc, toolchains)


def test_index_naming_a_missing_blob_is_refused(filled, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    export_bundle(filled, good, toolchains)

    def drop_blob(data):
        idx = json.loads(data)
        idx["entries"][0]["blobs"]["f" * 64] = 3
        return json.dumps(idx).encode()

    _rewrite_member(good, bad, "index.json", drop_blob)
    with pytest.raises(BundleError, match="missing or resized blob"):
        read_bundle(bad)
