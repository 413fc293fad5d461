"""Two 32-wide K tiles per ring stage on the per-op sm_90a path (targets/cuda/ws_pairs.py):
when iterations merge, the boxes and stages they take, and the GEMM main loop's schedule
over pairs. Generated code only (numerics: benchmarks/gpu/merged_ring.py on the H200)."""

import re

import tiled
import tiled.lang as T
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.ir.program import as_program


def _lower(kernel, **options):
    return CudaBackend().generate_source(as_program(kernel), "sm_90a",
                                         whole_kernel_paths=False, **options)


def _gemm_nt(K=160, step=32, read_tile=False, b_kmajor=True):
    """C = A B^T (or A B) with 32-wide K tiles; `step`: the K offset's stride per
    iteration; `read_tile`: the loop also reads A's tile element by element."""
    b_shape = (256, K) if b_kmajor else (K, 256)

    @tiled.kernel
    def gemm(A: T.Tensor((256, K), "bfloat16"), B: T.Tensor(b_shape, "bfloat16"),
             C: T.Tensor((256, 256), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), "bfloat16")
            B_s = T.alloc_shared((128, 32) if b_kmajor else (32, 128), "bfloat16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // step, num_stages=3):
                T.copy(A[by * 128, k * step], A_s)
                if b_kmajor:
                    T.copy(B[bx * 128, k * step], B_s)
                else:
                    T.copy(B[k * step, bx * 128], B_s)
                T.gemm(A_s, B_s, acc, transpose_B=b_kmajor)
                if read_tile:
                    for i, j in T.Parallel(128, 128):
                        acc[i, j] = acc[i, j] + T.cast(A_s[i, j % 32], "float32")
            T.copy(acc, C[by * 128, bx * 128])

    return gemm


def _consumer(src: str) -> str:
    """The consumers' code: their threads (one warpgroup, or two taking the blocks in turn:
    ws_plan.alternate_choice) up to the producer's."""
    body = src[src.index("__global__"):]
    threads = re.search(r"threadIdx\.x\) < (\d+)\)", body).group(1)
    return body[body.index(f"threadIdx.x) < {threads}"):
                body.index(f"threadIdx.x) == {threads}")]


def test_adjacent_k_tiles_share_a_stage():
    """Both K-major tiles of a pair make one panel of 128-byte rows (one 64-wide box in the
    128-byte swizzle); MN-major B's make panels of 64 K rows (boxes twice as tall); each
    stage holds twice the bytes, and the one-warpgroup ring grows to 4 stages at one block
    per SM."""
    _, _, low = _lower(_gemm_nt())
    w = low.wsloop
    assert w.merge == 2 and w.stages == 4 and w.min_blocks == 1
    assert [(rc.box, rc.swizzle, rc.boxes, rc.nbytes) for rc in w.copies] == \
        [([64, 128], 128, 1, 128 * 64 * 2)] * 2
    _, _, low = _lower(_gemm_nt(b_kmajor=False))
    a, b = low.wsloop.copies
    assert low.wsloop.merge == 2 and low.wsloop.merged == {a.tile: 1, b.tile: 0}
    assert (b.box, b.swizzle, b.boxes, b.nbytes) == ([64, 64], 128, 2, 64 * 128 * 2)


def test_tiles_that_are_not_adjacent_keep_a_stage_each():
    """A K offset that moves by 64 per iteration with 32-wide tiles skips half of K: the
    tiles of two iterations are not one 64-wide box, so each keeps its own narrow stage."""
    _, _, low = _lower(_gemm_nt(K=320, step=64))
    assert low.wsloop.merge == 1
    assert [(rc.box, rc.swizzle) for rc in low.wsloop.copies] == [([32, 128], 64)] * 2


def test_a_gemm_main_loop_issues_one_group_per_pair():
    """The loop of ring copies and one gemm runs each pair as one wgmma over the stage's 64
    K (one wait, one group, the group before retired and its stage freed); an odd count's
    last iteration runs alone on the first half of its stage (K 32, stage K 64); the
    persistent walk frees both stages the loop still held after it."""
    src, _, _ = _lower(_gemm_nt(K=160))  # 5 iterations: 2 pairs and a last one
    loop = _consumer(src)
    issues = re.findall(r"wgmma_rows_issue<__nv_bfloat16, 128, 128, 128, (\d+), true, "
                        r"false, false, (\d+)>", loop)
    assert issues == [("64", "64"), ("32", "64")]
    assert loop.count("retire<1>") == 1 and loop.count("retire<0>") == 1
    assert "retire<2>" not in loop
    after = loop[loop.index("retire<0>"):]
    assert after.count("ring_release") == 4  # two stages of A and B
    assert "grid_dim_x" in src  # the walk that needs them


def test_other_loop_bodies_keep_the_general_plan_over_pairs():
    """A body that also reads the tile runs one iteration at a time over the merged stages:
    its gemm reads its half of the stage (K 32 of stage K 64), the stage waited for at even
    iterations and freed after odd ones (or the last)."""
    src, _, low = _lower(_gemm_nt(read_tile=True))
    assert low.wsloop.merge == 2
    loop = _consumer(src)
    assert re.findall(r"wgmma_rows_issue<__nv_bfloat16, 128, 128, 128, (\d+), true, false, "
                      r"false, (\d+)>", loop) == [("32", "64")]
    assert "% 2) == 0)" in loop  # the full-barrier wait at even iterations
