"""TileLang's `pass_configs={...}` (tiled.jit, tiled.compile): switches of TileLang's own
compiler passes (fast math, TMA lowering, warp specialization, vectorization, CSE, ...).
tiled has its own pipeline and picks those itself, so a kernel that brings them compiles as
without them: the mapping is checked (string keys in TileLang's namespaces, or
`PassConfigKey` members) and dropped. None of them changes what a kernel computes in tiled:
tiled keeps its guarded memory accesses, its barriers and IEEE math where a key would turn
them off. Thin side: no TVM."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import Enum, StrEnum

log = logging.getLogger(__name__)

NAMESPACES = ("tl.", "tir.", "tirx.", "cuda.")  # where TileLang's keys live


class PassConfigKey(StrEnum):
    """TileLang's pass-config keys that its examples set, by TileLang's names (so
    `tilelang.PassConfigKey.TL_ENABLE_FAST_MATH` becomes `tiled.PassConfigKey...`)."""

    TL_SIMPLIFY = "tl.Simplify"
    TL_DYNAMIC_ALIGNMENT = "tl.dynamic_alignment"
    TL_DISABLE_DYNAMIC_TAIL_SPLIT = "tl.disable_dynamic_tail_split"
    TL_DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
    TL_ENABLE_FAST_MATH = "tl.enable_fast_math"
    TL_PTXAS_REGISTER_USAGE_LEVEL = "tl.ptxas_register_usage_level"
    TL_CONFIG_INDEX_BITWIDTH = "tl.config_index_bitwidth"
    TL_DISABLE_TMA_LOWER = "tl.disable_tma_lower"
    TL_DISABLE_SAFE_MEMORY_ACCESS = "tl.disable_safe_memory_legalize"
    TL_DISABLE_VECTORIZE_256 = "tl.disable_vectorize_256"
    TL_ENABLE_ASYNC_COPY = "tl.enable_async_copy"
    TL_DISABLE_WGMMA = "tl.disable_wgmma"
    TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE = "tl.enable_aggressive_shared_memory_merge"
    TL_DISABLE_SHUFFLE_ELECT = "tl.disable_shuffle_elect"
    TL_DISABLE_THREAD_STORAGE_SYNC = "tl.disable_thread_storage_sync"
    TIR_DISABLE_CSE = "tir.disable_cse_tir"
    TIR_SIMPLIFY = "tir.Simplify"
    TIR_DISABLE_VECTORIZE = "tir.disable_vectorize"
    TIR_ENABLE_DEBUG = "tir.enable_debug"
    TIR_MERGE_STATIC_SMEM = "tir.merge_static_smem"


def check_pass_configs(pass_configs) -> None:
    """Raises TypeError / ValueError for a `pass_configs` that is not a mapping of TileLang
    keys; otherwise the keys are dropped (module docstring)."""
    if pass_configs is None:
        return
    if not isinstance(pass_configs, Mapping):
        raise TypeError(f"pass_configs must be a dict {{key: value}}, got "
                        f"{type(pass_configs).__name__}")
    names = [key.value if isinstance(key, Enum) else key for key in pass_configs]
    for key, name in zip(pass_configs, names, strict=True):
        if not isinstance(name, str) or not name.startswith(NAMESPACES):
            raise ValueError(f"pass_configs: {key!r} is not a TileLang pass-config key (they "
                             f"start with {', '.join(NAMESPACES)})")
    if names:
        log.debug("pass_configs %s: TileLang pass switches, not used by tiled's compiler",
                  sorted(names))
