"""Programs the verifier accepts compile, or fail with a located error: the cases mutation
fuzzing found crashing the compiler (each reduced to a small kernel), kept as regressions.
(The DSL verifies while it traces: a VerifyError reaches its author as KernelDefinitionError.)"""

import pytest

import tiled
import tiled.lang as T
from tests.ir import programs as P
from tiled.compiler import compile_program
from tiled.errors import CompileError, KernelDefinitionError
from tiled.ir import Program


def test_vars_are_found_by_id_not_by_table_position():
    """tests/ir/programs.py numbers vars from 1: the dim M is not vars[M's id]."""
    k = compile_program(Program(P.gemm(64, 64, 32, 2, 256, 256)), "cpu")
    assert [p.shape for p in k.manifest.params] == [("M", 256), (256, 256), ("M", 256)]


@pytest.mark.parametrize("target", ["cpu", "cuda:sm_80", "cuda:sm_90a"])
def test_loops_that_never_run(target):
    """A T.Parallel nest and a T.Pipelined GEMM loop whose extents fold to 0."""

    @tiled.kernel
    def empty_loops(A: T.Tensor((256, 64), "float16"), B: T.Tensor((64, 256), "float16"),
                    C: T.Tensor((256, 256), "float16")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(32 // 100, num_stages=3):
                T.copy(A[by * 128, k * 64], A_s)
                T.copy(B[k * 64, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            for i in T.Parallel(512 % 1):
                C[i, 0] = 1.0
            T.copy(acc, C[by * 128, bx * 128])

    k = tiled.compile(empty_loops, target, cache=False)
    assert k.manifest.name == "empty_loops"


def test_a_region_addressed_past_32_bit_offsets_is_refused():
    @tiled.kernel
    def far(K: T.Tensor((4, 100, 64), "float16"), Out: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            K_s = T.alloc_shared((64, 64), "float16")
            for v in T.serial(2):
                T.copy(K[0, v * 2147483647, 0], K_s)
            T.copy(K_s, Out[0, 0])

    with pytest.raises(KernelDefinitionError, match=r"index 2147483710 into K dim 1 addresses "
                       r"element 137438957440, past what 32-bit offsets reach"):
        tiled.compile(far, "cpu", cache=False)


def test_an_overflow_found_when_constants_are_folded_is_located():
    S = T.dyn("S")

    @tiled.kernel
    def folded(X: T.Tensor((S,), "float32")):
        with T.Kernel(1, threads=64):
            for k in T.serial(T.ceildiv(S, 64)):
                if (k + 2147483647) * 64 <= S:  # overflows for every k > 0
                    X[k] = 1.0

    with pytest.raises(CompileError, match=r"test_fuzz_findings.py:\d+: an integer expression "
                                           r"of this kernel overflows its dtype"):
        tiled.compile(folded, "cpu", cache=False)


def test_int_min_literals_the_compiler_would_negate_are_refused():
    N = T.dyn("N")

    @tiled.kernel
    def negated(C: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < N:
                    C[bx * -2147483648 + i] = 1.0

    with pytest.raises(KernelDefinitionError, match=r"constant -2147483648 \(the int32 minimum\) "
                       r"as an operand of \*"):
        tiled.compile(negated, "cpu", cache=False)


def test_whole_kernel_errors_are_located_at_the_kernel():
    @tiled.kernel
    def big(A: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((200, 200), "float32")  # 156 KiB: fits sm_90a, not sm_86
            T.copy(A[0, 0], s[0:128, 0:128])
            T.copy(s[0:128, 0:128], A[0, 0])

    with pytest.raises(CompileError, match=r"test_fuzz_findings.py:\d+: kernel needs 156 KiB "
                                           r"of shared memory"):
        tiled.compile(big, "cuda:sm_86", cache=False)
