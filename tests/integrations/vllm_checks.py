"""Run inside the vLLM venv (tests/integrations/test_vllm_plugin.py starts it): the tiled_vllm
plugin against the real vllm on CPU, each check's result printed as one JSON line at the end.

    python vllm_checks.py main        plugin discovery, classes per custom_ops, IR dispatch,
                                      numerics, opcheck, torch.compile (TILED_SERVER: a daemon)
    python vllm_checks.py fallback    the daemon unreachable: native forwards, counted
    python vllm_checks.py broken      a plugin whose layers fail to import: vLLM's own layers
"""

import json
import logging
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
logging.basicConfig(level=logging.WARNING)
logging.getLogger("tiled_vllm").setLevel(logging.INFO)  # its start line

import torch


def _configs():
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    def ctx(custom_ops):
        return set_current_vllm_config(VllmConfig(
            compilation_config=CompilationConfig(custom_ops=custom_ops)))
    return ctx


def _layers(dtype):
    from vllm.model_executor.layers import rotary_embedding
    from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rotary_embedding._ROPE_DICT.clear()  # get_rope keeps its layers: build them anew here

    norm = RMSNorm(96, eps=1e-5, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 96, dtype=dtype))
    return {"RMSNorm": norm, "SiluAndMul": SiluAndMul(), "GeluAndMul": GeluAndMul(),
            "GeluAndMul_tanh": GeluAndMul("tanh"),
            "RotaryEmbedding": get_rope(64, max_position=256, is_neox_style=True, dtype=dtype),
            "RotaryEmbedding_gptj": get_rope(64, max_position=256, is_neox_style=False,
                                             dtype=dtype),
            "Llama3RotaryEmbedding": get_rope(
                64, max_position=256, dtype=dtype,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 128})}


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _numerics(layers, dtype) -> dict:
    """Each layer's forward (tiled) against its forward_native on the same inputs."""
    g = torch.Generator().manual_seed(0)
    out = {}
    x = torch.randn(7, 96, generator=g).to(dtype)
    res = torch.randn(7, 96, generator=g).to(dtype)
    norm = layers["RMSNorm"]
    out["RMSNorm"] = _rel(norm(x.clone()), norm.forward_native(x.clone()))
    a, r = norm(x.clone(), res.clone())
    na, nr = norm.forward_native(x.clone(), res.clone())
    out["RMSNorm_residual"] = max(_rel(a, na), _rel(r, nr))
    h = torch.randn(5, 2, 128, generator=g).to(dtype)
    for name in ("SiluAndMul", "GeluAndMul", "GeluAndMul_tanh"):
        out[name] = _rel(layers[name](h), layers[name].forward_native(h))
    pos = torch.randint(0, 256, (9,), generator=g)
    q = torch.randn(9, 4 * 64, generator=g).to(dtype)
    k = torch.randn(9, 2 * 64, generator=g).to(dtype)
    for name in ("RotaryEmbedding", "RotaryEmbedding_gptj", "Llama3RotaryEmbedding"):
        rope = layers[name]
        tq, tk = rope(pos, q.clone(), k.clone())
        nq, nk = rope.forward_native(pos, q.clone(), k.clone())
        out[name] = max(_rel(tq, nq), _rel(tk, nk))
    return out


