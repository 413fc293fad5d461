"""tiled.autotune on the cpu target: candidates compiled, checked against the first correct
one and timed; the winner recorded in the kernel cache and reused without timing."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled import config, tuning, tuning_record
from tiled.cache import tiered


@pytest.fixture(autouse=True)
def _fresh_stats():
    for k in tuning.STATS:
        tuning.STATS[k] = 0
    tiered._DEFAULT.clear()
    yield
    tiered._DEFAULT.clear()


def _scale_factory(configs, **kw):
    """Y = 2 X in row blocks of `bm`; `wrong=True` writes 3 X (and `half=True` only the
    first half of the rows: less work, so faster, and wrong; `clobber=True` also overwrites X)."""
    @tiled.autotune(configs=configs, key=["M", "N"], warmup_ms=2, rep_ms=10, **kw)
    def scale(M, N, bm=16, wrong=False, half=False, fail=False, clobber=False):
        if fail:
            raise ValueError("this config is refused")
        factor = 3.0 if wrong else 2.0
        rows = M // 2 if half else M

        @tiled.kernel
        def k(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
            with T.Kernel(T.ceildiv(rows, bm), threads=128) as bx:
                for i, j in T.Parallel(bm, N):
                    Y[bx * bm + i, j] = X[bx * bm + i, j] * factor
                if clobber:
                    for i, j in T.Parallel(bm, N):
                        X[bx * bm + i, j] = 0.0
        return k
    return scale


def test_tunes_once_records_and_never_chooses_a_wrong_or_failing_config():
    scale = _scale_factory([{"bm": 16}, {"bm": 64, "half": True}, {"bm": 32, "fail": True},
                            {"bm": 64}])
    tuned = scale(256, 128)
    by_index = {c.index: c for c in tuned.candidates}
    assert "wrong result" in by_index[1].skipped
    assert "refused" in by_index[2].skipped
    assert by_index[0].us > 0 and by_index[3].us > 0
    assert tuned.config in ({"bm": 16}, {"bm": 64}) and not tuned.from_record
    assert tuning.STATS["tunings"] == 1 and tuning.STATS["candidates_timed"] == 2
    x = np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32)
    y = np.zeros_like(x)
    tuned(x, y)
    np.testing.assert_allclose(y, 2 * x)
    assert scale(256, 128) is tuned  # memoized per shape in the process

    again = _scale_factory([{"bm": 16}, {"bm": 64, "half": True}, {"bm": 32, "fail": True},
                            {"bm": 64}])(256, 128)  # a new decorator: only the record is shared
    assert again.from_record and again.config == tuned.config
    assert tuning.STATS["tunings"] == 1 and tuning.STATS["record_hits"] == 1


def test_a_config_that_writes_an_input_is_skipped():
    tuned = _scale_factory([{"bm": 16}, {"bm": 32, "clobber": True}])(128, 64)
    by_index = {c.index: c for c in tuned.candidates}
    assert "wrote argument 0" in by_index[1].skipped and tuned.config == {"bm": 16}


def test_a_second_process_takes_the_winner_from_the_cache_without_timing(tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parents[1])!r})
        from tests.test_autotune import _scale_factory
        from tiled import tuning
        tuned = _scale_factory([{{"bm": 16}}, {{"bm": 64}}])(128, 64)
        print(json.dumps({{"config": tuned.config, "from_record": tuned.from_record,
                          **tuning.STATS}}))
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=300, check=True) for _ in range(2)]
    first, second = (__import__("json").loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first["tunings"] == 1 and first["candidates_timed"] == 2 and not first["from_record"]
    assert second["tunings"] == 0 and second["candidates_timed"] == 0
    assert second["record_hits"] == 1 and second["from_record"]
    assert second["config"] == first["config"]


def test_modes_off_and_cached_take_the_first_config_without_timing():
    scale = _scale_factory([{"bm": 32}, {"bm": 16}])
    with config.override(autotune="off"):
        assert scale(64, 32).config == {"bm": 32}
    scale = _scale_factory([{"bm": 32}, {"bm": 16}])
    with config.override(autotune="cached"):
        assert scale(64, 32).config == {"bm": 32}
    assert tuning.STATS["tunings"] == 0 and tuning.STATS["first_config"] == 2


def test_a_bucket_is_tuned_once_and_each_shape_gets_its_own_kernel():
    scale = _scale_factory([{"bm": 16}, {"bm": 32}],
                           bucket=lambda M, N: (1 << (M - 1).bit_length(), N))
    a, b = scale(100, 32), scale(128, 32)
    assert tuning.STATS["tunings"] == 1 and a.config == b.config
    assert a.manifest.params[0].shape == (100, 32) and b.manifest.params[0].shape == (128, 32)


def test_a_changed_config_space_or_a_broken_record_tunes_again():
    from dataclasses import replace

    from tiled.cache.entry import Entry
    from tiled.runtime.manifest import Manifest

    scale = _scale_factory([{"bm": 16}, {"bm": 32}])
    scale(64, 32)
    _scale_factory([{"bm": 16}, {"bm": 32}, {"bm": 64}])(64, 32)  # another space: its own key
    assert tuning.STATS["tunings"] == 2 and tuning.STATS["record_hits"] == 0

    cache = tuning_record.cache()
    (key,) = [k for k in cache.tiers[-1].keys()
              if (Manifest.from_json(cache.get(k).manifest).notes or {}).get("tiled.autotune")
              and len(Manifest.from_json(cache.get(k).manifest).notes["tiled.autotune"]["us"])
              == 2]
    entry = cache.get(key)
    m = Manifest.from_json(entry.manifest)
    notes = {"tiled.autotune": {**m.notes["tiled.autotune"], "config": {"bm": 999}}}
    for tier in cache.tiers:
        tier.delete(key)
    cache.put(Entry(key, replace(m, notes=notes).to_json().encode(), entry.blobs))
    again = _scale_factory([{"bm": 16}, {"bm": 32}])(64, 32)
    assert not again.from_record and tuning.STATS["tunings"] == 3


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="at least one config"):
        tiled.autotune(configs=[], key=["M"])
    with pytest.raises(ValueError, match="key 'Q' is not an argument"):
        tiled.autotune(configs=[{}], key=["Q"])(lambda M: None)
    with pytest.raises(ValueError, match="no config builds"):
        _scale_factory([{"fail": True}])(64, 32)


def test_prebuilt_kernels_are_tuned_without_compiling(monkeypatch):
    """A host without the compiler: the candidates come from (artifact, manifest) pairs built
    elsewhere; a config the pairs lack is skipped, never compiled."""
    scale = _scale_factory([{"bm": 16}, {"bm": 32}, {"bm": 64}])
    built = [tiled.compile(scale.factory(64, 32, **cfg), target="cpu")
             for cfg in ({"bm": 16}, {"bm": 32})]
    pairs = [(c.artifact, c.manifest.to_json()) for c in built]

    def refuse(*a, **k):
        raise AssertionError("compiled inside tiled.tuning.prebuilt")

    monkeypatch.setattr(tiled, "compile", refuse)
    with tuning.prebuilt(pairs):
        tuned = scale(64, 32)
    by_index = {c.index: c for c in tuned.candidates}
    assert "not among the prebuilt kernels" in by_index[2].skipped
    assert tuned.config in ({"bm": 16}, {"bm": 32})
    with tuning.prebuilt(pairs):
        again = _scale_factory([{"bm": 16}, {"bm": 32}, {"bm": 64}])(64, 32)
    assert again.from_record and again.config == tuned.config


def test_a_configs_own_compile_options_make_it_a_candidate_of_its_own(monkeypatch):
    """"compile_options" in a config: its candidate compiles with them over the decorator's,
    the factory never sees them, a bad one skips that candidate alone, and the record names
    the config with them (a second decorator reuses it without timing)."""
    seen = []
    compile_ = tiled.compile

    def spy(kernel, target=None, **options):
        seen.append(options)
        return compile_(kernel, target=target, **options)

    monkeypatch.setattr(tiled, "compile", spy)
    space = [{"bm": 16}, {"bm": 16, "compile_options": {"safe_access": False}},
             {"bm": 32, "compile_options": {"no_such_option": 1}}]
    tuned = _scale_factory(space)(128, 64)
    by_index = {c.index: c for c in tuned.candidates}
    assert by_index[0].us > 0 and by_index[1].us > 0  # the factory took bm alone
    assert "unknown compile option 'no_such_option'" in by_index[2].skipped
    assert by_index[1].options == {"safe_access": False} and by_index[0].options == {}
    assert {"safe_access": False} in seen and {} in seen
    assert tuned.config in space[:2]
    assert seen[-1] == tuned.config.get("compile_options", {})  # the winner, as it was tuned
    x = np.random.default_rng(2).standard_normal((128, 64)).astype(np.float32)
    y = np.zeros_like(x)
    tuned(x, y)
    np.testing.assert_allclose(y, 2 * x)
    again = _scale_factory(space)(128, 64)
    assert again.from_record and again.config == tuned.config
    assert tuning.STATS["tunings"] == 1


def test_a_configs_compile_options_must_be_a_dict_and_prebuilt_pairs_may_name_them(
        monkeypatch):
    with pytest.raises(TypeError, match="config #1's 'compile_options' is list"):
        tiled.autotune(configs=[{}, {"compile_options": ["safe_access"]}], key=["M"])
    space = [{"bm": 16}, {"bm": 16, "compile_options": {"safe_access": False}}]
    scale = _scale_factory(space)
    c = tiled.compile(scale.factory(64, 32, bm=16), target="cpu", safe_access=False)
    monkeypatch.setattr(tiled, "compile", lambda *a, **k: pytest.fail("compiled"))
    with tuning.prebuilt([(c.artifact, c.manifest.to_json(), {"safe_access": False})]):
        tuned = scale(64, 32)  # the pair stands for config 1's options only
    by_index = {c.index: c for c in tuned.candidates}
    assert "not among the prebuilt kernels" in by_index[0].skipped
    assert tuned.config == space[1]


def test_run_is_how_candidates_are_checked_and_timed():
    calls = []

    def run(kernel, config, args):
        calls.append(config["bm"])
        kernel(*args)

    tuned = _scale_factory([{"bm": 16}, {"bm": 32}], run=run)(128, 64)
    assert tuned.config in ({"bm": 16}, {"bm": 32})
    assert calls.count(16) > 5 and calls.count(32) > 5  # the check, then every timed run


def test_tilelang_form_keys_on_the_arguments_no_config_sets(tmp_path, monkeypatch):
    """`@tiled.autotune(configs=...)` over `@tiled.jit(...)`, as TileLang's examples stack
    them (no key; TileLang's warmup= / rep=): the key is every argument no config sets, and
    the tuned call allocates and returns the jit kernel's outputs."""
    monkeypatch.setenv("TILED_CACHE_DIR", str(tmp_path))

    @tiled.autotune(configs=[{"bm": 8}, {"bm": 32, "threads": 64}], warmup=2, rep=10)
    @tiled.jit(out_idx=[-1])
    def double(M, N, bm=16, threads=128):
        @T.prim_func
        def k(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
            with T.Kernel(T.ceildiv(M, bm), threads=threads) as bx:
                for i, j in T.Parallel(bm, N):
                    Y[bx * bm + i, j] = X[bx * bm + i, j] * 2.0
        return k

    assert double.key == ["M", "N"]
    x = np.random.default_rng(0).standard_normal((40, 24)).astype(np.float32)
    tuned = double(M=40, N=24)
    assert tuned.config in ({"bm": 8}, {"bm": 32, "threads": 64})
    np.testing.assert_array_equal(tuned(x), 2 * x)
    assert (double.warmup_ms, double.rep_ms) == (2, 10)
