"""Bundles: a deployment's kernels in one file, for warming caches at deploy time.

A bundle is an uncompressed ustar file, the same bytes for the same entries:

    index.json          {"format": "tiled-bundle", "version": 2,
                         "toolchains": {target: [digest, ...]},    (for people; not trusted)
                         "entries": [{"key", "target", "manifest": sha256,
                                      "blobs": {sha256: size}}]}
    manifests/<sha256>  manifest bytes (JSON), named by their sha256
    blobs/<sha256>      artifacts, named by their sha256

An import believes nothing the bundle says. `read_bundle` walks the tar headers itself, one
512-byte block at a time, and judges each member by its header before reading a byte of it:
exactly one index.json, first, at most MAX_INDEX_BYTES, of the schema above (no duplicate JSON
keys, no key listed twice); then only manifests/<d> and blobs/<d> members that an entry names,
each once, of the size the index declares (a manifest at most MAX_MANIFEST_BYTES), inside the
file, whose bytes hash to d (streamed: memory stays bounded); no links, directories or pax and
GNU extension headers. Every member an entry names must be there.

`import_bundle` then checks each entry against its manifest and this host (`check_entry`): the
manifest parses and names only blobs the entry lists; its action record (the record whose
digest is the key, tiled.cache.keys) hashes to the entry's key, names the manifest's program
and target, the toolchain digest this host has for that target and those options, and this
host's cache namespace. A manifest without an action record (written by a tiled whose
manifests did not carry one) cannot be checked: the bundle must be rebuilt. Only when every
entry passes are they put, each blob streamed from the bundle into the tier (DiskTier.put_files,
which hashes it again as it copies; other tiers get one entry's bytes at a time). A bundle that
fails any check is refused whole: BundleError names the entry and the problem, and nothing is
imported (a put that fails midway removes the entries this import had added). Operator's view:
docs/cache.md.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tiled import config
from tiled.cache.entry import (
    BlobFile,
    Entry,
    Tier,
    check_manifest,
    is_digest,
    load_manifest,
    sha256_hex,
)
from tiled.errors import BundleError, CacheError, TiledError

if TYPE_CHECKING:
    from tiled.runtime.manifest import Manifest

FORMAT, VERSION = "tiled-bundle", 2
READS = (1, 2)  # version 1 differs only in "toolchains" ({target: digest}), which is not read
MAX_INDEX_BYTES = 16 << 20  # about 60,000 entries
MAX_MANIFEST_BYTES = 4 << 20
INDEX = "index.json"
_BLOCK = 512
_INDEX_FIELDS = {"format", "version", "toolchains", "entries"}
_ENTRY_FIELDS = {"key", "target", "manifest", "blobs"}

ToolchainDigest = Callable[[str, Mapping[str, Any]], str]
"""(target "backend:arch", compile options) -> this host's toolchain digest for compiling with
them (tiled.compiler.toolchain.digest); raises TiledError or ValueError for a target or options
this host does not compile. Passed in, so this module never imports the compiler."""


@dataclass
class BundleReport:
    entries: int  # exported; or imported, counting those the tier held already
    nbytes: int  # manifest and blob bytes of those entries
    targets: dict[str, int]  # target -> entries
    added: int = 0  # import: entries the tier did not hold before


@dataclass(frozen=True)
class BundleEntry:
    """One index entry whose members are present and hash to their names (read_bundle)."""

    key: str
    target: str
    manifest_digest: str
    manifest: BlobFile
    blobs: dict[str, BlobFile]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- export ---------------------------------------------------------------------------------


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o444  # deterministic bytes
    tar.addfile(info, io.BytesIO(data))


def _exportable(tier: Tier, key: str) -> tuple[Entry | None, str]:
    """(the entry, "") or (None, why it cannot go into a bundle)."""
    entry = tier.get(key)
    if entry is None:
        return None, "is not in the cache (or did not verify)"
    try:
        if load_manifest(entry.manifest).action is None:
            return None, "has no action record (compiled by an older tiled): recompile it"
    except ValueError as e:
        return None, f"does not verify: {e}"
    return entry, ""


def export_bundle(tier: Tier, path: Path, keys: Iterable[str] | None = None,
                  target: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> BundleReport:
    """Writes the entries named by `keys` (default: every key in the tier), restricted to
    `target` when given, to `path`; the file appears atomically. A named key that is missing,
    corrupt or has no action record raises BundleError naming it (a deployment bundle must be
    complete and importable); without `keys` such entries are left out. Memory holds one
    entry's blobs at a time: the tier is read twice, for the index, then for the blobs."""
    chosen: list[tuple[str, Manifest, bytes, dict[str, int]]] = []
    for key in sorted(set(keys)) if keys is not None else sorted(tier.keys()):
        entry, problem = _exportable(tier, key)
        if entry is None:
            if keys is not None:
                raise BundleError(f"entry {key} {problem}")
            continue
        m = load_manifest(entry.manifest)
        if target is None or m.target == target:
            chosen.append((key, m, entry.manifest, {d: len(b) for d, b in entry.blobs.items()}))
    toolchains: dict[str, set[str]] = {}
    targets: dict[str, int] = {}
    for _, m, _, _ in chosen:
        toolchains.setdefault(m.target, set()).add((m.action or {})["toolchain"])
        targets[m.target] = targets.get(m.target, 0) + 1
    index = {"format": FORMAT, "version": VERSION,
             "toolchains": {t: sorted(d) for t, d in sorted(toolchains.items())},
             "entries": [{"key": k, "target": m.target, "manifest": sha256_hex(mf),
                          "blobs": dict(sorted(sizes.items()))} for k, m, mf, sizes in chosen]}
    tmp = path.with_name(path.name + ".partial")
    nbytes = 0
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            _member(tar, INDEX, json.dumps(index, sort_keys=True, indent=1).encode())
            seen: set[str] = set()
            for n, (key, _, manifest, sizes) in enumerate(chosen):
                entry = tier.get(key)
                if entry is None or entry.manifest != manifest:
                    raise BundleError(f"entry {key} changed or went while it was exported")
                nbytes += len(manifest) + sum(sizes.values())
                members = [(f"manifests/{sha256_hex(manifest)}", manifest)]
                members += [(f"blobs/{d}", entry.blobs[d]) for d in sorted(sizes)]
                for name, data in members:
                    if name not in seen:
                        seen.add(name)
                        _member(tar, name, data)
                if progress:
                    progress(n + 1, len(chosen))
        tmp.replace(path)
    except ValueError as e:  # a member over ustar's 8 GiB
        raise BundleError(f"{path}: cannot write the bundle ({e})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return BundleReport(len(chosen), nbytes, targets)


# -- reading --------------------------------------------------------------------------------


def _headers(f: IO[bytes], size: int, path: Path) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, data size) of each member, checked from its header alone."""
    offset = 0
    while True:
        if offset + _BLOCK > size:
            raise BundleError(f"{path}: truncated: no end-of-archive block after byte {offset}")
        f.seek(offset)
        block = f.read(_BLOCK)
        if block == bytes(_BLOCK):
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except (tarfile.HeaderError, ValueError) as e:
            raise BundleError(f"{path}: not a tiled bundle: no valid tar header at byte "
                              f"{offset} ({e})") from None
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise BundleError(f"{path}: unexpected member {_short(info.name)} of tar type "
                              f"{_short(info.type)}: a bundle holds regular files only")
        data = offset + _BLOCK
        if not 0 <= info.size <= size - data:
            raise BundleError(f"{path}: member {_short(info.name)} declares {info.size} bytes, "
                              f"past the end of the {size}-byte file (truncated or forged)")
        yield info.name, data, info.size
        offset = data + -(-info.size // _BLOCK) * _BLOCK


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {_short(k)}")
        out[k] = v
    return out


def _parse_index(raw: bytes, path: Path, file_size: int) -> tuple[list[dict], dict[str, int]]:
    """(entries, member name -> declared size; -1 for manifests) of a checked index."""
    def bad(problem: str) -> BundleError:
        return BundleError(f"{path}: index.json {problem}")

    try:
        idx = json.loads(raw, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise bad("is not JSON: nested too deeply") from None
    except ValueError as e:
        raise bad(f"is not JSON: {e}") from None
    if not isinstance(idx, dict) or not set(idx) <= _INDEX_FIELDS or "entries" not in idx:
        raise bad(f"is not an object with the fields {sorted(_INDEX_FIELDS)}")
    if idx.get("format") != FORMAT or type(idx.get("version")) is not int or \
            idx["version"] not in READS:
        raise bad(f"format {_short(idx.get('format'))} version {_short(idx.get('version'))} "
                  f"is not {FORMAT} version {', '.join(map(str, READS))}")
    if not isinstance(idx["entries"], list) or not isinstance(idx.get("toolchains", {}), dict):
        raise bad("entries must be a list and toolchains an object")
    members: dict[str, int] = {}
    keys: set[str] = set()
    for i, rec in enumerate(idx["entries"]):
        if not isinstance(rec, dict) or set(rec) != _ENTRY_FIELDS:
            raise bad(f"entry {i} is not an object with the fields {sorted(_ENTRY_FIELDS)}")
        key, blobs = rec["key"], rec["blobs"]
        if not is_digest(key) or not is_digest(rec["manifest"]):
            raise bad(f"entry {i}: key and manifest must be sha256 hex digests")
        if key in keys:
            raise bad(f"lists entry {key} twice")
        keys.add(key)
        if not isinstance(rec["target"], str) or not 0 < len(rec["target"]) <= 64:
            raise bad(f"entry {key}: target {_short(rec['target'])} is not a target name")
        if not isinstance(blobs, dict):
            raise bad(f"entry {key}: blobs must be an object of sha256 -> size")
        members[f"manifests/{rec['manifest']}"] = -1
        for d, n in blobs.items():
            if not is_digest(d) or type(n) is not int or n < 0:
                raise bad(f"entry {key}: blob {_short(d)} of size {_short(n)}: expected a "
                          "sha256 hex digest and a size >= 0")
            if members.setdefault(f"blobs/{d}", n) != n:
                raise bad(f"declares blob {d} with sizes {members[f'blobs/{d}']} and {n}")
    declared = sum(n for n in members.values() if n > 0)
    if declared > file_size:
        raise bad(f"declares {declared} bytes of blobs, more than the whole {file_size}-byte "
                  "bundle")
    return idx["entries"], members


def read_bundle(path: Path | str) -> list[BundleEntry]:
    """Reads and checks a bundle's structure (see the module docstring), hashing every member
    as it streams by. Returns its entries; raises BundleError naming the first problem."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _read(f, os.fstat(f.fileno()).st_size, path)
    except BundleError:
        raise
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read the bundle ({e})") from None


