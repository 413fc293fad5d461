"""The action key: a no-op edit keeps it, every semantic change alters it, and it is the same in
every process. Pure Python: these tests never import TVM."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tiled import config
from tiled.cache.keys import (
    DOMAIN,
    ActionKey,
    action_key,
    action_record,
    canonical_json,
    key_of_record,
)
from tiled.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROG = "a" * 64
TOOL = "b" * 64
OPTS = {"num_warps": 4, "unroll": True, "tiles": [64, 128], "cuda_compiler": "nvcc"}
BASE = dict(program_digest=PROG, target="cuda:sm_90a", options=OPTS, toolchain=TOOL,
            namespace="")
# Pinned: a change to the record or its encoding must bump "v" and DOMAIN, not slip through.
GOLDEN = "28945af6eaa1cd6e8a39aed253b6f8522caf041fa0cc8d85c46391b6f5fa39bd"


def key(**changes):
    return action_key(**{**BASE, **changes})


def test_record_is_the_documented_one():
    rec = action_record(**BASE)
    assert rec == {"v": 1, "program": PROG,
                   "target": {"backend": "cuda", "arch": "sm_90a", "features": []},
                   "options": {"cuda_compiler": "nvcc", "num_warps": 4, "tiles": [64, 128],
                               "unroll": True},
                   "toolchain": TOOL, "namespace": ""}
    text = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
    assert canonical_json(rec) == text
    assert key() == hashlib.sha256(b"tiled.action.v1\0" + text).hexdigest() == key_of_record(rec)
    assert DOMAIN == b"tiled.action.v1\0"


def test_key_is_pinned():
    assert key() == GOLDEN


def test_action_key_object():
    k = ActionKey.build(**BASE)
    assert k.hex == str(k) == key() and k.record == action_record(**BASE)
    assert k == ActionKey(key(), {}) and len({k, ActionKey.build(**BASE)}) == 1


def test_same_inputs_same_key_in_a_fresh_process():
    code = ("import sys, json; from tiled.cache.keys import action_key; "
            f"print(action_key(**json.loads({json.dumps(json.dumps(BASE))}))); "
            "print('tvm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == [key(), "False"]  # same key, and tiled.cache.keys stays TVM-free


@pytest.mark.parametrize("change", [
    dict(program_digest="c" * 64),
    dict(target="cpu"),
    dict(target="rocm:sm_90a"),
    dict(target="cuda:sm_80"),
    dict(target={"backend": "cuda", "arch": "sm_90a", "features": ["fast_math"]}),
    dict(options={**OPTS, "num_warps": 8}),
    dict(options={**OPTS, "unroll": False}),
    dict(options={**OPTS, "unroll": 1}),  # true and 1 are different options
    dict(options={**OPTS, "tiles": [128, 64]}),
    dict(options={**OPTS, "cuda_compiler": "nvrtc"}),
    dict(options={**OPTS, "extra": 0}),
    dict(options={k: v for k, v in OPTS.items() if k != "unroll"}),
    dict(toolchain="d" * 64),
    dict(namespace="bad-nvcc-2025-06"),
])
def test_each_field_changes_the_key(change):
    assert key(**change) != key()


def test_spellings_that_mean_the_same_share_a_key():
    assert key(options=dict(reversed(list(OPTS.items())))) == key()
    assert key(options={**OPTS, "tiles": (64, 128)}) == key()
    assert key(options={**OPTS, "stages": None}) == key()  # None: the default
    assert key(target={"backend": "cuda", "arch": "sm_90a"}) == key()
    feats = {"backend": "cuda", "arch": "sm_90a", "features": ["b", "a"]}
    assert key(target=feats) == key(target={**feats, "features": ["a", "b", "a"]})
    assert key(options={}) == key(options=None)


class Opaque:
    pass


@pytest.mark.parametrize("options,match", [
    ({"num_warps": Opaque()}, r"option 'num_warps' = .*Opaque"),
    ({"tiles": [64, {1, 2}]}, r"option 'tiles'\[1\]"),
    ({"cfg": {"a": {"b": b"raw"}}}, r"option 'cfg'\.a\.b"),
    ({"cfg": {1: "x"}}, r"option 'cfg' has a non-string key 1"),
    ({"scale": float("nan")}, r"option 'scale' = nan is not a finite number"),
    ({3: "x"}, r"option name 3"),
])
def test_non_json_option_is_a_value_error_naming_it(options, match):
    with pytest.raises(ValueError, match=match):
        key(options=options)


@pytest.mark.parametrize("change", [dict(program_digest="xyz"), dict(toolchain="B" * 64),
                                    dict(target=""), dict(target={"arch": "sm_80"}),
                                    dict(namespace=None)])
def test_malformed_fields_are_value_errors(change):
    with pytest.raises(ValueError):
        key(**change)


def test_namespace_setting(monkeypatch):
    assert config.get("cache_namespace") == ""
    monkeypatch.setenv("TILED_CACHE_NAMESPACE", "v2")
    assert config.get("cache_namespace") == "v2"
    with config.override(cache_namespace="v3"):
        assert config.get("cache_namespace") == "v3"
    with pytest.raises(ConfigError):
        with config.override(cache_namespac="typo"):
            pass


def make_kernel(block=64, acc_name=False):
    """A small tiled kernel; `acc_name` renames its locals (a no-op edit)."""
    N = T.dyn("N")
    if not acc_name:
        @tiled.kernel
        def scale(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, block), threads=128) as bx:
                tile = T.alloc_fragment((block,), "float32")
                T.copy(A[bx * block], tile)
                for i in T.Parallel(block):
                    tile[i] = tile[i] * 2.0
                T.copy(tile, B[bx * block])
    else:
        @tiled.kernel
        def scale(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, block), threads=128) as block_x:
                acc = T.alloc_fragment((block,), "float32")
                T.copy(A[block_x * block], acc)
                for j in T.Parallel(block):
                    acc[j] = acc[j] * 2.0
                T.copy(acc, B[block_x * block])
    return scale


def test_noop_edit_keeps_the_key_semantic_edit_changes_it():
    base, renamed, retiled = make_kernel(), make_kernel(acc_name=True), make_kernel(block=128)
    assert base.ir != renamed.ir  # the names really differ in the IR...
    assert key(program_digest=renamed.ir.digest) == key(program_digest=base.ir.digest)
    assert key(program_digest=retiled.ir.digest) != key(program_digest=base.ir.digest)
