"""Run inside the SGLang venv (tests/integrations/test_sglang_plugin.py starts it): the
tiled_sglang plugin against the real sglang on CPU, each check's result printed as one JSON line
at the end.

    python sglang_checks.py main        plugin discovery by load_plugins(), the classes SGLang
                                        builds, numerics, opcheck, torch.compile, SGLang's own
                                        switches (TILED_SERVER: a daemon)
    python sglang_checks.py fallback    the daemon unreachable: SGLang's forwards, counted
    python sglang_checks.py broken      a plugin whose layers fail to import: SGLang's layers
    python sglang_checks.py none        TILED_OPS=none: nothing replaced

SGLANG_USE_CPU_ENGINE=1 makes SGLang treat the host as its CPU platform (its rotary layers
need a platform); torchvision is the test stub (tests/integrations/sglang_stub).
"""

import json
import logging
import os
import sys

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
logging.basicConfig(level=logging.WARNING)
logging.getLogger("tiled_sglang").setLevel(logging.INFO)  # its start line

import torch

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


def _layers(dtype):
    """The layers as an SGLang model builds them (names looked up in SGLang's modules after
    the plugin's hooks were applied)."""
    from sglang.srt.layers import activation, layernorm
    from sglang.srt.layers.rotary_embedding import factory, get_rope

    factory._ROPE_DICT.clear()  # get_rope keeps its layers: build them anew here
    norm = layernorm.RMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 96))
    norm = norm.to(dtype)
    return {"RMSNorm": norm, "SiluAndMul": activation.SiluAndMul(),
            "GeluAndMul": activation.GeluAndMul("none"),
            "GeluAndMul_tanh": activation.GeluAndMul("tanh"),
            "RotaryEmbedding": get_rope(64, 64, 256, 10000, True, dtype=dtype),
            "RotaryEmbedding_gptj": get_rope(64, 64, 256, 10000, False, dtype=dtype),
            "RotaryEmbedding_partial": get_rope(64, 32, 256, 10000, True, dtype=dtype),
            "Llama3RotaryEmbedding": get_rope(64, 64, 256, 500000, True, rope_scaling=LLAMA3,
                                              dtype=dtype)}


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
    for name in ("RotaryEmbedding", "RotaryEmbedding_gptj", "RotaryEmbedding_partial",
                 "Llama3RotaryEmbedding"):
        rope = layers[name]
        tq, tk = rope(pos, q.clone(), k.clone())
        nq, nk = rope.forward_native(pos, q.clone(), k.clone())
        out[name] = max(_rel(tq, nq), _rel(tk, nk))
    return out


def _classes(layers) -> dict:
    """layer -> [its class, whether it is an instance of SGLang's class]."""
    from tiled_sglang import layers as tl

    return {n: [type(m).__name__, isinstance(m, tl.ORIGINAL[
        "RotaryEmbedding" if "Rotary" in n else n.split("_")[0]])]
            for n, m in layers.items()}


