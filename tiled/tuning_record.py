"""tiled.autotune's record: the tuning key (what a choice depends on) and the winner kept in
the kernel cache under it, as an entry like a compile's, so other processes and hosts reuse it
without timing. Split from tiled.tuning, which chooses."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from typing import Any

from tiled import config, tuning_prebuilt
from tiled.runtime.cpu_levels import is_cpu_target

log = logging.getLogger("tiled.autotune")

RECORD_VERSION = 1


def device_identity(target: str) -> dict:
    """What a tuning depends on besides the program: the device model and its size."""
    if not is_cpu_target(target):  # cuda:..., or "local" (a daemon's name for this host's GPU)
        import torch

        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"name": p.name, "sm_count": p.multi_processor_count}
    return {"name": platform.processor() or platform.machine(),
            "cores": len(os.sched_getaffinity(0))}


def tuning_key(kernels: list, configs: list[dict], key: dict, target: str,
               options: dict, own_options: list[dict] | None = None) -> tuple[dict, str]:
    """(the tuning's action record, its key) for candidates `kernels` built from `configs` at
    the bucket's shape `key` (argument name -> value): the template is the digest of their
    programs and configs (a config's own compile options among them). `options`: the
    decorator's compile options; `own_options`: each candidate's (default those)."""
    from tiled.cache.keys import ActionKey, canonical_json

    template = hashlib.sha256(canonical_json(
        {"autotune": RECORD_VERSION, "candidates": [k.ir.digest for k in kernels],
         "configs": configs})).hexdigest()
    tgt, toolchain = _toolchain(kernels, own_options or [options] * len(kernels), target)
    k = ActionKey.build(template, tgt, {
        "tiled.autotune": {"key": key, "device": device_identity(target), "options": options}},
        toolchain, config.get("cache_namespace"))
    return k.record, k.hex


def _toolchain(kernels: list, own_options: list[dict], target: str) -> tuple[Any, str]:
    """(the target as keys spell it, the toolchain digest): this process's compiler's, or with
    a daemon configured (or prebuilt kernels) the one the first candidate's manifest records
    (the client may have no compiler; with prebuilt kernels, the first candidate they hold)."""
    if config.get("server") or tuning_prebuilt.active():
        m = None
        for kernel, options in zip(kernels, own_options, strict=True):
            try:
                m = tuning_prebuilt.compile_candidate(kernel, target, options).manifest
                break
            except LookupError:  # not among the prebuilt kernels: the next one may be
                continue
        if m is None:
            raise ValueError("no candidate is among the prebuilt kernels")
        if not m.action:
            raise ValueError("the first candidate's manifest carries no action record: its "
                             "toolchain is unknown")
        return {"backend": m.backend, "arch": m.arch}, m.action["toolchain"]
    from tiled.compiler.action import action_of
    from tiled.compiler.registry import parse_target

    tgt = parse_target(target)
    return tgt, action_of(kernels[0].ir.digest, tgt, own_options[0]).record["toolchain"]


def recorded(tkey: str, record: dict, configs: list[dict], name: str) -> dict | None:
    """The recorded winner's config, when the cache holds a sound record for `tkey` naming
    one of `configs`."""
    from tiled.runtime.manifest import Manifest

    store = cache()
    entry = store.get(tkey) if store is not None else None
    if entry is None:
        return None
    try:
        notes = (Manifest.from_json(entry.manifest).notes or {}).get("tiled.autotune", {})
        if notes.get("record") != record or notes.get("config") not in configs:
            raise ValueError("record or config does not match this tuning")
        return dict(notes["config"])
    except Exception as e:  # a bad record means tuning again
        log.warning("tiled.autotune %s: recorded tuning %s unusable (%s); tuning again", name,
                    tkey[:12], e)
        return None


def record(tkey: str, record: dict, compiled, notes: dict, name: str) -> None:
    """Keeps the winner (`compiled`, its manifest's notes holding `notes`) under `tkey`."""
    from dataclasses import replace

    from tiled.cache.entry import Entry, sha256_hex
    from tiled.errors import CacheWriteError

    store = cache()
    if store is None:
        return
    manifest = replace(compiled.manifest, action=None,
                       notes={"tiled.autotune": notes}).to_json().encode()
    art = compiled.artifact
    try:
        store.put(Entry(tkey, manifest, {sha256_hex(art): art}))
    except CacheWriteError as e:
        log.warning("tiled.autotune %s: could not record the tuning: %s", name, e)


def cache():
    """The process's kernel cache stack (tiled.cache.tiered.default_cache), or None when it
    cannot open: tunings are then not recorded."""
    from tiled.cache.tiered import default_cache

    try:
        return default_cache()
    except OSError as e:
        log.warning("tiled.autotune: no kernel cache (%s); tunings are not recorded", e)
        return None


def plain(values):
    """`values` as JSON has them (tuples as lists, other objects as their str)."""
    return json.loads(json.dumps(list(values), default=str))
