"""Cache lookup latency: a hit of a 100 KiB artifact in each tier (memory, disk, Redis), p50 and
p99, and how a disk hit's cost changes as the cache grows from 1,000 to 100,000 entries.

    python benchmarks/cache_lookup.py --out benchmarks/results/cache_lookup.json

Needs redis-server on PATH for the Redis row (started here on a free port, stopped after).
Goal (issue #3): disk hit under 1 ms p50, flat from 1,000 to 100,000 entries.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tiled.cache.disk import DiskTier
from tiled.cache.entry import Entry, sha256_hex
from tiled.cache.keys import action_record, key_of_record
from tiled.cache.memory import MemoryTier

ARTIFACT = 100 * 1024


def entry(i: int, size: int = ARTIFACT) -> Entry:
    """A cpu entry of `size` bytes whose manifest carries its action record (tiers refuse an
    entry whose manifest does not check out)."""
    blob = os.urandom(size - 8) + i.to_bytes(8, "little")
    record = action_record(sha256_hex(f"bench-{i}".encode()),
                           {"backend": "cpu", "arch": "x86-64"}, {}, "0" * 64)
    manifest = json.dumps({
        "manifest_version": 1, "name": "bench", "program_digest": record["program"],
        "target": "cpu", "backend": "cpu", "arch": "x86-64", "artifact_format": "so",
        "artifact_sha256": sha256_hex(blob), "symbol": "bench",
        "params": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": ["n"]}],
        "action": record}).encode()
    return Entry(key_of_record(record), manifest, {sha256_hex(blob): blob})


def percentiles(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"p50_us": statistics.median(s) * 1e6, "p99_us": s[int(0.99 * (len(s) - 1))] * 1e6,
            "n": len(s)}


def time_hits(tier, keys: list[str], rounds: int) -> dict:
    samples = []
    for _ in range(rounds):
        for k in keys:
            t0 = time.perf_counter()
            got = tier.get(k)
            samples.append(time.perf_counter() - t0)
            assert got is not None, (tier.name, k)
    return percentiles(samples)


def redis_row(entries: list[Entry]) -> dict | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    from tiled.cache.redis_tier import RedisTier

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp()
    proc = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL)
    try:
        tier = RedisTier(f"redis://127.0.0.1:{port}/0", ttl_seconds=3600,
                         max_blob_bytes=16 << 20, timeout_seconds=1.0)
        for _ in range(100):
            try:
                tier.put(entries[0])
                if tier.get(entries[0].key):
                    break
            except Exception:
                pass
            time.sleep(0.05)
        for e in entries:
            tier.put(e)
        return time_hits(tier, [e.key for e in entries], rounds=20)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def scaling(root: Path, sizes: list[int], probe: int) -> list[dict]:
    """Grows one disk cache to each size (small 1 KiB fillers, so the run fits the machine)
    and times hits of `probe` 100 KiB entries at each size."""
    tier = DiskTier(root, max_bytes=64 << 30)
    probes = [entry(10_000_000 + i) for i in range(probe)]
    for e in probes:
        tier.put(e)
    rows, have = [], 0
    for n in sizes:
        t0 = time.perf_counter()
        while have < n:
            tier.put(entry(have, size=1024))
            have += 1
        fill_s = time.perf_counter() - t0
        row = {"entries": n + probe, **time_hits(tier, [e.key for e in probes], rounds=20),
               "fill_seconds": round(fill_s, 1)}
        print(f"disk @ {n + probe:>7} entries: p50 {row['p50_us']:.0f} us  "
              f"p99 {row['p99_us']:.0f} us", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--dir", help="where the disk cache is built (default: a temp dir)")
    p.add_argument("--sizes", default="1000,10000,100000")
    args = p.parse_args()
    entries = [entry(i) for i in range(200)]
    results: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "artifact_bytes": ARTIFACT,
        "hits": {},
    }
    mem = MemoryTier(1 << 30)
    for e in entries:
        mem.put(e)
    results["hits"]["memory"] = time_hits(mem, [e.key for e in entries], rounds=50)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tiled-bench-"))
    try:
        disk = DiskTier(base / "hits", max_bytes=8 << 30)
        for e in entries:
            disk.put(e)
        results["hits"]["disk"] = time_hits(disk, [e.key for e in entries], rounds=20)
        row = redis_row(entries)
        if row is not None:
            results["hits"]["redis"] = row
        for tier, r in results["hits"].items():
            print(f"{tier:7s} hit of {ARTIFACT // 1024} KiB: p50 {r['p50_us']:.0f} us  "
                  f"p99 {r['p99_us']:.0f} us", flush=True)
        sizes = [int(x) for x in args.sizes.split(",")]
        results["disk_scaling"] = scaling(base / "scaling", sizes, probe=50)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