def main() -> dict:
    import tiled_vllm
    from vllm import ir
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own discovery of the entry point
    tiled_vllm.register()  # a second call does nothing
    res = {"status_after_load": tiled_vllm.status()}
    ctx = _configs()
    classes = {}
    for ops in (["none"], ["all"], ["none", "+RMSNorm"], ["all", "-RMSNorm"],
                ["none", "-rms_norm", "-silu_and_mul", "-RotaryEmbedding"]):
        with ctx(ops):
            layers = _layers(torch.float32)
            classes[",".join(ops)] = {
                n: [type(m).__name__, m._forward_method.__name__ != "forward_native"]
                for n, m in layers.items()}
    res["classes"] = classes
    with ctx(["none"]):
        res["numerics_float32"] = _numerics(_layers(torch.float32), torch.float32)
        res["numerics_bfloat16"] = _numerics(_layers(torch.bfloat16), torch.bfloat16)
        x, w = torch.randn(6, 96), torch.rand(96) + 0.5
        with ir.ops.rms_norm.set_priority(["tiled", "native"]):
            res["ir_rms_norm_provider"] = ir.ops.rms_norm.dispatch(x, w, 1e-6, None).provider
            res["ir_rms_norm_err"] = _rel(ir.ops.rms_norm(x, w, 1e-6, None),
                                          ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6))
        r = torch.randn(6, 96)
        with ir.ops.fused_add_rms_norm.set_priority(["tiled", "native"]):
            res["ir_fused_provider"] = ir.ops.fused_add_rms_norm.dispatch(
                x, r, w, 1e-6, None).provider
        with ir.ops.rms_norm.set_priority(["tiled", "native"]):  # unsupported: native
            res["ir_rms_norm_var_size_provider"] = ir.ops.rms_norm.dispatch(
                x, w, 1e-6, 48).provider
        layers = _layers(torch.float32)
        h = torch.randn(5, 128)
        opchecks = {}
        for name, op, args in (
                ("rms_norm", torch.ops.tiled.rms_norm.default, (x, w, 1e-6)),
                ("fused_add_rms_norm", torch.ops.tiled.fused_add_rms_norm.default,
                 (x.clone(), r.clone(), w, 1e-6)),
                ("silu_and_mul", torch.ops.tiled.silu_and_mul.default, (h,)),
                ("gelu_and_mul", torch.ops.tiled.gelu_and_mul.default, (h, "tanh"))):
            try:
                torch.library.opcheck(op, args)
                opchecks[name] = "ok"
            except Exception as e:  # reported, the test asserts
                opchecks[name] = repr(e)
        res["opcheck"] = opchecks
        compiled = {}
        for name in ("RMSNorm", "SiluAndMul", "GeluAndMul"):
            layer = layers[name]
            fn = torch.compile(layer.forward, fullgraph=True, dynamic=True, backend="aot_eager")
            errs = []
            for t in (3, 17):
                inp = torch.randn(t, 96 if name == "RMSNorm" else 128)
                errs.append(_rel(fn(inp), layer.forward_native(inp)))
            compiled[name] = max(errs)
        rope = layers["RotaryEmbedding"]
        fn = torch.compile(rope.forward, fullgraph=True, dynamic=True, backend="aot_eager")
        pos = torch.arange(11)
        q, k = torch.randn(11, 256), torch.randn(11, 128)
        tq, tk = fn(pos, q.clone(), k.clone())
        nq, nk = rope.forward_native(pos, q.clone(), k.clone())
        compiled["RotaryEmbedding"] = max(_rel(tq, nq), _rel(tk, nk))
        res["compiled"] = compiled
    res["status_end"] = tiled_vllm.status()
    return res


def fallback() -> dict:
    """TILED_SERVER names a daemon that is not there: every layer still answers, by its
    native forward, and the fallbacks are counted."""
    import tiled_vllm

    tiled_vllm.register()
    ctx = _configs()
    with ctx(["none"]):
        layers = _layers(torch.float32)
        errs = _numerics(layers, torch.float32)
    return {"numerics": errs, "status": tiled_vllm.status()}


def broken() -> dict:
    """The plugin's layers fail to import: register() logs, returns, and vLLM builds its own
    classes."""
    sys.modules["tiled_vllm.layers"] = None  # an import of it raises ImportError
    import tiled_vllm

    tiled_vllm.register()
    ctx = _configs()
    with ctx(["none"]):
        layers = _layers(torch.float32)
    return {"status": tiled_vllm.status(), "classes": {n: type(m).__name__
                                                       for n, m in layers.items()}}


if __name__ == "__main__":
    result = {"main": main, "fallback": fallback, "broken": broken}[sys.argv[1]]()
    print("RESULT " + json.dumps(result))
