"""integrations/vllm (the tiled_vllm plugin) against the real vllm 0.33.0 on CPU: the checks
run in the vLLM venv (vllm_checks.py; scripts/plugin_venv.sh vllm builds it from
integrations/vllm/constraints.txt), their kernels compiled by a real `tiled serve` started
here, since the plugin's venv has only the thin tiled (vLLM pins an apache-tvm-ffi the
compiler cannot use).

The venv is TILED_VLLM_PYTHON, default .venvs/vllm/bin/python. Without it the tests skip,
saying so, unless TILED_REQUIRE_VLLM=1 (scripts/test.sh sets it): then they fail."""

from pathlib import Path

import pytest

from tests.daemon_util import start_daemon, stop_daemon
from tests.integrations.plugin_util import framework_python
from tests.integrations.plugin_util import run_checks as _run

CHECKS = Path(__file__).with_name("vllm_checks.py")
ALL = ["gelu_and_mul", "rms_norm", "rotary_embedding", "silu_and_mul"]
LAYERS = ["RMSNorm", "SiluAndMul", "GeluAndMul", "GeluAndMul_tanh", "RotaryEmbedding",
          "RotaryEmbedding_gptj", "Llama3RotaryEmbedding"]


def run_checks(mode: str, env: dict) -> dict:
    return _run(framework_python("vllm"), CHECKS, mode, env)


@pytest.fixture(scope="module")
def main(tmp_path_factory):
    framework_python("vllm")
    d = start_daemon(tmp_path_factory.mktemp("vllm-daemon"), "--workers", "1", "--timeout",
                     "300")
    try:
        yield run_checks("main", {"TILED_SERVER": d["address"]})
    finally:
        stop_daemon(d)


def test_vllms_plugin_loader_finds_and_registers_the_plugin(main):
    st = main["status_after_load"]
    assert st["registered"] == ALL and st["error"] is None
    assert "tiled_vllm: active for" in main["log"]


def test_the_tiled_classes_are_built_under_every_custom_ops_setting(main):
    want = {"RMSNorm": "TiledRMSNorm", "SiluAndMul": "TiledSiluAndMul",
            "GeluAndMul": "TiledGeluAndMul", "GeluAndMul_tanh": "TiledGeluAndMul",
            "RotaryEmbedding": "TiledRotaryEmbedding",
            "RotaryEmbedding_gptj": "TiledRotaryEmbedding",
            "Llama3RotaryEmbedding": "TiledLlama3RotaryEmbedding"}
    for ops, layers in main["classes"].items():
        assert {n: c for n, (c, _) in layers.items()} == want, ops
        on = {n: enabled for n, (_, enabled) in layers.items()}
        off = set()
        if "-RMSNorm" in ops or "-rms_norm" in ops:
            off.add("RMSNorm")
        if "-silu_and_mul" in ops:
            off.add("SiluAndMul")
        if "-RotaryEmbedding" in ops:
            off |= {"RotaryEmbedding", "RotaryEmbedding_gptj", "Llama3RotaryEmbedding"}
        assert {n for n, e in on.items() if not e} == off, ops  # on even under "none"


def test_every_replaced_layer_matches_its_native_forward(main):
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        errs = main[f"numerics_{dtype}"]
        assert set(errs) == {*LAYERS, "RMSNorm_residual"}
        assert all(e < tol for e in errs.values()), (dtype, errs)
    served = main["status_end"]["served"]
    assert all(served.get(f"{op}/tiled", 0) > 0 for op in ALL), served
    assert not any(k.endswith("/native") for k in served), served  # none fell back


def test_vllms_ir_dispatch_picks_tiled_when_asked(main):
    assert main["ir_rms_norm_provider"] == "tiled" and main["ir_fused_provider"] == "tiled"
    assert main["ir_rms_norm_err"] < 1e-5
    assert main["ir_rms_norm_var_size_provider"] == "native"  # an argument tiled refuses


def test_opcheck_and_torch_compile_on_the_replaced_layers(main):
    assert set(main["opcheck"].values()) == {"ok"}, main["opcheck"]
    assert set(main["compiled"]) == {"RMSNorm", "SiluAndMul", "GeluAndMul", "RotaryEmbedding"}
    assert all(e < 1e-5 for e in main["compiled"].values()), main["compiled"]


def test_an_unreachable_daemon_falls_back_to_the_native_forward(tmp_path):
    out = run_checks("fallback", {"TILED_SERVER": f"unix://{tmp_path}/nobody.sock"})
    assert all(e == 0.0 for e in out["numerics"].values()), out["numerics"]
    served = out["status"]["served"]
    assert all(served.get(f"{op}/native", 0) > 0 for op in ALL), served
    assert not any(k.endswith("/tiled") for k in served), served
    assert "runs vLLM's native forward (ServerUnavailable" in out["log"]


def test_a_plugin_error_never_reaches_vllm():
    out = run_checks("broken", {})
    assert out["status"]["registered"] == []
    assert "import of tiled_vllm.layers halted" in out["status"]["error"]
    assert out["classes"]["RMSNorm"] == "RMSNorm"  # vLLM's own layers
    assert "tiled_vllm: not active" in out["log"]
