"""Memory-safety guards (tiled.compiler.passes.guards): global element accesses that may leave
their tensor are guarded, accesses proved in bounds are left alone, and on `cpu` the memory
around every tensor stays untouched (canaries) for kernels that index past both ends."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler.passes.guards import guard_program
from tiled.ir import verify

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))  # the kernels the H200 run checks too
import elementwise
import gemm as gemm_example
import safety_kernels
import softmax


def example(name: str):
    """examples/NAME.py by path (benchmarks/gpu has modules of the same names)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" /
                                                  f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", sorted(safety_kernels.CASES))
def test_kernels_that_index_past_their_tensors_leave_the_memory_around_them_alone(case):
    """The issue's kernel, a ported SiLU-mul over ragged columns, a stencil reading before the
    start and after the end, gathers and atomics at indices read from memory, copies at
    negative and too-large scalar offsets: right values, canaries untouched."""
    factory, check = safety_kernels.CASES[case]
    space = safety_kernels.NumpySpace()
    check(tiled.compile(factory(), "cpu"), space)
    space.check()


def test_the_guard_pass_output():
    out = guard_program(safety_kernels.double().ir)
    verify(out)
    assert out.digest == safety_kernels.double(guard=True).ir.digest, str(out)


def test_accesses_proved_in_bounds_are_left_alone():
    """Tile loops that cover their shapes exactly, guards the author wrote, loops over a
    symbolic dim: nothing to guard, the program reaches the backend unchanged."""
    N = T.dyn("N")

    @tiled.kernel
    def rows(X: T.Tensor((N, 64), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=1):
            for r in T.serial(N):
                Y[r] = X[r, 0] + X[r, 63]

    kernels = [rows, elementwise.add(), softmax.softmax(256), gemm_example.matmul(),
               gemm_example.matmul(T.dyn("M"), 1024, 1024),
               example("flash_attention").flash_attention(2, 4, 4, 1024, 1024, 128, causal=True)]
    for k in kernels:
        assert guard_program(k.ir) is k.ir, k.ir.name


def test_safe_access_is_a_keyed_option():
    from tiled.compiler.cached import compile_key
    from tiled.compiler.registry import parse_target

    double = safety_kernels.double()
    cpu = parse_target("cpu")
    default = compile_key(double.ir, cpu, {})
    assert compile_key(double.ir, cpu, {"safe_access": True}) == default  # the default spelled
    assert compile_key(double.ir, cpu, {"safe_access": False}) != default
    with pytest.raises(ValueError, match="'safe_access' must be a bool"):
        compile_key(double.ir, cpu, {"safe_access": 1})


def test_cuda_source_carries_the_guard_unless_safe_access_is_off():
    from tiled.compiler.targets.cuda.backend import CudaBackend

    double = safety_kernels.double()
    safe, _, _ = CudaBackend().generate_source(guard_program(double.ir), "sm_80")
    unsafe, _, _ = CudaBackend().generate_source(double.ir, "sm_80")
    # 128 threads x 8 iterations: the last runs for the first 104 threads only (1000 - 896)
    assert "threadIdx.x) < 104" in safe and "< 104" not in unsafe


def test_an_index_below_zero_only_when_a_dim_is_0_is_guarded():
    """The verifier takes dims as >= 1; an empty tensor makes `X[N - 1]` read X[-1]."""
    N = T.dyn("N")

    @tiled.kernel
    def last(X: T.Tensor((N,), "float32"), Y: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=1):
            Y[0] = X[N - 1]

    k = tiled.compile(last, "cpu")
    for n in (0, 1, 5):
        space = safety_kernels.NumpySpace()
        y = space.tensor(np.zeros(1, "float32"))
        k(space.tensor(np.arange(n, dtype="float32") + 1), y)
        assert y[0] == n
        space.check()


def test_a_block_var_is_below_its_grid_dim():
    """`Tiles[by]` under a grid of `tiles` blocks, Tiles of `tiles` rows: in bounds, unguarded
    (a guard there kept tiled.ops.grouped_linear off the sm_90a warp-specialized path)."""
    from tiled.ir.program import as_program

    tiles = T.dyn("tiles")

    @tiled.kernel
    def per_block(Tiles: T.Tensor((tiles, 2), "int32"), Y: T.Tensor((tiles,), "int32")):
        with T.Kernel(tiles, threads=32) as by:
            Y[by] = Tiles[by, 0] + Tiles[by, 1]

    p = as_program(per_block)
    assert guard_program(p) is p
