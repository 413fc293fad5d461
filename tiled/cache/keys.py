"""The action key: the cache's name for one compile (program + target + options + toolchain).

The key is the sha256 of a versioned record, encoded canonically (sorted keys, no whitespace,
UTF-8) after the domain prefix b"tiled.action.v1\\0":

    {"v": 1,
     "program": <program digest: sha256 hex of the canonical Tile IR>,
     "target": {"backend": "cuda", "arch": "sm_90a", "features": [<sorted strings>]},
     "options": {<compile options, None values dropped, tuples as lists>},
     "toolchain": <toolchain digest hex, tiled.compiler.toolchain.digest>,
     "namespace": <TILED_CACHE_NAMESPACE, default "">}

Any change to the record's layout bumps "v" and the prefix, so old entries are disowned rather
than misread. The namespace is an operator's salt: bumping it disowns every entry at once (a bad
toolchain's kernels). Pure Python: no TVM, no I/O; every function is thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tiled.cache.entry import is_digest

KEY_VERSION = 1
DOMAIN = b"tiled.action.v1\0"


def canonical_json(value: Any) -> bytes:
    """The canonical encoding: sorted keys, no whitespace, UTF-8, finite numbers only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _plain(value: Any, where: str) -> Any:
    """`value` as plain JSON data (tuples become lists); ValueError naming `where` otherwise.
    bool stays distinct from int (JSON true vs 1); dict keys must be strings, since json would
    silently turn 1 and "1" into the same key."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"option {where} = {value!r} is not a finite number")
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"option {where} has a non-string key {k!r}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    raise ValueError(f"option {where} = {value!r} ({type(value).__name__}) is not JSON data "
                     "(str, int, float, bool, None, list or dict)")


def canonical_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Compile options as they enter the key: top-level None values dropped (an option set to
    None means "the default"), tuples as lists. Raises ValueError naming a non-JSON option."""
    out = {}
    for name, value in (options or {}).items():
        if not isinstance(name, str):
            raise ValueError(f"option name {name!r} is not a string")
        if value is not None:
            out[name] = _plain(value, repr(name))
    return out


def target_record(target: Any) -> dict[str, Any]:
    """{"backend", "arch", "features"} of a target given as text ("cpu", "cuda:sm_90a"; no
    features), as a mapping with those keys, or as an object with `.backend` / `.arch` and
    optionally `.features` (tiled.compiler.registry.Target). Pass the *parsed* target when
    one exists, so spellings that parse alike ("cuda:sm_90" / "cuda:sm_90a") share a key."""
    backend: Any
    arch: Any
    features: Any
    if isinstance(target, str):
        backend, _, arch = target.partition(":")
        features = ()
    elif isinstance(target, Mapping):
        backend, arch = target.get("backend"), target.get("arch") or ""
        features = target.get("features") or ()
    else:
        backend, arch = getattr(target, "backend", None), getattr(target, "arch", None) or ""
        features = getattr(target, "features", None) or ()
    if not isinstance(backend, str) or not backend or not isinstance(arch, str):
        raise ValueError(f"target {target!r} does not name a backend (and an arch)")
    if isinstance(features, str) or not all(isinstance(f, str) for f in features):
        raise ValueError(f"target features must be a list of strings, got {features!r}")
    return {"backend": backend, "arch": arch, "features": sorted(set(features))}


def action_record(program_digest: str, target: Any, options: Mapping[str, Any] | None,
                  toolchain: str, namespace: str = "") -> dict[str, Any]:
    """The record an action key digests (see the module docstring), for display by `tiled
    cache` tooling. Raises ValueError for a malformed digest, target or option."""
    if not is_digest(program_digest):
        raise ValueError(f"program digest {program_digest!r} is not a sha256 hex digest")
    if not is_digest(toolchain):
        raise ValueError(f"toolchain digest {toolchain!r} is not a sha256 hex digest")
    if not isinstance(namespace, str):
        raise ValueError(f"cache namespace must be a string, got {namespace!r}")
    return {"v": KEY_VERSION, "program": program_digest, "target": target_record(target),
            "options": canonical_options(options), "toolchain": toolchain,
            "namespace": namespace}


def key_of_record(record: Mapping[str, Any]) -> str:
    """sha256 hex of DOMAIN + the record's canonical JSON."""
    return hashlib.sha256(DOMAIN + canonical_json(record)).hexdigest()


@dataclass(frozen=True)
class ActionKey:
    """An action key and the record it digests. Equal (and hashed) by `hex` alone."""

    hex: str
    record: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @classmethod
    def build(cls, program_digest: str, target: Any, options: Mapping[str, Any] | None,
              toolchain: str, namespace: str = "") -> ActionKey:
        record = action_record(program_digest, target, options, toolchain, namespace)
        return cls(key_of_record(record), record)

    def __str__(self) -> str:
        return self.hex


def action_key(program_digest: str, target: Any, options: Mapping[str, Any] | None,
               toolchain: str, namespace: str = "") -> str:
    """The action key (sha256 hex) of one compile. `namespace` is the operator's salt; the
    compile glue passes config.get("cache_namespace"). Raises ValueError like action_record."""
    return ActionKey.build(program_digest, target, options, toolchain, namespace).hex


__all__ = ["DOMAIN", "KEY_VERSION", "ActionKey", "action_key", "action_record",
           "canonical_json", "canonical_options", "key_of_record", "target_record"]
