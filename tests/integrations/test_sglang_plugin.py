"""integrations/sglang (the tiled_sglang plugin) against the real sglang 0.5.23 on CPU: the
checks run in the SGLang venv (sglang_checks.py; scripts/plugin_venv.sh sglang builds it from
integrations/sglang/constraints.txt), their kernels compiled by a real `tiled serve` started
here (the plugin's venv has only the thin tiled).

sglang.srt.layers imports torchvision, whose PyPI builds need a CUDA torch; the checks run with
a stand-in torchvision on their path (sglang_stub/torchvision), which the plugin never uses.

The venv is TILED_SGLANG_PYTHON, default .venvs/sglang/bin/python. Without it the tests skip,
saying so, unless TILED_REQUIRE_SGLANG=1 (scripts/test.sh sets it): then they fail."""

from pathlib import Path

import pytest

from tests.daemon_util import start_daemon, stop_daemon
from tests.integrations.plugin_util import framework_python
from tests.integrations.plugin_util import run_checks as _run

HERE = Path(__file__).parent
CHECKS = HERE / "sglang_checks.py"
ALL = ["gelu_and_mul", "rms_norm", "rotary_embedding", "silu_and_mul"]
LAYERS = ["RMSNorm", "SiluAndMul", "GeluAndMul", "GeluAndMul_tanh", "RotaryEmbedding",
          "RotaryEmbedding_gptj", "RotaryEmbedding_partial", "Llama3RotaryEmbedding"]


def run_checks(mode: str, env: dict) -> dict:
    return _run(framework_python("sglang"), CHECKS, mode,
                {"PYTHONPATH": str(HERE / "sglang_stub"), **env})


@pytest.fixture(scope="module")
def main(tmp_path_factory):
    framework_python("sglang")
    d = start_daemon(tmp_path_factory.mktemp("sglang-daemon"), "--workers", "1",
                     "--timeout", "300")
    try:
        yield run_checks("main", {"TILED_SERVER": d["address"]})
    finally:
        stop_daemon(d)


def test_sglangs_plugin_loader_finds_the_plugin_and_applies_its_hooks(main):
    st = main["status_after_load"]
    assert sorted(st["registered"]) == ALL and st["error"] is None
    assert st["registered"]["rms_norm"] == ["RMSNorm"]
    rotary = st["registered"]["rotary_embedding"]
    assert {"RotaryEmbedding", "Llama3RotaryEmbedding", "YaRNScalingRotaryEmbedding",
            "LinearScalingRotaryEmbedding"} <= set(rotary)
    assert "MRotaryEmbedding" not in rotary  # its own forward: SGLang's
    assert "tiled_sglang: active for" in main["log"]


def test_sglang_builds_the_tiled_classes_which_stay_sglangs_classes(main):
    want = {"RMSNorm": "TiledRMSNorm", "SiluAndMul": "TiledSiluAndMul",
            "GeluAndMul": "TiledGeluAndMul", "GeluAndMul_tanh": "TiledGeluAndMul",
            "RotaryEmbedding": "TiledRotaryEmbedding",
            "RotaryEmbedding_gptj": "TiledRotaryEmbedding",
            "RotaryEmbedding_partial": "TiledRotaryEmbedding",
            "Llama3RotaryEmbedding": "TiledLlama3RotaryEmbedding"}
    assert {n: c for n, (c, _) in main["classes"].items()} == want
    assert all(sub for _, sub in main["classes"].values())  # isinstance of SGLang's class
    assert main["tiled_is_rotary_base"]  # a Llama 3 rotary is a (replaced) RotaryEmbedding
    assert main["rope_variant_name"] == "TiledLlama3RotaryEmbedding"  # stale names rebound


def test_every_replaced_layer_matches_its_native_forward(main):
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        errs = main[f"numerics_{dtype}"]
        assert set(errs) == {*LAYERS, "RMSNorm_residual"}
        assert all(e < tol for e in errs.values()), (dtype, errs)
    cache_dtype, err = main["rope_fp32_cache"]  # the fp32 cache SGLang keeps on GPUs
    assert cache_dtype == "torch.float32" and err < 2e-2
    served = main["status_end"]["served"]
    assert all(served.get(f"{op}/tiled", 0) > 0 for op in ALL), served


def test_calls_tiled_does_not_take_run_sglangs_forward_counted(main):
    assert main["untaken_err"] < 1e-6  # a post-residual addition, rotary offsets
    assert main["untaken_counted"] == {"rms_norm/sglang": 1, "rotary_embedding/sglang": 1}
    assert main["derived_class_out"] < 1e-6  # a class derived from the tiled one: its own


def test_sglangs_own_switches_keep_working(main):
    assert main["force_native_method"] == "forward_native"
    assert main["forced_torch_served_tiled"] == 0  # SGLANG_FORCE_FUSED_OP_BACKEND=torch
    assert main["compile_mode_method"] == "forward_native"  # SGLang's torch.compile mode


def test_opcheck_and_torch_compile_on_the_replaced_layers(main):
    assert set(main["opcheck"].values()) == {"ok"}, main["opcheck"]
    assert set(main["compiled"]) == {"RMSNorm", "SiluAndMul", "GeluAndMul", "RotaryEmbedding"}
    assert all(e < 1e-5 for e in main["compiled"].values()), main["compiled"]


def test_an_unreachable_daemon_falls_back_to_sglangs_forward(tmp_path):
    out = run_checks("fallback", {"TILED_SERVER": f"unix://{tmp_path}/nobody.sock"})
    assert all(e == 0.0 for e in out["numerics"].values()), out["numerics"]
    served = out["status"]["served"]
    assert all(served.get(f"{op}/sglang", 0) > 0 for op in ALL), served
    assert not any(k.endswith("/tiled") for k in served), served
    assert "runs SGLang's own forward (ServerUnavailable" in out["log"]


def test_a_plugin_error_never_reaches_sglang():
    out = run_checks("broken", {})
    assert out["status"]["registered"] == {}
    assert "import of tiled_sglang.layers halted" in out["status"]["error"]
    assert out["classes"]["RMSNorm"] == "RMSNorm"  # SGLang's own layers
    assert "tiled_sglang: not active" in out["log"]


def test_tiled_ops_none_replaces_nothing():
    out = run_checks("none", {"TILED_OPS": "none"})
    assert out["status"]["registered"] == {} and out["status"]["error"] is None
    assert set(out["classes"].values()) == {"RMSNorm", "SiluAndMul", "GeluAndMul",
                                            "RotaryEmbedding", "Llama3RotaryEmbedding"}
