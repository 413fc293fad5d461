"""Tile IR rewrites the sm_90a lowering applies before planning (tiled/compiler/passes/): a
fragment that is nothing but a gemm's A operand loaded from global memory is staged through
shared memory, and a shared tile that is nothing but a gemm's A operand copied from another
gemm's accumulator goes back into registers (staging.py); a cast through a fragment right
before its store is folded into the store (fold.py). Values never change; what is rewritten
and what is not."""

import tiled
import tiled.lang as T
from tiled.compiler.passes.fold import fold_cast_stores
from tiled.compiler.passes.staging import stage_fragment_operands, staged_operands
from tiled.ir.program import as_program
from tiled.ir.walk import walk
from tiled.v1 import tile_ir_pb2 as pb


def _rs_gemm(read_a=False, reuse_cast=False):
    """TileLang's register-A GEMM; `read_a`: the loop also reads A's fragment element by
    element; `reuse_cast`: the cast fragment is also copied somewhere else."""
    @tiled.kernel
    def gemm_rs(A: T.Tensor((256, 256), "float16"), B: T.Tensor((256, 256), "float16"),
                C: T.Tensor((256, 256), "float16"), D: T.Tensor((256, 256), "float16")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_frag = T.alloc_fragment((128, 32), "float16")
            B_s = T.alloc_shared((32, 128), "float16")
            C_local = T.alloc_fragment((128, 128), "float32")
            C_cast = T.alloc_fragment((128, 128), "float16")
            T.clear(C_local)
            for k in T.Pipelined(8, num_stages=2):
                T.copy(A[by * 128, k * 32], A_frag)
                T.copy(B[k * 32, bx * 128], B_s)
                T.gemm(A_frag, B_s, C_local)
                if read_a:
                    for i, j in T.Parallel(128, 128):
                        C_local[i, j] = C_local[i, j] + T.cast(A_frag[i, j % 32], "float32")
            T.copy(C_local, C_cast)
            T.copy(C_cast, C[by * 128, bx * 128])
            if reuse_cast:
                T.copy(C_cast, D[by * 128, bx * 128])

    return as_program(gemm_rs)


def _buffer(program, name):
    return next(b for b in program.proto.buffers if b.name == name)


def _copies(program):
    return [s.copy for s in walk(program.proto.kernel.body) if s.WhichOneof("kind") == "copy"]


def test_a_fragment_that_only_feeds_a_gemm_is_staged_through_shared_memory():
    p = _rs_gemm()
    a = _buffer(p, "A_frag")
    assert staged_operands(p.proto) == {a.id}
    staged = stage_fragment_operands(p)
    assert _buffer(staged, "A_frag").scope == pb.SHARED
    assert _buffer(p, "A_frag").scope == pb.FRAGMENT  # the input is left as it was
    # read element by element too: its values are the threads' own, it stays a fragment
    read = _rs_gemm(read_a=True)
    assert staged_operands(read.proto) == set() and stage_fragment_operands(read) is read


def test_a_cast_right_before_its_store_is_folded_into_it():
    p = _rs_gemm()
    local, cast = _buffer(p, "C_local").id, _buffer(p, "C_cast").id
    folded = fold_cast_stores(p)
    pairs = [(c.src.buffer, c.dst.buffer) for c in _copies(folded)]
    assert (local, cast) not in pairs and pairs[-1][0] == local  # C_local straight to C
    assert len(_copies(folded)) == len(_copies(p)) - 1
    assert len(_copies(p)) == 4  # the input is left as it was
    # the cast fragment is also stored elsewhere: it must exist, nothing is folded
    reused = _rs_gemm(reuse_cast=True)
    assert fold_cast_stores(reused) is reused


def _p_through_shared(source="scores", read_p=False):
    """S = Q K^T, P = S cast into a shared tile, O = P V (the repo's FlashAttention example's
    form). `source`: what P is copied from ("scores": S, a gemm's accumulator; "plain": a
    fragment no gemm writes); `read_p`: P is also read element by element."""
    @tiled.kernel
    def two_gemms(Q: T.Tensor((128, 64), "float16"), K: T.Tensor((128, 64), "float16"),
                  V: T.Tensor((128, 64), "float16"), Out: T.Tensor((128, 64), "float32")):
        with T.Kernel(1, threads=128):
            q = T.alloc_shared((128, 64), "float16")
            k = T.alloc_shared((128, 64), "float16")
            v = T.alloc_shared((128, 64), "float16")
            P_s = T.alloc_shared((128, 128), "float16")
            S = T.alloc_fragment((128, 128), "float32")
            F = T.alloc_fragment((128, 128), "float32")
            acc = T.alloc_fragment((128, 64), "float32")
            T.copy(Q, q)
            T.copy(K, k)
            T.copy(V, v)
            T.clear(S)
            T.clear(acc)
            T.gemm(q, k, S, transpose_B=True)
            if source == "scores":
                T.copy(S, P_s)
            else:
                for i, j in T.Parallel(128, 128):
                    F[i, j] = S[i, j] * 0.5
                T.copy(F, P_s)
            T.gemm(P_s, v, acc)
            if read_p:
                for i, j in T.Parallel(128, 64):
                    acc[i, j] = acc[i, j] + T.cast(P_s[i, j], "float32")
            T.copy(acc, Out)

    return as_program(two_gemms)


def test_p_handed_through_shared_memory_goes_back_into_registers():
    from tiled.compiler.passes.staging import unstage_register_operands, unstaged_operands

    p = _p_through_shared()
    assert unstaged_operands(p.proto) == {_buffer(p, "P_s").id}
    moved = unstage_register_operands(p)
    assert _buffer(moved, "P_s").scope == pb.FRAGMENT and _buffer(p, "P_s").scope == pb.SHARED
    # copied from a fragment no gemm accumulates into (its layout is not wgmma's A operand's),
    # or read element by element too: it stays in shared memory
    for other in (_p_through_shared(source="plain"), _p_through_shared(read_p=True)):
        assert unstaged_operands(other.proto) == set()
        assert unstage_register_operands(other) is other


def test_the_moved_p_feeds_wgmma_from_registers():
    """On sm_90a the moved P is wgmma's register operand (RS); the whole-kernel attention path,
    which reads P from shared memory, keeps the kernels it recognizes as written."""
    import sys
    from pathlib import Path

    from tiled.compiler.targets.cuda.backend import CudaBackend

    src = CudaBackend().generate_source(_p_through_shared(), "sm_90a")[0]
    assert "wgmma_rows_rs" in src
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import flash_attention

    fa = as_program(flash_attention.flash_attention(1, 2, 2, 512, 512, 128, False, "bfloat16",
                                                    block_M=128, block_N=128, threads=256))
    whole = CudaBackend().generate_source(fa, "sm_90a")
    per_op = CudaBackend().generate_source(fa, "sm_90a", whole_kernel_paths=False)
    assert whole[2].attn is not None
    assert per_op[2].attn is None and "wgmma_rows_rs_issue" in per_op[0]