def _read(f: IO[bytes], size: int, path: Path) -> list[BundleEntry]:
    headers = _headers(f, size, path)
    first = next(headers, None)
    if first is None or first[0] != INDEX:
        raise BundleError(f"{path}: the first member is {_short(first and first[0])}, not "
                          "index.json: not a tiled bundle")
    _, offset, n = first
    if n > MAX_INDEX_BYTES:
        raise BundleError(f"{path}: index.json is {n} bytes, over the {MAX_INDEX_BYTES}-byte "
                          "limit")
    records, declared = _parse_index(BlobFile(path, offset, n).read(), path, size)
    found: dict[str, BlobFile] = {}
    for name, offset, n in headers:
        if name == INDEX:
            raise BundleError(f"{path}: a second index.json at byte {offset - _BLOCK}: a bundle "
                              "has exactly one index (refused rather than guess which counts)")
        if name in found:
            raise BundleError(f"{path}: member {name} appears twice")
        want = declared.get(name)
        if want is None:
            raise BundleError(f"{path}: unexpected member {_short(name)}: no entry of "
                              "index.json names it")
        if want >= 0 and n != want:
            raise BundleError(f"{path}: {name} is {n} bytes, index.json declares {want}")
        if want < 0 and n > MAX_MANIFEST_BYTES:
            raise BundleError(f"{path}: {name} is {n} bytes, over the {MAX_MANIFEST_BYTES}-byte "
                              "manifest limit")
        member = BlobFile(path, offset, n)
        if member.sha256() != name.partition("/")[2]:
            raise BundleError(f"{path}: {name} does not match its sha256 (corrupt bundle)")
        found[name] = member
    entries = []
    for rec in records:
        for name in [f"manifests/{rec['manifest']}", *(f"blobs/{d}" for d in rec["blobs"])]:
            if name not in found:
                raise BundleError(f"{path}: entry {rec['key']} names {name}, which the bundle "
                                  "lacks")
        entries.append(BundleEntry(rec["key"], rec["target"], rec["manifest"],
                                   found[f"manifests/{rec['manifest']}"],
                                   {d: found[f"blobs/{d}"] for d in rec["blobs"]}))
    return entries


