"""T.atomic_add over a wgmma accumulator in a T.Parallel nest (split-K's and stream-K's
epilogues): each thread's two adjacent columns go to global memory as one paired float32
reduction on sm_90a (tiled::atomic_add_f32x2; REDG.E.ADD.F32x2 in the SASS), where the
element index provably moves by one along the last dim with the nest's last variable, and
the atomic is relaxed with no previous value. Otherwise one atomic per element, as before.
Generated code only; the numerics ran on the H200 (benchmarks/results/paired_atomics_h200.json,
conformance_h200_atomics.json) and run on cpu in the conformance suite."""

import pytest

import tiled
import tiled.lang as T
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.ir.program import as_program


def _epilogue(transposed=False, order="relaxed"):
    @tiled.kernel
    def partial(A: T.Tensor((256, 256), "float16"), B: T.Tensor((256, 256), "float16"),
                C: T.Tensor((256, 256), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            a = T.alloc_shared((128, 64), "float16")
            b = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(4, num_stages=2):
                T.copy(A[by * 128, k * 64], a)
                T.copy(B[k * 64, bx * 128], b)
                T.gemm(a, b, acc)
            for i, j in T.Parallel(128, 128):
                if transposed:
                    T.atomic_add(C[bx * 128 + j, by * 128 + i], acc[i, j])
                else:
                    T.atomic_add(C[by * 128 + i, bx * 128 + j], acc[i, j] * 0.5,
                                 memory_order=order)

    return CudaBackend().generate_source(as_program(partial), "sm_90a")[0]


def test_adjacent_columns_take_one_paired_reduction():
    src = _epilogue()
    assert src.count("tiled::atomic_add_f32x2(") == 64 and "atomicAdd(" not in src


@pytest.mark.parametrize("variant", [dict(transposed=True), dict(order="release")])
def test_other_atomics_stay_one_per_element(variant):
    """Columns of the accumulator down C's rows (no adjacent pair), or an ordered atomic (its
    fences are per element)."""
    src = _epilogue(**variant)
    assert "atomic_add_f32x2" not in src and "atomicAdd(" in src


def test_the_sass_has_the_vector_reduction(tmp_path):
    from tests.compiler.test_sm90_path import sass
    from tests.conformance.cases import load_all

    case = load_all()["gemm_splitk"]
    c = tiled.compile(case.factory(**case.gpu).kernel, target="cuda:sm_90a", cache=False)
    assert "REDG.E.ADD.F32x2" in sass(c.artifact, tmp_path, c.manifest.symbol)


def test_guarded_adds_pair_where_both_guards_hold(tmp_path):
    """Stream-K's adds into its workspace tile P[tile, i, j], whose tile index no bound
    proves (the Tile IR guards each add): pairs whose guards both hold take the vector
    reduction, the rest one add each under its own guard (tiled.ops.gemm_streamk, and the
    conformance suite's gemm_streamk)."""
    from tests.compiler.test_sm90_path import sass
    from tests.conformance.cases import load_all
    from tiled.compiler import compile_program
    from tiled.ops.gemm import linear_kernel

    c = compile_program(linear_kernel(1024, 14336, 4096, "bfloat16", "bfloat16", kind="streamk",
                                      BM=128, BN=128, threads=256, units=132),
                        target="cuda:sm_90a")
    assert c.source.count("tiled::atomic_add_f32x2(") == 32
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert "REDG.E.ADD.F32x2" in text
    # and the runs' loop is the TMA-fed wgmma ring, with nothing in local memory
    assert "UTMALDG" in text and "HGMMA.64x128x16.F32.BF16" in text and "HMMA" not in text
    assert " LDL" not in text and " STL" not in text
    case = load_all()["gemm_streamk"]
    src = tiled.compile(case.factory(**case.gpu).kernel, target="cuda:sm_90a",
                        cache=False).source
    assert "tiled::atomic_add_f32x2(" in src
