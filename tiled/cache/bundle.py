"""Bundles: a deployment's kernels in one file, for warming caches at deploy time.

A bundle is an uncompressed tar file:

    index.json          {"format": "tiled-bundle", "version": 1,
                         "toolchains": {target: digest},
                         "entries": [{"key", "target", "manifest": sha256,
                                      "blobs": {sha256: size}}]}
    manifests/<sha256>  manifest bytes (JSON), named by their sha256
    blobs/<sha256>      artifacts, named by their sha256

Export writes the index first, so a reader can refuse a bundle before reading its blobs.
Import verifies every digest and that each target's toolchain digest equals this host's (a
kernel built by another compiler must not be served under this compiler's keys), then puts the
entries into a tier. A bundle that fails any check is refused whole, with a message naming the
problem; nothing is imported from it.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tiled.cache.entry import Entry, Tier, is_digest, sha256_hex
from tiled.errors import BundleError

FORMAT, VERSION = "tiled-bundle", 1
MAX_INDEX_BYTES = 64 << 20


@dataclass
class BundleReport:
    entries: int
    nbytes: int
    targets: dict[str, str]


def _target_of(manifest: bytes) -> str:
    try:
        return str(json.loads(manifest)["target"])
    except (ValueError, KeyError, TypeError):
        raise BundleError("an entry's manifest is not JSON with a 'target'") from None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # deterministic bundles: same entries, same bytes
    tar.addfile(info, io.BytesIO(data))


def export_bundle(tier: Tier, path: Path, toolchain_digest: Callable[[str], str],
                  keys: Iterable[str] | None = None, target: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> BundleReport:
    """Writes the entries named by `keys` (default: every key in the tier), restricted to
    `target` when given, to `path`. A key that is missing or corrupt in the tier raises
    BundleError naming it (a deployment bundle must be complete). The file appears atomically."""
    wanted = sorted(keys) if keys is not None else sorted(tier.keys())
    entries: list[tuple[Entry, str]] = []
    for n, key in enumerate(wanted):
        entry = tier.get(key)
        if entry is None:
            if keys is not None:
                raise BundleError(f"entry {key} is not in the cache (or did not verify)")
            continue
        t = _target_of(entry.manifest)
        if target is None or t == target:
            entries.append((entry, t))
        if progress:
            progress(n + 1, len(wanted))
    targets = sorted({t for _, t in entries})
    toolchains = {t: toolchain_digest(t) for t in targets}
    index = {"format": FORMAT, "version": VERSION, "toolchains": toolchains, "entries": [
        {"key": e.key, "target": t, "manifest": sha256_hex(e.manifest),
         "blobs": {d: len(b) for d, b in sorted(e.blobs.items())}} for e, t in entries]}
    tmp = path.with_name(path.name + ".partial")
    nbytes = 0
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "index.json", json.dumps(index, sort_keys=True, indent=1).encode())
        seen: set[str] = set()
        for e, _ in entries:
            m = sha256_hex(e.manifest)
            if m not in seen:
                seen.add(m)
                _add(tar, f"manifests/{m}", e.manifest)
                nbytes += len(e.manifest)
            for d, b in sorted(e.blobs.items()):
                if d not in seen:
                    seen.add(d)
                    _add(tar, f"blobs/{d}", b)
                    nbytes += len(b)
    tmp.replace(path)
    return BundleReport(len(entries), nbytes, toolchains)


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    if f is None:
        raise BundleError(f"{member.name} is not a regular file")
    return f.read()


def _read_members(path: Path) -> tuple[bytes | None, dict[str, bytes]]:
    members: dict[str, bytes] = {}
    index = None
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            if not m.isfile():
                raise BundleError(f"{path}: unexpected member {m.name!r}")
            if m.name == "index.json":
                if m.size > MAX_INDEX_BYTES:
                    raise BundleError(f"{path}: index is {m.size} bytes, over the limit")
                index = _member_bytes(tar, m)
                continue
            kind, _, digest = m.name.partition("/")
            if kind not in ("manifests", "blobs") or not is_digest(digest):
                raise BundleError(f"{path}: unexpected member {m.name!r}")
            data = _member_bytes(tar, m)
            if len(data) != m.size:
                raise BundleError(f"{path}: {m.name} is truncated")
            if sha256_hex(data) != digest:
                raise BundleError(f"{path}: {m.name} does not match its sha256 (corrupt bundle)")
            members[digest] = data
    return index, members


def read_bundle(path: Path) -> tuple[dict, list[Entry]]:
    """Reads and verifies a bundle: every member's name is the sha256 of its bytes, every entry
    names members that exist. Raises BundleError naming the first problem."""
    try:
        index, members = _read_members(path)
    except (OSError, EOFError, tarfile.TarError) as e:
        raise BundleError(f"{path}: not a readable tiled bundle ({e})") from None
    if index is None:
        raise BundleError(f"{path}: no index.json")
    try:
        idx = json.loads(index)
        if idx.get("format") != FORMAT or idx.get("version") != VERSION:
            raise BundleError(f"{path}: format {idx.get('format')!r} version "
                              f"{idx.get('version')!r} is not {FORMAT} v{VERSION}")
        entries = []
        for rec in idx["entries"]:
            if rec["manifest"] not in members:
                raise BundleError(f"{path}: entry {rec['key']} names a missing manifest")
            blobs = {}
            for d, size in rec["blobs"].items():
                if d not in members or len(members[d]) != size:
                    raise BundleError(f"{path}: entry {rec['key']} names a missing or "
                                      f"resized blob {d}")
                blobs[d] = members[d]
            entry = Entry(rec["key"], members[rec["manifest"]], blobs)
            try:
                entry.validate()
            except ValueError as e:
                raise BundleError(f"{path}: entry {rec['key']}: {e}") from None
            if _target_of(entry.manifest) != rec["target"]:
                raise BundleError(f"{path}: entry {rec['key']} target does not match its "
                                  "manifest")
            entries.append(entry)
    except (KeyError, TypeError, AttributeError) as e:
        raise BundleError(f"{path}: malformed index.json ({e!r})") from None
    return idx, entries


def import_bundle(tier: Tier, path: Path, toolchain_digest: Callable[[str], str],
                  progress: Callable[[int, int], None] | None = None) -> BundleReport:
    """Verifies the whole bundle, checks that each target's toolchain digest equals this
    host's, then puts every entry. Nothing is imported from a bundle that fails a check."""
    idx, entries = read_bundle(path)
    for target, digest in sorted(idx.get("toolchains", {}).items()):
        mine = toolchain_digest(target)
        if mine != digest:
            raise BundleError(
                f"{path}: built by a different toolchain for {target} (bundle {digest[:12]}, "
                f"this host {mine[:12]}); rebuild the bundle with this host's tiled / TVM / "
                "nvcc, or import it on a matching host")
    missing = {e["target"] for e in idx["entries"]} - set(idx.get("toolchains", {}))
    if missing:
        raise BundleError(f"{path}: no toolchain digest recorded for {sorted(missing)}")
    nbytes = 0
    for n, entry in enumerate(entries):
        tier.put(entry)
        nbytes += entry.nbytes
        if progress:
            progress(n + 1, len(entries))
    return BundleReport(len(entries), nbytes, dict(idx.get("toolchains", {})))
