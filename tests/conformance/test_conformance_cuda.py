"""Every conformance kernel compiles for `cuda:sm_80` and `cuda:sm_90a` (TVM's CUDA source and
tiled's header through nvcc to a cubin), at its small shapes: the README table's sm_80 and
sm_90a "compiles" marks. Nothing runs here (no GPU); the H200 runs them
(benchmarks/gpu/conformance.py), and no sm_80 GPU is reachable from this project."""

import shutil

import pytest

import tiled
from tests.conformance.cases import load_all

CASES = load_all()
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_for_cuda(name, target):
    case = CASES[name]
    compiled = tiled.compile(case.factory(**case.cpu).kernel, target)
    for k in getattr(compiled, "kernels", [compiled]):  # a kernel per launch
        assert k.manifest.target == target
        assert k.artifact, "no cubin"
