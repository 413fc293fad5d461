"""Every conformance kernel compiles for `metal` (MSL that passes tiled's type check) and, run
on the CPU under the emulation (CompiledKernel.emulate), matches its numpy reference within
the case's tolerance, at its small shapes; where those tiles need more than Apple's 32 KiB
of threadgroup memory, at the smaller tiles METAL_SHAPES gives (the table of
tiled/compiler/targets/metal/README.md lists every kernel and its shape). The float8 kernels
are refused with a located CompileError: Apple GPUs have no float8 type. No Apple GPU has run
any of them (none is reachable from this project)."""

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.cases import load_all
from tests.conformance.emulated import run_emulated as emulate_case
from tiled.compiler import compile_program
from tiled.errors import CompileError

CASES = load_all()
METAL_README = Path(__file__).resolve().parents[2] / "tiled/compiler/targets/metal/README.md"
_ATTENTION = {"block_M": 32, "block_N": 32}  # q, k, v, o tiles of 64 x 64 are 40 KiB
METAL_SHAPES = {"gemm_nt_tf32": {"block_K": 16},  # two stages of 64 x 32 float tiles: 32 KiB
                **{name: _ATTENTION for name, c in CASES.items()
                   if c.factory.__name__ == "flash_attention"}}
NO_FLOAT8 = {name for name in CASES if "fp8" in name}
APPLE9 = ("gemm_nt",)  # bfloat16 operands: simdgroup matrices on apple9, the SIMT gemm before


def metal_shape(name: str) -> dict:
    return {**CASES[name].cpu, **METAL_SHAPES.get(name, {})}


def run_emulated(name: str, arch: str):
    return emulate_case(CASES[name], metal_shape(name), f"metal:{arch}")


@pytest.mark.parametrize(("name", "arch"), [(n, "apple7") for n in sorted(CASES)
                                            if n not in NO_FLOAT8]
                         + [(n, "apple9") for n in APPLE9])
def test_compiles_and_emulates_for_metal(name, arch):
    compiled, results = run_emulated(name, arch)
    for m in getattr(compiled, "manifests", [compiled.manifest]):  # one per launch
        assert m.target == f"metal:{arch}" and m.metal["threadgroup_bytes"] <= 32 * 1024
    kernel = compiled.source[compiled.source.index("// ---- the kernel ----"):]
    if any(CASES[name].factory.__name__ == f for f in ("flash_attention", "matmul")):
        # T.gemm on simdgroup matrices (with the accumulator resident in them, or not)
        assert re.search(r"tiled::gemm_simdgroup(_acc)?<", kernel)
    for i, (out, ref) in enumerate(results):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        assert np.isfinite(out).all(), f"output {i} has non-finite values"
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= CASES[name].tol, f"output {i}: relative error {err:.2e} > " \
            f"{CASES[name].tol:.0e}"


@pytest.mark.parametrize("name", sorted(NO_FLOAT8))
def test_float8_kernels_are_refused_with_their_location(name):
    case = CASES[name]
    with pytest.raises(CompileError, match=r"k_\w+\.py:\d+: \w+ is float8_e4m3, which "
                                           r"metal:apple7 kernels cannot hold"):
        compile_program(case.factory(**case.cpu).kernel, "metal")


def test_the_metal_readme_table_lists_every_kernel():
    rows = re.findall(r"^\| conformance `([a-z0-9_]+)`", METAL_README.read_text(), re.M)
    assert sorted(rows) == sorted(CASES), "the metal README's table is out of date: " \
        "python scripts/metal_table.py"