def main() -> dict:
    import tiled_sglang
    from sglang.kernels import fused_op
    from sglang.kernels.spec import KernelBackend
    from sglang.srt.layers import layernorm
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding, rope_variant
    from sglang.srt.plugins import load_plugins

    load_plugins()  # SGLang's own discovery of the entry point, then its hooks applied
    tiled_sglang.register()  # a second call does nothing
    res = {"status_after_load": tiled_sglang.status()}
    layers = _layers(torch.float32)
    res["classes"] = _classes(layers)
    res["tiled_is_rotary_base"] = isinstance(layers["Llama3RotaryEmbedding"], RotaryEmbedding)
    res["rope_variant_name"] = rope_variant.Llama3RotaryEmbedding.__name__
    res["numerics_float32"] = _numerics(layers, torch.float32)
    res["numerics_bfloat16"] = _numerics(_layers(torch.bfloat16), torch.bfloat16)
    before = tiled_sglang.status()["served"]
    os.environ["SGLANG_ROPE_CACHE_FP32"] = "1"  # the cache GPUs keep: fp32 beside bf16 q / k
    rope32 = _layers(torch.bfloat16)["RotaryEmbedding"]
    del os.environ["SGLANG_ROPE_CACHE_FP32"]
    pos, q, k = torch.arange(9), torch.randn(9, 256).bfloat16(), torch.randn(9, 128).bfloat16()
    tq, tk = rope32(pos, q.clone(), k.clone())
    nq, nk = rope32.forward_native(pos, q.clone(), k.clone())
    res["rope_fp32_cache"] = [str(rope32.cos_sin_cache.dtype), max(_rel(tq, nq), _rel(tk, nk))]

    # calls tiled does not take go to SGLang's own forward, counted as such
    norm = layers["RMSNorm"]
    x, r = torch.randn(6, 96), torch.randn(6, 96)
    post = torch.randn(6, 96)
    a, rr = norm(x.clone(), r.clone(), post)
    na, nr = norm.forward_native(x.clone(), r.clone(), post)
    rope = layers["RotaryEmbedding"]
    offs = torch.full((9,), 3)
    oq, ok = rope(pos, q.float().clone(), k.float().clone(), offs)
    noq, nok = rope.forward_native(pos, q.float().clone(), k.float().clone(), offs)
    res["untaken_err"] = max(_rel(a, na), _rel(rr, nr), _rel(oq, noq), _rel(ok, nok))
    after = tiled_sglang.status()["served"]
    res["untaken_counted"] = {key: after.get(key, 0) - before.get(key, 0)
                              for key in ("rms_norm/sglang", "rotary_embedding/sglang")}

    # a class derived later from the tiled one (a model's own norm) is not served by tiled
    class ModelNorm(layernorm.RMSNorm):
        def forward_native(self, x, residual=None, post_residual_addition=None,
                           quant_linear=None):
            return x * 2.0
    m = ModelNorm(96)
    res["derived_class_out"] = _rel(m(torch.ones(2, 96)), torch.full((2, 96), 2.0))

    # SGLang's switches: force_native and a forced backend keep SGLang's forward
    pinned = layernorm.RMSNorm(96, force_native=True)
    res["force_native_method"] = pinned._forward_method.__name__
    fused_op.set_fused_op_backend(KernelBackend.TORCH)
    n0 = tiled_sglang.status()["served"].get("rms_norm/tiled", 0)
    norm(torch.randn(3, 96))
    res["forced_torch_served_tiled"] = tiled_sglang.status()["served"].get(
        "rms_norm/tiled", 0) - n0
    fused_op.set_fused_op_backend(None)
    norm.enter_torch_compile(num_tokens=4)
    res["compile_mode_method"] = norm._forward_method.__name__
    norm.leave_torch_compile()

    h = torch.randn(5, 128)
    w = torch.rand(96) + 0.5
    opchecks = {}
    for name, op, args in (
            ("rms_norm", torch.ops.tiled.rms_norm.default, (x, w, 1e-6)),
            ("fused_add_rms_norm", torch.ops.tiled.fused_add_rms_norm.default,
             (x.clone(), r.clone(), w, 1e-6)),
            ("silu_and_mul", torch.ops.tiled.silu_and_mul.default, (h,)),
            ("gelu_and_mul", torch.ops.tiled.gelu_and_mul.default, (h, "tanh")),
            ("rotary_embedding", torch.ops.tiled.rotary_embedding.default,
             (pos, q.float().clone(), k.float().clone(), 64, rope.cos_sin_cache, True))):
        try:
            torch.library.opcheck(op, args)
            opchecks[name] = "ok"
        except Exception as e:  # reported, the test asserts
            opchecks[name] = repr(e)
    res["opcheck"] = opchecks
    compiled = {}
    n0 = tiled_sglang.status()["served"]
    for name in ("RMSNorm", "SiluAndMul", "GeluAndMul"):
        layer = layers[name]
        fn = torch.compile(layer.forward, fullgraph=True, dynamic=True, backend="aot_eager")
        errs = []
        for t in (3, 17):
            inp = torch.randn(t, 96 if name == "RMSNorm" else 128)
            errs.append(_rel(fn(inp), layer.forward_native(inp)))
        compiled[name] = max(errs)
    fn = torch.compile(rope.forward, fullgraph=True, dynamic=True, backend="aot_eager")
    tq, tk = fn(torch.arange(11), torch.randn(11, 256), torch.randn(11, 128))
    pos11, q11, k11 = torch.arange(11), torch.randn(11, 256), torch.randn(11, 128)
    tq, tk = fn(pos11, q11.clone(), k11.clone())
    nq, nk = rope.forward_native(pos11, q11.clone(), k11.clone())
    compiled["RotaryEmbedding"] = max(_rel(tq, nq), _rel(tk, nk))
    res["compiled"] = compiled
    res["status_end"] = tiled_sglang.status()
    return res


def fallback() -> dict:
    """TILED_SERVER names a daemon that is not there: every layer still answers, by SGLang's
    own forward, and the fallbacks are counted."""
    import tiled_sglang
    from sglang.srt.plugins import load_plugins

    load_plugins()
    errs = _numerics(_layers(torch.float32), torch.float32)
    return {"numerics": errs, "status": tiled_sglang.status()}


def broken() -> dict:
    """The plugin's layers fail to import: register() logs, returns, SGLang builds its own
    classes."""
    sys.modules["tiled_sglang.layers"] = None  # an import of it raises ImportError
    import tiled_sglang
    from sglang.srt.plugins import load_plugins

    load_plugins()
    layers = _layers(torch.float32)
    return {"status": tiled_sglang.status(), "classes": {n: type(m).__name__
                                                         for n, m in layers.items()}}


def none() -> dict:
    """TILED_OPS=none: the plugin loads and replaces nothing."""
    import tiled_sglang
    from sglang.srt.plugins import load_plugins

    load_plugins()
    layers = _layers(torch.float32)
    return {"status": tiled_sglang.status(), "classes": {n: type(m).__name__
                                                         for n, m in layers.items()}}


if __name__ == "__main__":
    result = {"main": main, "fallback": fallback, "broken": broken, "none": none}[sys.argv[1]]()
    print("RESULT " + json.dumps(result))
