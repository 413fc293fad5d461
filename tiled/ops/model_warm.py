"""The kernels tiled.ops compiles for one model's layers, from its Hugging Face config.json
(`tiled warm --model-config`): what a serving plugin (integrations/vllm, integrations/sglang)
asks for at its first forward, so that a deployment can compile it on the daemon beforehand
and the server's start finds every kernel in the cache.

    warm_set(config, tensor_parallel_size=1, framework="vllm", target="cpu") -> [(op, params)]

Each (op, params) is what the op passes to its kernel factory (tiled.ops.kernel_factory), the
program digest equal to the one the op compiles at run time: rms_norm and fused_add_rms_norm
over hidden_size (eps rms_norm_eps), the gated activation over intermediate_size / tp
(hidden_act silu, gelu or gelu_pytorch_tanh), the rotary embedding over the heads of one
tensor-parallel rank (num_attention_heads / tp, num_key_value_heads / tp; head_dim, and
partial_rotary_factor of it rotated; Llama's neox layout), all in the config's dtype but
the rotary cache under SGLang on a GPU (float32, as SGLang keeps it).
"""

from __future__ import annotations

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16",
          "float32": "float32", "float": "float32"}


FRAMEWORKS = ("vllm", "sglang")


def _cache_dtype(framework: str, target: str, dtype: str) -> str:
    """The dtype of the rotary cos / sin cache the plugin passes: vLLM casts it to the
    model's; SGLang keeps it in float32 on GPUs (CUDA, ROCm) and casts it on CPU."""
    if framework == "sglang" and not target.startswith("cpu"):
        return "float32"
    return dtype


class ModelConfigError(ValueError):
    """A config.json the warm set cannot be derived from (the message says which key)."""


def _text_config(config: dict) -> dict:
    """The language model's part of a config (multimodal configs nest it)."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _int(cfg: dict, key: str, default=None) -> int:
    v = cfg.get(key)
    v = default if v is None else v
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelConfigError(f"config.json: `{key}` must be a positive integer, got {v!r}")
    return v


def warm_set(config: dict, tensor_parallel_size: int = 1, framework: str = "vllm",
             target: str = "cpu") -> list[tuple[str, dict]]:
    """(op, params) per kernel (module docstring) for the plugin of `framework` on `target`.
    Raises ModelConfigError."""
    if framework not in FRAMEWORKS:
        raise ModelConfigError(f"framework {framework!r} is not one of {sorted(FRAMEWORKS)}")
    if not isinstance(config, dict):
        raise ModelConfigError("config.json: expected a JSON object")
    cfg = _text_config(config)
    tp = tensor_parallel_size
    if not isinstance(tp, int) or tp < 1:
        raise ModelConfigError(f"tensor_parallel_size {tp!r} is not a positive integer")
    hidden = _int(cfg, "hidden_size")
    inter = _int(cfg, "intermediate_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    head_dim = _int(cfg, "head_dim", hidden // heads if hidden % heads == 0 else None)
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if name not in DTYPES:
        raise ModelConfigError(f"config.json: dtype {name!r} is not one of {sorted(DTYPES)}")
    dtype = DTYPES[name]
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if act not in ACTIVATIONS:
        raise ModelConfigError(f"config.json: hidden_act {act!r} is not one of "
                               f"{sorted(ACTIVATIONS)}")
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        raise ModelConfigError(f"config.json: rms_norm_eps {eps!r} is not a positive number")
    for what, n in (("intermediate_size", inter), ("num_attention_heads", heads)):
        if n % tp:
            raise ModelConfigError(f"config.json: {what} {n} does not split over "
                                   f"{tp} tensor-parallel ranks")
    factor = cfg.get("partial_rotary_factor", 1.0)
    rot_dim = int(head_dim * factor)
    if rot_dim < 2 or rot_dim % 2 or rot_dim > head_dim:
        raise ModelConfigError(f"config.json: partial_rotary_factor {factor!r} of head_dim "
                               f"{head_dim} leaves no even rotary dim")
    norm = {"N": hidden, "dtype": dtype, "eps": float(eps)}
    return [
        ("rms_norm", norm),
        ("fused_add_rms_norm", dict(norm)),
        ("gated_activation", {"N": inter // tp, "dtype": dtype, "act": ACTIVATIONS[act]}),
        ("rotary_embedding", {"heads": heads // tp, "kv_heads": max(1, kv_heads // tp),
                              "head_size": head_dim, "rot_dim": rot_dim, "dtype": dtype,
                              "cache_dtype": _cache_dtype(framework, target, dtype),
                              "is_neox": True}),
    ]
