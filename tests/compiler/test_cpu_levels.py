"""`cpu` targets are feature levels: "cpu" is the host's own, recorded in the target, the
manifest and the cache key; `cpu:generic` stays portable; an artifact of a level the host
lacks is refused at load. Hosts other than this one are described, never assumed."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled import config
from tiled.compiler import compile_program
from tiled.compiler.action import action_of
from tiled.compiler.registry import Target, parse_target
from tiled.compiler.targets.cpu.levels import codegen_of, resolve_level
from tiled.errors import LaunchError, UnsupportedTarget
from tiled.runtime import cpu_levels
from tiled.runtime.cpu_levels import HostCPU

V3 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3", "abm", "avx",
                "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"})
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
HERE = cpu_levels.host_level().name


@pytest.fixture(autouse=True)
def _scoped(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield


def _host(monkeypatch, flags, isa="x86_64"):
    monkeypatch.setattr(cpu_levels, "host_cpu", lambda: HostCPU(isa, frozenset(flags)))


@pytest.mark.parametrize("flags, level", [(V4 | {"avx512_bf16"}, "x86-64-v4+bf16"),
                                          (V4, "x86-64-v4"), (V3, "x86-64-v3"),
                                          (frozenset(), "generic")])
def test_plain_cpu_is_the_hosts_level(monkeypatch, flags, level):
    _host(monkeypatch, flags)
    assert resolve_level(None) == resolve_level("") == level
    assert parse_target("cpu") == Target("cpu", level)
    assert str(parse_target("cpu")) == f"cpu:{level}"


@pytest.mark.parametrize("text, level", [("cpu:generic", "generic"), ("cpu:x86_64", "generic"),
                                         ("cpu:x86-64-v2", "x86-64-v2"),
                                         ("cpu:x86-64-v4", "x86-64-v4"),
                                         ("cpu:x86-64-v4+bf16", "x86-64-v4+bf16")])
def test_explicit_levels_parse_and_print_back(monkeypatch, text, level):
    _host(monkeypatch, V3)  # a level above the host's compiles (for another host) too
    t = parse_target(text)
    assert t == Target("cpu", level) and parse_target(str(t)) == t


@pytest.mark.parametrize("text", ["cpu:aarch64+sve", "cpu:x86-64-v5", "cpu:arm64", "cpu:native"])
def test_other_isas_and_unknown_levels_are_unsupported(monkeypatch, text):
    _host(monkeypatch, V4)
    with pytest.raises(UnsupportedTarget, match=r"levels: cpu:generic, cpu:x86-64-v2.*"
                                                r"'cpu' for this host's own \(cpu:x86-64-v4\)"):
        parse_target(text)


def test_aarch64_hosts_have_their_own_levels(monkeypatch):
    _host(monkeypatch, {"fp", "asimd", "fphp", "asimdhp", "sve"}, "aarch64")
    assert str(parse_target("cpu")) == "cpu:aarch64+sve"
    assert codegen_of("aarch64+sve").llvm["mattr"] == ["+neon", "+fullfp16", "+sve"]
    with pytest.raises(UnsupportedTarget):
        parse_target("cpu:x86-64-v3")


def test_every_level_has_codegen_flags():
    for lv in cpu_levels.LEVELS:
        cg = codegen_of(lv.name, lv.isa)
        assert cg.llvm.get("mcpu") and any(f.startswith("-march=") for f in cg.cflags), lv


def test_the_level_is_in_the_cache_key():
    digest = "0" * 64
    here, generic = parse_target("cpu"), parse_target("cpu:generic")
    assert action_of(digest, here, {}).hex == action_of(digest, parse_target(f"cpu:{HERE}"),
                                                        {}).hex
    if HERE != "generic":
        assert action_of(digest, here, {}).hex != action_of(digest, generic, {}).hex
    assert action_of(digest, generic, {}).record["target"]["arch"] == "generic"


def scale(n=1000):
    @tiled.kernel
    def scale_kernel(X: T.Tensor((n,), "float16"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            for i in T.Parallel(128):
                Y[bx * 128 + i] = T.cast(X[bx * 128 + i], "float32") * 2.0
    return scale_kernel


def _run(compiled):
    x = np.linspace(-3, 3, 1000).astype(np.float16)
    y = np.zeros(1000, np.float32)
    compiled(x, y)
    np.testing.assert_array_equal(y, x.astype(np.float32) * 2)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is missing")
def test_generic_artifacts_use_no_wide_vectors():
    k = compile_program(scale(), "cpu:generic")
    assert k.manifest.target == "cpu:generic" and k.manifest.arch == "generic"
    _run(k)
    so = config.get("cache_dir") / "generic.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    so.write_bytes(k.artifact)
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True,
                         check=True).stdout
    assert "%ymm" not in asm and "%zmm" not in asm and "vcvtph2ps" not in asm
    if HERE in ("x86-64-v3", "x86-64-v4", "x86-64-v4+bf16"):  # halves converted by F16C
        k = compile_program(scale(), "cpu")
        so.write_bytes(k.artifact)
        asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True,
                             check=True).stdout
        assert "vcvtph2ps" in asm


@pytest.mark.skipif(cpu_levels.host_cpu().isa != "x86_64", reason="x86-64 levels")
def test_an_artifact_of_a_level_the_host_lacks_is_refused(monkeypatch):
    k = compile_program(scale(), "cpu:x86-64-v4")  # compiles on any x86-64 host
    assert k.manifest.target == "cpu:x86-64-v4"
    _host(monkeypatch, V3)
    with pytest.raises(LaunchError, match=r"compiled for cpu:x86-64-v4, which needs avx512bw.*"
                                          r"this host is cpu:x86-64-v3"):
        tiled.runtime.load(k.artifact, k.manifest)
    if HERE.startswith("x86-64-v4"):  # and runs where the level is there
        _host(monkeypatch, V4)
        _run(tiled.runtime.load(k.artifact, k.manifest))


def to_bf16():
    n = T.dyn("n")

    @tiled.kernel
    def to_bf16_kernel(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "bfloat16")):
        with T.Kernel(T.ceildiv(n, 1024), threads=128) as bx:
            for i in T.Parallel(1024):
                Y[bx * 1024 + i] = T.cast(X[bx * 1024 + i], "bfloat16")
    return to_bf16_kernel


def _bf16_sweep(k):
    """Every 997th float32 bit pattern through kernel `k`: its bfloat16 bits, the exactly
    rounded ones (ml_dtypes), and which inputs are NaN / float32 subnormals."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = np.empty(x.shape, ml_dtypes.bfloat16)
    k(x, y)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
    subnormal = (np.abs(x) < np.float32(2.0 ** -126)) & (x != 0)
    return y.view(np.uint16), want.view(np.uint16), np.isnan(x), subnormal


