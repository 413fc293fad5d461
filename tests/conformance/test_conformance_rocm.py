"""Every conformance kernel compiles for `rocm:gfx942` and `rocm:gfx90a` (HSACO code object
v5, no scratch) and, run on the CPU under the emulation (CompiledKernel.emulate), matches its
numpy reference at its small shapes within the case's tolerance (the table of
tiled/compiler/targets/rocm/README.md, which lists every kernel). No AMD GPU has run them
(none is reachable from this project)."""

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.cases import load_all, np_dtype
from tiled.compiler import compile_program
from tiled.compiler.toolchain.hip import disassemble

CASES = load_all()
ROCM_README = Path(__file__).resolve().parents[2] / "tiled/compiler/targets/rocm/README.md"


class Emulated:
    """A compiled rocm kernel that tiled.jit launches on numpy arrays by emulating it."""

    def __init__(self, compiled):
        self.compiled, self.manifest = compiled, compiled.manifest

    def __call__(self, *args):
        self.compiled.emulate(*args)


def run_emulated(case, arch: str):
    shape = case.cpu
    jk = case.factory(**shape)
    compiled = compile_program(jk.kernel, f"rocm:{arch}")
    jk.use("cpu", Emulated(compiled))  # numpy inputs pick the "cpu" entry
    rng = np.random.default_rng(0)
    raw = case.inputs(rng, shape)
    args = [a.astype(np_dtype(dt)) if isinstance(a, np.ndarray) else a for a, dt in raw]
    outs = case.call(jk, args, shape) if case.call else jk(*args)
    outs = outs if isinstance(outs, list | tuple) else [outs]
    rounded = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
    refs = case.reference(rounded, shape)
    refs = refs if isinstance(refs, list | tuple) else [refs]
    return compiled, [(np.asarray(o).astype(np.float64), np.asarray(r, np.float64))
                      for o, r in zip(outs, refs, strict=True)]


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_and_emulates_for_rocm(name, arch):
    case = CASES[name]
    compiled, results = run_emulated(case, arch)
    co = compiled.manifest.code_object
    assert (compiled.manifest.target, co["arch"], co["code_object_version"]) == \
        (f"rocm:{arch}", arch, 5)
    assert co["private_segment_bytes"] == co["vgpr_spill_count"] == 0, "scratch in use"
    if "tiled::gemm_mfma<" in compiled.source:  # a T.gemm the lowering put on MFMA
        assert re.search(r"\bv_mfma_", disassemble(compiled.artifact, arch)), "no MFMA"
    for i, (out, ref) in enumerate(results):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        assert np.isfinite(out).all(), f"output {i} has non-finite values"
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= case.tol, f"output {i}: relative error {err:.2e} > {case.tol:.0e}"


def test_the_rocm_readme_table_lists_every_kernel():
    rows = re.findall(r"^\| conformance `([a-z0-9_]+)` \|", ROCM_README.read_text(), re.M)
    assert sorted(rows) == sorted(CASES), "the rocm README's table is out of date: " \
        "python scripts/rocm_table.py"
