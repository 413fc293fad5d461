"""CPU feature levels: which level a host has, and which artifacts it refuses, over described
hosts (CI's machine need not have AVX-512, so nothing here depends on the one it runs on)."""

from __future__ import annotations

import pytest

from tiled.errors import LaunchError
from tiled.runtime import cpu_levels
from tiled.runtime.cpu_levels import HostCPU, check_runs_here, host_level, level_named

BASE = {"fpu", "sse", "sse2", "cx8", "cmov"}
V2 = BASE | {"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"}
V3 = V2 | {"abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}
V4_BF16 = V4 | {"avx512_bf16"}  # a Zen 4 / Sapphire Rapids
HOSTS = {
    "generic": HostCPU("x86_64", frozenset(BASE)),
    "x86-64-v2": HostCPU("x86_64", frozenset(V2)),
    "x86-64-v3": HostCPU("x86_64", frozenset(V3)),
    "x86-64-v4": HostCPU("x86_64", frozenset(V4)),
    "x86-64-v4+bf16": HostCPU("x86_64", frozenset(V4_BF16)),
    "aarch64+fp16": HostCPU("aarch64", frozenset({"fp", "asimd", "fphp", "asimdhp"})),
    "aarch64+sve": HostCPU("aarch64", frozenset({"fp", "asimd", "fphp", "asimdhp", "sve"})),
}
X86 = ("generic", "x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4+bf16")


@pytest.mark.parametrize("name", list(HOSTS))
def test_a_host_has_the_newest_level_whose_flags_it_all_shows(name):
    assert host_level(HOSTS[name]).name == name


def test_one_missing_flag_drops_the_level():
    assert host_level(HostCPU("x86_64", frozenset(V4 - {"avx512vl"}))).name == "x86-64-v3"
    assert host_level(HostCPU("x86_64", frozenset(V4_BF16 - {"avx512vl"}))).name == \
        "x86-64-v3"  # AVX512-BF16 alone is no level
    assert host_level(HostCPU("x86_64", frozenset(V3 - {"f16c"}))).name == "x86-64-v2"
    assert host_level(HostCPU("aarch64", frozenset({"fp", "asimd"}))).name == "generic"
    assert host_level(HostCPU("riscv64", frozenset({"rv64"}))).name == "generic"


@pytest.mark.parametrize("host", X86)
@pytest.mark.parametrize("built", X86)
def test_an_x86_host_runs_its_level_and_the_ones_below(host, built):
    if X86.index(built) <= X86.index(host):
        check_runs_here("k", built, HOSTS[host])
        return
    with pytest.raises(LaunchError) as e:
        check_runs_here("k", built, HOSTS[host])
    msg = str(e.value)
    assert f"cpu:{built}" in msg and f"cpu:{host}" in msg  # both levels named
    missing = cpu_levels.level_named(built, "x86_64").requires - HOSTS[host].flags
    assert all(flag in msg for flag in missing) and "cpu:generic" in msg


def test_machine_names_of_older_manifests_read_as_generic():
    assert level_named("x86_64", "x86_64").name == "generic"
    assert level_named("aarch64", "aarch64").name == "generic"
    check_runs_here("k", "x86_64", HOSTS["generic"])


@pytest.mark.parametrize("arch, why", [("aarch64+sve", "another ISA (aarch64)"),
                                       ("aarch64", "does not know"),
                                       ("x86-64-v9", "does not know")])
def test_other_isas_and_unknown_levels_are_refused(arch, why):
    with pytest.raises(LaunchError, match=r"cpu:x86-64-v4 \(x86_64; levels"):
        check_runs_here("k", arch, HOSTS["x86-64-v4"])
    with pytest.raises(LaunchError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_runs_here("k", arch, HOSTS["x86-64-v4"])


def test_sve_needs_sve():
    check_runs_here("k", "aarch64+fp16", HOSTS["aarch64+sve"])
    with pytest.raises(LaunchError, match=r"needs sve; this host is cpu:aarch64\+fp16"):
        check_runs_here("k", "aarch64+sve", HOSTS["aarch64+fp16"])


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 avx avx2 fma
bogomips\t: 5192.30

processor\t: 1
flags\t\t: fpu
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes fphp asimdhp sve
CPU implementer\t: 0x41
"""


def test_cpuinfo_gives_the_first_processors_flags():
    assert cpu_levels.parse_cpuinfo(X86_CPUINFO, "x86_64") == \
        HostCPU("x86_64", frozenset({"fpu", "sse", "sse2", "avx", "avx2", "fma"}))
    host = cpu_levels.parse_cpuinfo(ARM_CPUINFO, "arm64")
    assert host.isa == "aarch64" and host_level(host).name == "aarch64+sve"
    assert cpu_levels.parse_cpuinfo("", "x86_64") == HostCPU("x86_64", frozenset())


def test_this_host_is_described():
    host = cpu_levels.host_cpu()
    assert host_level(host) in cpu_levels.levels_of(host.isa)
    check_runs_here("k", host_level(host).name)  # this host runs its own level