@pytest.mark.skipif(HERE != "x86-64-v4+bf16", reason="needs an AVX512-BF16 host")
@pytest.mark.parametrize("clang", ["clang-22", "no-such-clang"])
def test_bf16_level_converts_by_instruction_with_clang_else_exactly(clang):
    """cpu:x86-64-v4+bf16 converts float32 -> bfloat16 with vcvtneps2bf16 (compiled by
    clang: native_bf16.py): round to nearest even, NaN quieted, float32 subnormals to +-0. With
    no clang it rounds in integers, exactly (and the toolchain record says which)."""
    if clang == "clang-22" and shutil.which(clang) is None:
        pytest.skip("clang-22 is missing")
    from tiled.compiler.toolchain.digest import clear_memo, toolchain_record

    with config.override(clang=clang):
        clear_memo()
        assert (toolchain_record("cpu")["clang"] is None) == (clang == "no-such-clang")
        k = compile_program(to_bf16(), "cpu")
    clear_memo()
    assert k.manifest.target == "cpu:x86-64-v4+bf16"
    got, want, nan, subnormal = _bf16_sweep(k)
    assert np.all((got[nan] & 0x7FFF) > 0x7F80)  # NaN stays NaN
    exact = ~nan & ~subnormal
    np.testing.assert_array_equal(got[exact], want[exact])
    if clang == "no-such-clang":
        np.testing.assert_array_equal(got[subnormal], want[subnormal])
    else:
        assert np.all((got[subnormal] & 0x7FFF) == 0)  # flushed, sign kept
        np.testing.assert_array_equal(got[subnormal] >> 15,
                                      (want[subnormal] >> 15))
        if shutil.which("objdump"):
            so = config.get("cache_dir") / "bf16.so"
            so.parent.mkdir(parents=True, exist_ok=True)
            so.write_bytes(k.artifact)
            asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True,
                                 check=True).stdout
            assert "vcvtneps2bf16" in asm


@pytest.mark.skipif(not HERE.startswith("x86-64-v4"), reason="needs an AVX-512 host")
def test_plain_v4_converts_to_bf16_exactly():
    got, want, nan, _ = _bf16_sweep(compile_program(to_bf16(), "cpu:x86-64-v4"))
    np.testing.assert_array_equal(got[~nan], want[~nan])
