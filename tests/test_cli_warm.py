"""`tiled warm MANIFEST` against a real daemon subprocess: requests built from a manifest, sent
in one Warm call, results counted; a bad manifest is refused before anything is sent."""

import json
import os

import pytest

from tests.daemon_util import ROOT, running_daemon, tiled_cli
from tiled.cli_warm import chunks, load_manifest
from tiled.v1 import compile_pb2 as cpb

NO_DAEMON = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_SERVER": "unix:///nonexistent/t.sock",
             "TILED_CLIENT_RETRIES": "0"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, library_memo):
    with running_daemon(tmp_path_factory.mktemp("warm-daemon"), library_memo) as d:
        yield d


def example(tmp_path, name):
    """An example's path relative to the manifest's folder (the manifest's own convention)."""
    return os.path.relpath(ROOT / "examples" / name, tmp_path)


def write_yaml(tmp_path, text, name="warm.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_first_run_compiles_second_run_hits(daemon, tmp_path):
    manifest = write_yaml(tmp_path, f"""
kernels:
  - kernel: {example(tmp_path, "elementwise.py")}:add
    shapes: [{{block: 128}}, {{block: 256}}]
    targets: [cpu]
  - kernel: {example(tmp_path, "softmax.py")}:softmax
    args: {{block_M: 4}}
    shapes: [{{N: 16}}, {{N: 32}}]
targets: [cpu]
""")
    first = tiled_cli("warm", str(manifest), env=daemon["env"])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 requests: 0 cache hits, 4 compiled, 0 failed" in first.stdout
    assert "(1 Warm call)" in first.stdout
    assert first.stdout.count("compiled ") == 4  # one line per result off a terminal
    second = tiled_cli("warm", str(manifest), "--server", daemon["address"], env=NO_DAEMON)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "4 requests: 4 cache hits, 0 compiled, 0 failed" in second.stdout
    dry = tiled_cli("warm", "--dry-run", str(manifest), env=daemon["env"])
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "4 requests: 4 cached, 0 to compile, 0 would fail" in dry.stdout


def test_json_manifest_lists_each_failure_with_its_code(daemon, tmp_path):
    manifest = tmp_path / "warm.json"
    manifest.write_text(json.dumps({"kernels": [
        {"kernel": f"{example(tmp_path, 'elementwise.py')}:add", "args": {"block": 64},
         "targets": ["cpu", "cuda:sm_12"]}]}))
    dry = tiled_cli("warm", "--dry-run", str(manifest), env=daemon["env"])
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert "1 to compile, 1 would fail" in dry.stdout and "UNIMPLEMENTED" in dry.stdout
    out = tiled_cli("warm", str(manifest), env=daemon["env"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 requests: 0 cache hits, 1 compiled, 1 failed" in out.stdout
    failure = out.stdout.split("FAILED ", 1)[1]
    assert "elementwise.py:add(block=64) -> cuda:sm_12" in failure
    assert "UNIMPLEMENTED: " in failure and "sm_12" in failure.split("UNIMPLEMENTED: ")[1]


@pytest.mark.parametrize("text, message", [
    ("kernels:\n  - kernel: nothere.py:add\n", "kernels[0] (nothere.py:add): no such file"),
    ("kernels:\n  - kernel: {ew}:add\n    shape: [{{block: 64}}]\n",
     "kernels[0] ({ew}:add): unknown key 'shape'; did you mean 'shapes'?"),
    ("kernels:\n  - kernel: {ew}:add\n  - kernel: {ew}:add\n    args: {{blk: 64}}\n",
     "kernels[1] ({ew}:add): bad args: got an unexpected keyword argument 'blk'"),
    ("kernels:\n  - kernel: {ew}:add\n    shapes: [{{block: 64}}, {{dtype: float99}}]\n",
     "kernels[0] ({ew}:add) shapes[1]: fails to trace"),
    ("kernels:\n  - kernel: {ew}:sub\n", "has no attribute 'sub'"),
    ("kernels:\n  - kernel: {ew}:add\n    targets: []\n", "`targets` must be"),
    ("kernels: [{{kernel: [a}}\n", "not valid YAML"),
    ("- kernel: {ew}:add\n", "expected a mapping with a `kernels:` list"),
])
def test_bad_manifest_exits_2_naming_entry_and_problem(tmp_path, text, message):
    ew = example(tmp_path, "elementwise.py")
    manifest = write_yaml(tmp_path, text.format(ew=ew))
    out = tiled_cli("warm", str(manifest), env=NO_DAEMON)
    assert out.returncode == 2, out.stdout + out.stderr
    assert str(manifest) in out.stderr and message.format(ew=ew) in out.stderr, out.stderr
    assert out.stdout == ""  # nothing was sent


def test_bad_json_and_missing_manifest_exit_2(tmp_path):
    bad = tmp_path / "warm.json"
    bad.write_text('{"kernels": [}')
    out = tiled_cli("warm", str(bad), env=NO_DAEMON)
    assert out.returncode == 2 and f"{bad}:1:14: not valid JSON" in out.stderr
    out = tiled_cli("warm", str(tmp_path / "absent.yaml"), env=NO_DAEMON)
    assert out.returncode == 2 and "no such manifest file" in out.stderr


def test_dry_run_without_daemon_lists_requests(tmp_path):
    manifest = tmp_path / "warm.json"
    manifest.write_text(json.dumps({"targets": ["cpu", "local"], "kernels": [
        {"kernel": f"{example(tmp_path, 'softmax.py')}:softmax", "shapes": [{"N": 16}]}]}))
    out = tiled_cli("warm", "--dry-run", str(manifest), env=NO_DAEMON)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dry run: 2 requests" in out.stdout and "cache state unknown" in out.stdout
    assert out.stdout.count("would send") == 2 and "softmax(N=16) -> local" in out.stdout


def test_warm_without_daemon_fails_every_item_as_unavailable(tmp_path):
    manifest = write_yaml(tmp_path, f"kernels:\n  - kernel: {example(tmp_path, 'softmax.py')}"
                                    ":softmax\n    targets: cpu\n")
    out = tiled_cli("warm", str(manifest), env=NO_DAEMON)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout and "UNAVAILABLE: no result" in out.stdout


def test_requests_split_into_warm_calls_below_the_limit(tmp_path):
    manifest = write_yaml(tmp_path, f"""
kernels:
  - kernel: {example(tmp_path, "elementwise.py")}:add
    shapes: [{{block: 64}}, {{block: 128}}, {{block: 256}}]
    targets: [cpu, local]
""")
    items = load_manifest(manifest)
    assert [(i.args["block"], i.target) for i in items] == [
        (64, "cpu"), (64, "local"), (128, "cpu"), (128, "local"), (256, "cpu"), (256, "local")]
    size = max(i.request.ByteSize() for i in items) + 8
    runs = chunks(items, limit=2 * size)
    assert [len(r) for r in runs] == [2, 2, 2]
    assert [i for r in runs for i in r] == items
    assert chunks(items, limit=1) == [[i] for i in items]  # one too large still travels
    assert len(chunks(items)) == 1


TUNED = '''
import tiled
import tiled.lang as T


@tiled.autotune(configs=[{"bm": 16}, {"bm": 32}], key=["M", "N"], warmup_ms=1, rep_ms=5)
def scale(M, N, bm=16):
    @tiled.kernel
    def k(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            for i, j in T.Parallel(bm, N):
                Y[bx * bm + i, j] = X[bx * bm + i, j] * 2.0
    return k
'''


def test_an_autotuned_entry_warms_every_config_then_tunes_here_once(daemon, tmp_path):
    """A config with its own compile options is a request of its own (same program)."""
    (tmp_path / "tuned.py").write_text(TUNED.replace(
        '{"bm": 32}]', '{"bm": 32}, {"bm": 32, "compile_options": {"safe_access": False}}]'))
    manifest = write_yaml(tmp_path, """
kernels:
  - kernel: tuned.py:scale
    shapes: [{M: 64, N: 32}]
targets: [cpu]
""")
    first = tiled_cli("warm", str(manifest), env=daemon["env"])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 requests: 0 cache hits, 3 compiled, 0 failed" in first.stdout
    assert "tuned kernels[0] tuned.py:scale(M=64, N=32): config {'bm': " in first.stdout
    assert "timed 3 candidates" in first.stdout
    second = tiled_cli("warm", str(manifest), env=daemon["env"])
    assert second.returncode == 0, second.stdout + second.stderr
    assert "3 requests: 3 cache hits, 0 compiled, 0 failed" in second.stdout
    assert "recorded before" in second.stdout
    chosen = [line for line in first.stdout.splitlines() if line.startswith("tuned ")]
    assert chosen[0].split("config ")[1].split(" (")[0] in second.stdout


def test_autotune_through_a_daemon_compiles_there_and_times_here(daemon, tmp_path):
    """With TILED_SERVER set the candidates compile on the daemon (its compile count grows by
    one per config) and the tuning key's toolchain is the daemon's; timing and the record
    stay in this process."""
    import importlib.util

    from tiled import config, tuning
    from tiled.cache import tiered

    (tmp_path / "tuned2.py").write_text(TUNED.replace('{"bm": 32}]', '{"bm": 64}]'))
    spec = importlib.util.spec_from_file_location("tuned2", tmp_path / "tuned2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = daemon["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60).compiles_total
    tiered._DEFAULT.clear()
    with config.override(server=daemon["address"], cache_dir=tmp_path / "client-cache"):
        timed = tuning.STATS["candidates_timed"]
        tuned = module.scale(96, 32)
        assert tuned.config in ({"bm": 16}, {"bm": 64}) and not tuned.from_record
        assert tuning.STATS["candidates_timed"] == timed + 2
    after = daemon["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=60).compiles_total
    assert after == before + 2


def test_model_config_warms_the_ops_kernels_of_that_model(daemon, tmp_path):
    """`tiled warm --model-config`: the norms', the gated activation's and the rotary's
    kernels for the daemon's local target (cpu here), compiled once, hits after."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "torch_dtype": "float32"}))
    first = tiled_cli("warm", "--model-config", str(cfg), env=daemon["env"])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 requests: 0 cache hits, 4 compiled, 0 failed" in first.stdout
    for op in ("rms_norm", "fused_add_rms_norm", "gated_activation", "rotary_embedding"):
        assert f"tiled.ops:{op}(" in first.stdout, first.stdout
    again = tiled_cli("warm", "--model-config", str(cfg), "--target", "cpu",
                      "--tensor-parallel-size", "1", env=daemon["env"])
    assert "4 requests: 4 cache hits, 0 compiled, 0 failed" in again.stdout, again.stdout
    sglang = tiled_cli("warm", "--model-config", str(cfg), "--framework", "sglang",
                       env=daemon["env"])  # on CPU SGLang's plugin asks for the same kernels
    assert "4 requests: 4 cache hits, 0 compiled, 0 failed" in sglang.stdout, sglang.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 64}))
    out = tiled_cli("warm", "--model-config", str(bad), "--target", "cpu", env=daemon["env"])
    assert out.returncode == 2 and "intermediate_size" in out.stdout + out.stderr
    both = tiled_cli("warm", str(bad), "--model-config", str(cfg), env=daemon["env"])
    assert both.returncode == 2 and "one" in both.stdout + both.stderr
