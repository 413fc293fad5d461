"""Compiling through a cache tier: ten identical requests compile once, a hit returns the stored
bytes without running the backend, a bad entry is recompiled (never served), and a failed write
still returns a working kernel."""

import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cache.fakes import DictTier
from tiled import config
from tiled.cache.entry import CountingEvents, Entry
from tiled.compiler import CompiledKernel
from tiled.compiler.cached import compile_cached, compile_key
from tiled.compiler.registry import get_backend, parse_target
from tiled.errors import CacheWriteError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import elementwise

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

KERNEL = elementwise.add(block=256, threads=64)
OTHER = elementwise.add(block=512, threads=64)
_ARTIFACTS = {}  # program digest -> the backend's Artifact: one real compile per module


class FullTier(DictTier):
    def put(self, entry):
        raise CacheWriteError("disk full (test)")


@pytest.fixture(autouse=True)
def _scoped_config(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield


@pytest.fixture
def backend_calls(monkeypatch):
    """Counts the cpu backend's compiles; the first compile of a program is real, repeats
    return its artifact (the bytes a recompile would give)."""
    backend = get_backend("cpu")
    real = type(backend).compile
    calls = []

    def counting(program, target, options):
        calls.append(program.digest)
        if program.digest not in _ARTIFACTS:
            _ARTIFACTS[program.digest] = real(backend, program, target, options)
        return _ARTIFACTS[program.digest]

    monkeypatch.setattr(backend, "compile", counting)
    return calls


def run_vadd(kernel: CompiledKernel, n=1000):
    a, b = np.arange(n, dtype="float32"), np.full(n, 0.5, "float32")
    c = np.zeros(n, "float32")
    kernel(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_cold_compile_puts_an_entry(backend_calls):
    tier = DictTier()
    kernel, hit = compile_cached(KERNEL, "cpu", tier)
    assert not hit and len(backend_calls) == 1
    key = compile_key(KERNEL.ir, parse_target("cpu"), {})
    assert tier.keys() == [key]
    entry = tier.entries[key]
    assert entry.manifest == kernel.manifest.to_json().encode()
    assert entry.blobs == {kernel.manifest.artifact_sha256: kernel.artifact}
    run_vadd(kernel)


def test_hit_returns_the_stored_kernel_without_compiling(backend_calls):
    tier = DictTier()
    cold, _ = compile_cached(KERNEL, "cpu", tier)
    warm, hit = compile_cached(KERNEL, "cpu", tier)
    assert hit and len(backend_calls) == 1
    assert warm.artifact == cold.artifact and warm.manifest == cold.manifest
    assert warm.source is None and "lookup" in warm.stages
    run_vadd(warm, n=777)


def test_ten_identical_requests_compile_once(backend_calls):
    tier = DictTier()
    results = [compile_cached(KERNEL, "cpu", tier, options={"safe_access": None})
               for _ in range(10)]
    assert len(backend_calls) == 1 and tier.puts == 1
    assert [hit for _, hit in results] == [False] + [True] * 9
    assert len({k.artifact for k, _ in results}) == 1
    # A different program, or the same one under another namespace, is another action.
    assert not compile_cached(OTHER, "cpu", tier)[1]
    with config.override(cache_namespace="new-toolchain"):
        assert not compile_cached(KERNEL, "cpu", tier)[1]
    assert len(backend_calls) == 3 and len(tier.entries) == 3


def _corrupt_blob(entry, other):
    (digest, data), = entry.blobs.items()
    return Entry(entry.key, entry.manifest, {digest: data[:-1] + bytes([data[-1] ^ 1])})


def _missing_blob(entry, other):
    return Entry(entry.key, entry.manifest, {})


def _bad_manifest(entry, other):
    return Entry(entry.key, b'{"manifest_version": 1, "name": ', entry.blobs)


def _other_program(entry, other):  # a valid entry filed under the wrong key
    return Entry(entry.key, other.manifest, other.blobs)


@pytest.mark.parametrize("damage", [_corrupt_blob, _missing_blob, _bad_manifest, _other_program])
def test_an_unusable_entry_is_recompiled_never_served(backend_calls, damage, caplog):
    tier, events = DictTier(), CountingEvents()
    good, _ = compile_cached(KERNEL, "cpu", tier)
    compile_cached(OTHER, "cpu", tier)
    key = compile_key(KERNEL.ir, parse_target("cpu"), {})
    other_key = compile_key(OTHER.ir, parse_target("cpu"), {})
    tier.entries[key] = damage(tier.entries[key], tier.entries[other_key])
    with caplog.at_level(logging.WARNING, logger="tiled.cache"):
        kernel, hit = compile_cached(KERNEL, "cpu", tier, events=events)
    assert not hit and len(backend_calls) == 3
    assert kernel.artifact == good.artifact and kernel.manifest == good.manifest
    assert events.get("lookup", "dict", "corrupt") == 1 and "unusable" in caplog.text
    # The bad entry was replaced, so the next request is a hit again.
    assert tier.entries[key].manifest == good.manifest.to_json().encode()
    assert compile_cached(KERNEL, "cpu", tier)[1]
    run_vadd(kernel)


def test_a_tier_that_loses_the_entry_is_a_miss(backend_calls):
    tier = DictTier()
    tier.get = lambda key: None  # e.g. the tier found a corrupt blob and reported a miss
    compile_cached(KERNEL, "cpu", tier)
    kernel, hit = compile_cached(KERNEL, "cpu", tier)
    assert not hit and len(backend_calls) == 2
    run_vadd(kernel)


def test_a_failed_write_still_returns_a_working_kernel(backend_calls, caplog):
    tier, events = FullTier(), CountingEvents()
    with caplog.at_level(logging.WARNING, logger="tiled.cache"):
        kernel, hit = compile_cached(KERNEL, "cpu", tier, events=events)
    assert not hit and events.get("error", "dict", "write") == 1
    assert "disk full" in caplog.text
    run_vadd(kernel)


def test_options_are_checked_before_compiling(backend_calls):
    with pytest.raises(ValueError, match="option 'hook'"):
        compile_cached(KERNEL, "cpu", DictTier(), options={"hook": print})
    assert backend_calls == []


def test_target_spellings_that_parse_alike_share_a_key():
    with config.override(cuda_compiler="nvcc"):
        keys = {compile_key(KERNEL.ir, parse_target(t), {}) for t in ("cuda:sm_90", "cuda:sm_90a")}
        assert len(keys) == 1
        assert compile_key(KERNEL.ir, parse_target("cuda:sm_80"), {}) not in keys
