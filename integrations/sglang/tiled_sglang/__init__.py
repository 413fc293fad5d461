"""tiled inside SGLang: an `sglang.srt.plugins` entry point (`register`) that replaces SGLang's
RMSNorm, SiluAndMul, GeluAndMul and rotary embedding classes, through HookRegistry REPLACE,
by subclasses whose forward runs tiled's kernels (README.md).

    TILED_OPS      which ops to replace: "all" (default), "none", or a comma list of
                   rms_norm, silu_and_mul, gelu_and_mul, rotary_embedding
    TILED_SERVER   the tiled daemon that compiles the kernels (else tiled compiles in this
                   process, which needs tiled's compiler installed)

SGLang's load_plugins() calls `register()` in every process, then applies the registered
hooks. register() is idempotent, imports SGLang only when called, and never raises: SGLang
logs what a plugin raises and goes on, but a half-registered plugin would be worse than none,
so a failure is logged here and no hook is left registered.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tiled_sglang")
_registered: dict[str, list[str]] = {}  # op -> the SGLang classes replaced for it
_state = {"done": False, "error": None}


def selected_ops(value: str | None = None) -> tuple[str, ...]:
    """The ops TILED_OPS (or `value`) asks for; unknown names are logged and ignored."""
    from tiled.ops.serving_plugin import selected_ops as select

    return select(value, log)


def register() -> None:
    """SGLang's entry point (module docstring). Never raises."""
    if _state["done"]:
        return
    _state["done"] = True
    try:
        from tiled_sglang import layers

        _registered.update(layers.install(selected_ops()))
        log.info("tiled_sglang: active for %s (TILED_SERVER=%s)",
                 ", ".join(_registered) or "no ops", _server())
    except Exception as e:  # SGLang must keep running with its own layers
        _state["error"] = repr(e)
        _registered.clear()
        log.warning("tiled_sglang: not active, SGLang keeps its own layers: %r", e)


def status() -> dict:
    """What register() did: the ops it replaced (op -> SGLang classes), its error if it
    failed, and the counts of calls served by tiled and by SGLang's own forward."""
    from tiled_sglang.counters import counts

    return {"registered": {op: list(c) for op, c in sorted(_registered.items())},
            "error": _state["error"], "served": counts()}


def _server() -> str:
    """The daemon the ops compile through (TILED_SERVER), for the start line."""
    from tiled import config

    return config.get("server") or "unset"
