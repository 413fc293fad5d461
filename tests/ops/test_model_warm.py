"""tiled.ops.model_warm: the warm set of a model's config.json names exactly the kernels the
ops compile for that model's layers (same factory parameters, so the same programs), split
over tensor-parallel ranks; configs it cannot read get an error naming the key."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled.ops import kernel_factory
from tiled.ops.model_warm import ModelConfigError, warm_set

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "torch_dtype": "float32", "max_position_embeddings": 256}
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "hidden_act": "silu",
             "torch_dtype": "bfloat16", "rope_theta": 500000.0}


def test_the_warm_set_is_what_the_ops_compile_for_the_model(monkeypatch):
    """Run the model's layers' ops on CPU tensors of its shapes; every kernel they asked for
    is in the warm set with the same parameters, and the other way round."""
    asked, real = set(), ops._kernel

    def kernel(op, like, **params):
        asked.add((op, tuple(sorted(params.items()))))
        return real(op, like, **params)
    monkeypatch.setattr(ops, "_kernel", kernel)
    T, H, KV, D = 3, 4, 2, 16
    x, r, w = torch.randn(T, 64), torch.randn(T, 64), torch.rand(64)
    ops.rms_norm(x, w, 1e-5)
    ops.fused_add_rms_norm(x, r, w, 1e-5)
    ops.silu_and_mul(torch.randn(T, 2 * 128))
    cache = torch.randn(256, D)
    ops.rotary_embedding(torch.arange(T), torch.randn(T, H * D), torch.randn(T, KV * D), D,
                         cache, True)
    assert asked == {(op, tuple(sorted(p.items()))) for op, p in warm_set(SMALL)}
    for op, p in warm_set(SMALL):  # and they build (the programs the daemon would compile)
        assert kernel_factory(op, "cpu", **p).ir.digest


def test_tensor_parallel_ranks_split_heads_and_the_mlp():
    full, tp4 = dict(warm_set(LLAMA3_8B)), dict(warm_set(LLAMA3_8B, tensor_parallel_size=4))
    assert full["rms_norm"] == tp4["rms_norm"] == {"N": 4096, "dtype": "bfloat16",
                                                   "eps": 1e-5}
    assert full["gated_activation"]["N"] == 14336 and tp4["gated_activation"]["N"] == 3584
    assert (tp4["rotary_embedding"]["heads"], tp4["rotary_embedding"]["kv_heads"]) == (8, 2)
    assert full["rotary_embedding"]["head_size"] == full["rotary_embedding"]["rot_dim"] == 128
    # A multimodal config nests the language model's keys.
    assert warm_set({"text_config": LLAMA3_8B, "model_type": "llava"}) == warm_set(LLAMA3_8B)


@pytest.mark.parametrize("change,message", [
    ({"hidden_size": None}, "`hidden_size` must be a positive integer"),
    ({"hidden_act": "relu2"}, "hidden_act 'relu2'"),
    ({"torch_dtype": "int8"}, "dtype 'int8'"),
    ({"partial_rotary_factor": 0.01}, "partial_rotary_factor"),
])
def test_configs_it_cannot_read_name_the_key(change, message):
    cfg = {**LLAMA3_8B, **change}
    if change.get("hidden_size", 0) is None:
        del cfg["hidden_size"]
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(")):
        warm_set(cfg)
    with pytest.raises(ModelConfigError, match="does not split over 3"):
        warm_set(LLAMA3_8B, tensor_parallel_size=3)


def test_sglang_on_a_gpu_passes_a_float32_rotary_cache():
    vllm = dict(warm_set(LLAMA3_8B, target="cuda:sm_90a"))
    sglang_gpu = dict(warm_set(LLAMA3_8B, framework="sglang", target="cuda:sm_90a"))
    sglang_cpu = dict(warm_set(LLAMA3_8B, framework="sglang", target="cpu"))
    assert vllm["rotary_embedding"]["cache_dtype"] == "bfloat16"  # vLLM casts it
    assert sglang_gpu["rotary_embedding"]["cache_dtype"] == "float32"  # SGLang keeps fp32
    assert sglang_cpu == dict(warm_set(LLAMA3_8B))  # and casts on CPU
    assert {k: v for k, v in sglang_gpu.items() if k != "rotary_embedding"} == \
        {k: v for k, v in vllm.items() if k != "rotary_embedding"}
    with pytest.raises(ModelConfigError, match="framework 'tgi'"):
        warm_set(LLAMA3_8B, framework="tgi")