# -- import ---------------------------------------------------------------------------------


def check_entry(entry: BundleEntry, manifest: bytes, toolchain_digest: ToolchainDigest,
                namespace: str) -> None:
    """Raises BundleError unless the entry's manifest may be served under its key on this
    host (see the module docstring): its action record is present, hashes to the key, and
    names the manifest's program and target, this host's toolchain for that target and those
    options, and `namespace`."""
    where = f"{entry.manifest.path}: entry {entry.key}"
    try:
        m = check_manifest(entry.key, manifest, entry.blobs)
    except ValueError as e:
        raise BundleError(f"{where}: {e}") from None
    action = m.action
    if action is None:
        raise BundleError(f"{where}: its manifest carries no action record (exported by an "
                          "older tiled), so its key cannot be checked; rebuild the bundle with "
                          "this tiled (compile the kernels, then tiled cache export)")
    if m.target != entry.target or m.target not in (m.backend, f"{m.backend}:{m.arch}"):
        raise BundleError(f"{where}: index.json says target {_short(entry.target)}, its "
                          f"manifest {_short(m.target)} ({m.backend}:{m.arch})")
    if action["program"] != m.program_digest:
        raise BundleError(f"{where}: its action record names another program than its "
                          "manifest")
    if action["namespace"] != namespace:
        raise BundleError(f"{where}: built under cache namespace {_short(action['namespace'])}, "
                          f"this host uses {namespace!r} (TILED_CACHE_NAMESPACE): no request "
                          "here would find it; rebuild the bundle under this namespace")
    try:
        mine = toolchain_digest(f"{m.backend}:{m.arch}", action["options"])
    except (TiledError, ValueError) as e:
        raise BundleError(f"{where}: this host does not compile for {m.target} with options "
                          f"{_short(action['options'])}: {e}") from None
    if mine != action["toolchain"]:
        raise BundleError(
            f"{where}: built by a different toolchain for {m.target} (bundle "
            f"{action['toolchain'][:12]}, this host {mine[:12]}); rebuild the bundle with this "
            "host's tiled / TVM / nvcc, or import it on a matching host")


