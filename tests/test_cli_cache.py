"""`tiled cache ...` and cached compiles, end to end through the real CLI in subprocesses."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cache_dir, check=True):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "tiled.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=check)


def test_compile_is_cached_and_cache_commands_work(tmp_path):
    cache = tmp_path / "cache"
    out1 = cli("compile", "examples/elementwise.py:add", "--out", str(tmp_path / "a"),
               cache_dir=cache)
    out2 = cli("compile", "examples/elementwise.py:add", "--out", str(tmp_path / "b"),
               cache_dir=cache)
    assert "cache miss" in out1.stdout and "cache hit" in out2.stdout
    assert (tmp_path / "a" / "vadd.so").read_bytes() == (tmp_path / "b" / "vadd.so").read_bytes()

    stats = json.loads(cli("cache", "stats", "--json", cache_dir=cache).stdout)
    assert stats["entries"] == 1 and stats["bytes"] > 0
    assert cli("cache", "verify", cache_dir=cache).returncode == 0

    bundle = tmp_path / "deploy.tiled"
    cli("cache", "export", str(bundle), "--target", "cpu", cache_dir=cache)
    fresh = tmp_path / "fresh"
    out = cli("cache", "import", str(bundle), cache_dir=fresh)
    assert "imported 1 entries" in out.stdout
    out3 = cli("compile", "examples/elementwise.py:add", "--out", str(tmp_path / "c"),
               cache_dir=fresh)
    assert "cache hit" in out3.stdout  # warmed by the bundle: no compile

    # Corrupt the artifact blob: verify names the entry and fails; the next compile recompiles.
    blobs = [p for p in (cache).rglob("*") if p.is_file() and
             p.stat().st_size == (tmp_path / "a" / "vadd.so").stat().st_size]
    assert blobs, "artifact blob not found in the cache directory"
    data = bytearray(blobs[0].read_bytes())
    data[100] ^= 0xFF
    blobs[0].write_bytes(bytes(data))
    bad = cli("cache", "verify", cache_dir=cache, check=False)
    assert bad.returncode == 1 and "problem" in bad.stderr
    out4 = cli("compile", "examples/elementwise.py:add", "--out", str(tmp_path / "d"),
               cache_dir=cache)
    assert "cache miss" in out4.stdout
    assert (tmp_path / "d" / "vadd.so").read_bytes() == (tmp_path / "a" / "vadd.so").read_bytes()

    assert cli("cache", "clear", cache_dir=cache, check=False).returncode == 2
    cli("cache", "clear", "--yes", cache_dir=cache)
    assert json.loads(cli("cache", "stats", "--json", cache_dir=cache).stdout)["entries"] == 0


def _damaged_cache(root):
    """A disk cache with one good entry and two broken ones (a manifest that is not JSON; one
    naming a blob the entry lacks), written as a writer that checked nothing would have."""
    from tests.cache.conftest import make_entry
    from tiled.cache.disk import DiskTier
    from tiled.cache.disk_layout import encode_record

    tier = DiskTier(root)
    good, notjson, noblob = (make_entry(i) for i in range(3))
    for e in (good, notjson, noblob):
        tier.put(e)
    for e, manifest, sizes in [(notjson, b"{not json", {d: len(b) for d, b in e.blobs.items()}),
                               (noblob, noblob.manifest, {})]:
        (root / "v1" / "ac" / e.key[:2] / e.key / "record").write_bytes(
            encode_record(e.key, manifest, sizes))
    return good, notjson, noblob


def test_verify_reports_and_repair_removes_broken_entries(tmp_path):
    cache = tmp_path / "cache"
    good, notjson, noblob = _damaged_cache(cache)
    found = cli("cache", "verify", cache_dir=cache, check=False)
    assert found.returncode == 1, found
    assert f"{notjson.key}" in found.stdout and "not valid JSON" in found.stdout
    assert f"{noblob.key}" in found.stdout and "which the entry lacks" in found.stdout
    assert good.key not in found.stdout and "2 problem(s), 0 removed" in found.stderr
    fixed = cli("cache", "verify", "--repair", cache_dir=cache, check=False)
    assert fixed.returncode == 0, fixed
    assert fixed.stdout.count("[removed]") == 2 and "2 problem(s), 2 removed" in fixed.stderr
    clean = cli("cache", "verify", cache_dir=cache, check=False)
    assert clean.returncode == 0 and clean.stdout == ""
    assert json.loads(cli("cache", "stats", "--json", cache_dir=cache).stdout)["entries"] == 1


def test_import_refuses_a_bundle_with_swapped_keys(tmp_path):
    """Issue 10: swapped keys imported cleanly and the daemon then served kernel Y for X."""
    from tests.cache.test_bundle import members, write_tar
    from tests.cache.test_disk import make
    from tiled.cache.bundle import export_bundle
    from tiled.cache.disk import DiskTier

    source = DiskTier(tmp_path / "source")
    for name in ("x", "y"):
        source.put(make(name))
    export_bundle(source, tmp_path / "good.tiled")
    items = members(tmp_path / "good.tiled")
    index = json.loads(items[0][1])
    a, b = index["entries"]
    a["key"], b["key"] = b["key"], a["key"]
    write_tar(tmp_path / "swapped.tiled",
              [("index.json", json.dumps(index).encode()), *items[1:]])
    out = cli("cache", "import", str(tmp_path / "swapped.tiled"), cache_dir=tmp_path / "cache",
              check=False)
    assert out.returncode == 1, out
    assert "refused" in out.stderr and "action record hashes to" in out.stderr
    assert "nothing was imported" in out.stderr and "Traceback" not in out.stderr
    stats = json.loads(cli("cache", "stats", "--json", cache_dir=tmp_path / "cache").stdout)
    assert stats["entries"] == 0
