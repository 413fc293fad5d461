"""Maintenance of the disk tier: the sweep of stale staging, `gc`, `stats`, and `verify` with
its repair. DiskTier's methods of those names delegate here; the read and write path (and the
layout and invariants this relies on) is tiled.cache.disk.

get() and put() never need any of this to be correct: a crash leaves only stale staging,
orphan blobs and a ledger that over-counts (tiled.cache.disk_lru), which cost space, not
correctness. These operations give that space back and report damage:
- `sweep` removes stale staging (a dead pid of this host, or older than `stale_after_s`). A
  tier opening a directory with leftovers runs it, and so do `gc` and `verify(repair=True)`.
- `gc` also removes orphan blobs: a cas/ file with one link, the one in cas/, is named by no
  entry, since every entry holds its own link to each blob it names. It then re-measures the
  ledger and evicts down to the cap.
- `verify` reads every entry as get() does, without touching its recency, and hashes its
  blobs as they stream by. Its repair holds the lock only to remove a thing, and only while
  that thing is still the directory or inode verify found broken, so a good entry or blob
  published in between stays.

Every function takes the tier (a MaintainedTier: the DiskTier internals it uses) and none
imports tiled.cache.disk: disk imports this module, never the other way round.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Protocol

from tiled.cache.disk_layout import RECORD, Corrupt, DiskStats, Layout, Problem
from tiled.cache.disk_lru import Ledger, LedgerState, lru_order
from tiled.cache.entry import Entry, is_digest, load_manifest

# The tier's logger: an operator who filters on tiled.cache.disk sees all of its messages.
log = logging.getLogger("tiled.cache.disk")


class MaintainedTier(Protocol):
    """What maintenance uses of a DiskTier (tiled.cache.disk): its settings, its layout and
    ledger, and three steps of its read and write path."""

    max_bytes: int
    stale_after_s: float
    _layout: Layout
    _ledger: Ledger

    def _load(self, key: str, touch: bool, keep: bool = True) -> tuple[
            str, Entry | None, Exception | None, tuple[int, int] | None]: ...

    def _remove_corrupt(self, key: str, ident: tuple[int, int] | None,
                        problem: Corrupt) -> bool: ...

    def _evict(self, led: LedgerState, target: int) -> None: ...


def sweep(layout: Layout, led: LedgerState, stale_after_s: float) -> int:
    """Removes stale staging; returns how many. Call under the lock."""
    swept = 0
    for path in layout.stale_staging(stale_after_s):
        try:
            layout.free(path)
            swept += 1
        except OSError as e:
            log.warning("disk cache: sweeping %s failed: %s", path, e)
    if swept:
        led.recount = True  # whether the ledger still counts those bytes is unknown
    return swept


def gc(tier: MaintainedTier) -> dict[str, int]:
    """DiskTier.gc: sweeps, removes orphan blobs, re-measures the ledger and evicts down to
    the cap, all under the lock."""
    layout = tier._layout
    with tier._ledger.locked() as led:
        swept = sweep(layout, led, tier.stale_after_s)
        orphans = 0
        for path, st in layout.files(layout.cas):
            if st.st_nlink == 1:
                os.unlink(path)
                orphans += 1
        led.prune(tier.stale_after_s)
        led.used, led.recount = layout.measure(), False
        before = led.used
        tier._evict(led, tier.max_bytes)
        return {"swept": swept, "orphans": orphans, "evicted_bytes": before - led.used}


def stats(tier: MaintainedTier) -> DiskStats:
    """DiskTier.stats. Only the ledger is read under the lock; the counts are listed after, so
    they may differ from it by the writes in between."""
    layout = tier._layout
    with tier._ledger.locked() as led:
        used, reserved = led.used, led.reserved
    entries = len(lru_order(layout.ac, RECORD))
    blobs = sum(1 for _ in layout.files(layout.cas))
    staging = len(os.listdir(layout.staging)) if layout.staging.is_dir() else 0
    return DiskStats(entries, blobs, layout.measure(), used, reserved, staging, tier.max_bytes)


def verify(tier: MaintainedTier, repair: bool) -> list[Problem]:
    """DiskTier.verify: entries, then cas/ blobs, then staging."""
    layout = tier._layout
    problems: list[Problem] = []
    for _, path in lru_order(layout.ac, RECORD):
        key = os.path.basename(path)
        if not is_digest(key) or os.path.basename(os.path.dirname(path)) != key[:2]:
            problems.append(_repair(tier, Problem("stray", path, "not an entry name"), repair))
            continue
        status, entry, problem, ident = tier._load(key, touch=False, keep=False)
        if status == "hit" and entry is not None and \
                load_manifest(entry.manifest).action is None:
            status, problem = "corrupt", Corrupt(
                "manifest carries no action record (written by an older tiled): it cannot "
                "be checked against its key, and no compile of this tiled looks it up")
        if status == "corrupt":
            assert isinstance(problem, Corrupt)
            removed = repair and tier._remove_corrupt(key, ident, problem)
            problems.append(Problem("entry", path, problem.detail, key, removed))
        elif status == "error":
            problems.append(Problem("unreadable", path, str(problem), key))
    problems += [_repair(tier, p, repair) for p in layout.verify_blobs()]
    stale = [Problem("staging", path, "stale; gc() sweeps it")
             for path in layout.stale_staging(tier.stale_after_s)]
    if repair:
        with tier._ledger.locked() as led:
            if stale:
                sweep(layout, led, tier.stale_after_s)
            led.used, led.recount = layout.measure(), False
        stale = [dataclasses.replace(p, removed=not os.path.lexists(p.path)) for p in stale]
    return problems + stale


def _repair(tier: MaintainedTier, problem: Problem, repair: bool) -> Problem:
    """Removes a stray, or a cas/ blob that still does not hash to its name (hashed before
    the lock is taken, removed only if the same inode is still there); the Problem marked
    removed when it went."""
    if not repair or problem.kind not in ("stray", "blob"):
        return problem
    layout = tier._layout
    try:
        st = os.lstat(problem.path)
        name = os.path.basename(problem.path)
        if problem.kind == "blob" and layout.stored_inode(name, st.st_size):
            return problem  # sound now: replaced by a good copy since verify hashed it
        with tier._ledger.locked() as led:
            now = os.lstat(problem.path)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return problem
            layout.free(problem.path)
            led.recount = True
    except FileNotFoundError:
        pass  # gone already
    except OSError as e:
        log.warning("disk cache: removing %s failed: %s", problem.path, e)
        return problem
    return dataclasses.replace(problem, removed=True)
