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
