"""The action record of one compile: what its cache key digests (tiled.cache.keys), computed
from the program digest, the parsed target, the options (checked against the backend's
declared options first, so an unknown option never splits the cache), this process's toolchain
digest and TILED_CACHE_NAMESPACE. The manifest carries the record, so a cache entry or a bundle
entry can be checked against the key it is filed under."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiled import config
from tiled.cache.keys import ActionKey
from tiled.compiler.registry import Target, check_options
from tiled.compiler.toolchain.digest import toolchain_digest


def action_of(program_digest: str, target: Target, options: Mapping[str, Any]) -> ActionKey:
    """The ActionKey (hex + record); options equal to their defaults are left out of it.
    Raises ValueError naming an option the backend does not take or a value it refuses."""
    options = check_options(target.backend, dict(options))
    toolchain = toolchain_digest(target, cuda_compiler=options.get("cuda_compiler"))
    return ActionKey.build(program_digest, target, options, toolchain,
                           config.get("cache_namespace"))
