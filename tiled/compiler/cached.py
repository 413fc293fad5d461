"""Compiling through a cache tier: look the action key up, compile on a miss, store the result.

A hit returns the stored manifest and artifact only after checking them again here (the manifest
parses, names this program and target, and its artifact is present and hashes to its name): a
tier's bug or a corrupt blob costs a recompile, never a wrong kernel. A failed write is a logged,
counted skip; the compiled kernel is still returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from tiled.cache.entry import CacheEvents, Entry, NullEvents, Tier, sha256_hex
from tiled.cache.keys import ActionKey
from tiled.cache.tiered import default_cache
from tiled.compiler import CompiledKernel, as_program, compile_program
from tiled.compiler.action import action_of
from tiled.compiler.registry import Target, parse_target
from tiled.errors import CacheWriteError
from tiled.ir import verify
from tiled.ir.program import Program
from tiled.runtime.manifest import Manifest, ManifestError

log = logging.getLogger("tiled.cache")


def compile_key(program: Program, target: Target, options: Mapping[str, Any]) -> str:
    """The action key of compiling `program` (verified) for the parsed `target` with `options`:
    program digest, target, options, this process's toolchain digest and TILED_CACHE_NAMESPACE.
    Raises ValueError naming an option the backend does not take or a value it refuses."""
    return compile_action(program, target, options).hex


def compile_action(program: Program, target: Target, options: Mapping[str, Any]) -> ActionKey:
    """compile_key with the record it digests (the manifest carries the record)."""
    return action_of(program.digest, target, options)


def _kernel_from_entry(entry: Entry, program_digest: str,
                       target: Target) -> tuple[CompiledKernel | None, str]:
    """(the kernel an entry holds, "") or (None, why the entry is unusable for this program and
    target)."""
    try:
        manifest = Manifest.from_json(entry.manifest)
    except ManifestError as e:
        return None, f"its manifest does not load: {e}"
    artifact = entry.blobs.get(manifest.artifact_sha256)
    if manifest.program_digest != program_digest or manifest.target != str(target):
        return None, f"it holds {manifest.target} program {manifest.program_digest[:12]}"
    if artifact is None:
        return None, f"artifact {manifest.artifact_sha256[:12]} is missing"
    if sha256_hex(artifact) != manifest.artifact_sha256:
        return None, f"artifact {manifest.artifact_sha256[:12]} does not hash to its name"
    return CompiledKernel(artifact, manifest), ""


def compile_cached(kernel_or_program, target: str | Target, tier: Tier,
                   options: Mapping[str, Any] | None = None,
                   events: CacheEvents | None = None) -> tuple[CompiledKernel, bool]:
    """Compiles `kernel_or_program` for `target`, served from `tier` when it holds the action
    key. Returns (kernel, hit). On a hit the kernel has no `.source` and the compiler did not
    run. An unusable entry (a manifest that does not load or names another program, a missing
    or corrupt artifact) is counted as events.lookup(tier, "corrupt"), deleted, and recompiled.
    A CacheWriteError from `tier.put` is logged and counted as events.error(tier, "write").
    Raises what compile_program raises (VerifyError, UnsupportedTarget, CompileError), and
    ValueError for an option that is not JSON data. Thread-safe when the tier is; concurrent
    misses of one key each compile (the tier keeps one result)."""
    events = events or NullEvents()
    opts = dict(options or {})
    t0 = time.perf_counter()
    program = as_program(kernel_or_program)
    verify(program)
    tgt = parse_target(target)
    digest = program.digest  # canonicalizes: computed once
    action = action_of(digest, tgt, opts)
    key = action.hex
    t1 = time.perf_counter()
    entry = _get(tier, key, events)
    if entry is not None:
        kernel, problem = _kernel_from_entry(entry, digest, tgt)
        if kernel is not None:
            kernel.stages = {"key": t1 - t0, "lookup": time.perf_counter() - t1}
            return kernel, True
        log.warning("cache entry %s in tier %r is unusable (%s); recompiling", key[:12],
                    tier.name, problem)
        events.lookup(tier.name, "corrupt")
        _delete(tier, key, events)  # else a put of the same key may keep the bad entry
    kernel = compile_program(program, tgt, action=action.record, **opts)
    manifest = kernel.manifest.to_json().encode()
    try:
        tier.put(Entry(key, manifest, {kernel.manifest.artifact_sha256: kernel.artifact}))
    except CacheWriteError as e:
        log.warning("not cached: tier %r could not store %s (%s): %s", tier.name, key[:12],
                    kernel.manifest.name, e)
        events.error(tier.name, "write")
    return kernel, False


def _get(tier: Tier, key: str, events: CacheEvents) -> Entry | None:
    # Tiers report their own failures as misses; this guards the glue against one that raises.
    try:
        return tier.get(key)
    except OSError as e:  # CacheError included
        log.warning("cache read from tier %r failed for %s: %s", tier.name, key[:12], e)
        events.error(tier.name, "read")
        return None


def _delete(tier: Tier, key: str, events: CacheEvents) -> None:
    try:
        tier.delete(key)
    except OSError as e:  # CacheError included
        log.warning("cannot delete unusable entry %s from tier %r: %s", key[:12], tier.name, e)
        events.error(tier.name, "delete")


__all__ = ["compile_action", "compile_cached", "compile_key", "default_cache"]
