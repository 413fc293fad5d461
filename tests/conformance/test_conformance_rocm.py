"""Every conformance kernel compiles for `rocm:gfx942` and `rocm:gfx90a` (HSACO code object
v5, no scratch) and, run on the CPU under the emulation (CompiledKernel.emulate), matches its
numpy reference at its small shapes within the case's tolerance (the table of
tiled/compiler/targets/rocm/README.md, which lists every kernel). No AMD GPU has run them
(none is reachable from this project)."""

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.cases import load_all
from tests.conformance.emulated import run_emulated as emulate_case
from tiled.compiler.toolchain.hip import disassemble

CASES = load_all()
ROCM_README = Path(__file__).resolve().parents[2] / "tiled/compiler/targets/rocm/README.md"


def run_emulated(case, arch: str):
    return emulate_case(case, case.cpu, f"rocm:{arch}")


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_emulates_for_rocm(name, arch):
    case = CASES[name]
    compiled, results = run_emulated(case, arch)
    for k in getattr(compiled, "kernels", [compiled]):  # a code object per launch
        co = k.manifest.code_object
        assert (k.manifest.target, co["arch"], co["code_object_version"]) == \
            (f"rocm:{arch}", arch, 5)
        assert co["private_segment_bytes"] == co["vgpr_spill_count"] == 0, "scratch in use"
        if "tiled::gemm_mfma<" in k.source:  # a T.gemm the lowering put on MFMA
            assert re.search(r"\bv_mfma_", disassemble(k.artifact, arch)), "no MFMA"
    for i, (out, ref) in enumerate(results):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        assert np.isfinite(out).all(), f"output {i} has non-finite values"
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= case.tol, f"output {i}: relative error {err:.2e} > {case.tol:.0e}"


def test_the_rocm_readme_table_lists_every_kernel():
    rows = re.findall(r"^\| conformance `([a-z0-9_]+)` \|", ROCM_README.read_text(), re.M)
    assert sorted(rows) == sorted(CASES), "the rocm README's table is out of date: " \
        "python scripts/rocm_table.py"
