"""tiled inside vLLM: a `vllm.general_plugins` entry point (`register`) that makes vLLM build
tiled's layers for RMSNorm, SiluAndMul, GeluAndMul and the rotary embeddings, and adds a
`tiled` provider to vLLM's IR ops rms_norm and fused_add_rms_norm (README.md).

    TILED_OPS      which ops to replace: "all" (default), "none", or a comma list of
                   rms_norm, silu_and_mul, gelu_and_mul, rotary_embedding
    TILED_SERVER   the tiled daemon that compiles the kernels (else tiled compiles in this
                   process, which needs tiled's compiler installed)

`register()` runs in every vLLM process (vLLM calls its general plugins once per process and
does not catch what they raise): it is idempotent, imports vLLM only when called, and never
raises; a failure is logged and vLLM keeps its own layers.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tiled_vllm")

_registered: dict[str, object] = {}  # op -> what register() installed for it
_state = {"done": False, "error": None}


def selected_ops(value: str | None = None) -> tuple[str, ...]:
    """The ops TILED_OPS (or `value`) asks for; unknown names are logged and ignored."""
    from tiled.ops.serving_plugin import selected_ops as select

    return select(value, log)


def register() -> None:
    """vLLM's entry point (module docstring). Never raises."""
    if _state["done"]:
        return
    _state["done"] = True
    try:
        from tiled_vllm import layers

        ops = selected_ops()
        _registered.update(layers.install(ops))
        log.info("tiled_vllm: active for %s (TILED_SERVER=%s)",
                 ", ".join(_registered) or "no ops", _server())
    except Exception as e:  # vLLM must keep running with its own layers
        _state["error"] = repr(e)
        log.warning("tiled_vllm: not active, vLLM keeps its own layers: %r", e)


def status() -> dict:
    """What register() did: the ops it installed, its error if it failed, and the counts of
    calls served by tiled and by the native fallback."""
    from tiled_vllm.counters import counts

    return {"registered": sorted(_registered), "error": _state["error"], "served": counts()}


def _server() -> str:
    """The daemon the ops compile through (TILED_SERVER), for the start line."""
    from tiled import config

    return config.get("server") or "unset"