def import_bundle(tier: Tier, path: Path | str, toolchain_digest: ToolchainDigest,
                  namespace: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> BundleReport:
    """Reads and checks the whole bundle (read_bundle, then check_entry for each entry under
    `namespace`, default TILED_CACHE_NAMESPACE), then puts every entry. Raises BundleError
    naming the first problem; nothing is imported from a bundle that fails a check, and a put
    that fails midway removes the entries this import had added before raising."""
    path = Path(path)
    ns = config.get("cache_namespace") if namespace is None else namespace
    entries = read_bundle(path)
    for entry in entries:
        check_entry(entry, _manifest(entry, path), toolchain_digest, ns)
    put_files = getattr(tier, "put_files", None)
    added: list[str] = []
    nbytes = 0
    targets: dict[str, int] = {}
    for n, entry in enumerate(entries):
        try:
            manifest = _manifest(entry, path)
            held = tier.contains(entry.key)
            if put_files is not None:
                put_files(entry.key, manifest, entry.blobs)
            else:
                tier.put(Entry(entry.key, manifest,
                               {d: b.read() for d, b in entry.blobs.items()}))
        except (CacheError, OSError, ValueError) as e:
            _undo(tier, added)
            raise BundleError(f"{path}: storing entry {entry.key} failed ({e}); the "
                              f"{len(added)} entries this import had added were removed, "
                              "nothing is imported") from None
        if not held:
            added.append(entry.key)
        nbytes += len(manifest) + sum(b.size for b in entry.blobs.values())
        targets[entry.target] = targets.get(entry.target, 0) + 1
        if progress:
            progress(n + 1, len(entries))
    return BundleReport(len(entries), nbytes, targets, len(added))


def _manifest(entry: BundleEntry, path: Path) -> bytes:
    """The entry's manifest bytes, read again and checked against their name: the file may
    have changed since read_bundle hashed it."""
    try:
        data = entry.manifest.read()
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read the manifest of entry {entry.key} ({e})") from None
    if sha256_hex(data) != entry.manifest_digest:
        raise BundleError(f"{path}: the manifest of entry {entry.key} changed during the import")
    return data


def _undo(tier: Tier, keys: list[str]) -> None:
    for key in keys:
        try:
            tier.delete(key)
        except OSError:  # CacheError included; the caller reports the failure it undoes
            continue
