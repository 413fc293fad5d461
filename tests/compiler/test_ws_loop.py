"""Automatic warp specialization of T.Pipelined loops on sm_90a (passes/pipeline.py decides
which copies may run ahead; targets/cuda/ws_loop.py feeds them from a TMA producer
warpgroup). Generated code and plans only: no GPU needed (numerics: the H200 runs of
benchmarks/gpu/conformance.py and tl_attention.py)."""

import shutil

import pytest

import tiled
import tiled.lang as T
from tiled.compiler.passes.pipeline import run_ahead
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.ir.program import as_program


def _lower(kernel, **options):
    return CudaBackend().generate_source(as_program(kernel), "sm_90a", **options)


def _gemm(copy_b_first=False, b_from_table=False, read_before=False, write_a=False,
          scale_in_loop=False, k_tile=64, m=256, n=256, k=512, threads=256, stages=3,
          write_table=False):
    """A GEMM loop with the knobs that decide whether its copies may run ahead."""
    @tiled.kernel
    def gemm(A: T.Tensor((m, k), "float16"), B: T.Tensor((k, n), "float16"),
             Table: T.Tensor((64,), "int32"), C: T.Tensor((m, n), "float16")):
        with T.Kernel(n // 128, m // 128, threads=threads) as (bx, by):
            A_s = T.alloc_shared((128, k_tile), "float16")
            B_s = T.alloc_shared((k_tile, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for kk in T.Pipelined(k // k_tile, num_stages=stages):
                if read_before:
                    A_s[0, 0] = A_s[0, 1]
                if copy_b_first:
                    T.copy(B[kk * k_tile, bx * 128], B_s)
                    T.copy(A[by * 128, kk * k_tile], A_s)
                elif b_from_table:
                    T.copy(A[by * 128, kk * k_tile], A_s)
                    T.copy(B[Table[kk] * k_tile, bx * 128], B_s)
                else:
                    T.copy(A[by * 128, kk * k_tile], A_s)
                    T.copy(B[kk * k_tile, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
                if scale_in_loop:  # not the whole-kernel GEMM path's loop shape
                    for i, j in T.Parallel(128, 128):
                        acc[i, j] = acc[i, j] * 0.5
            if write_a:
                A[by * 128, bx] = T.cast(acc[0, 0], "float16")
            if write_table:
                Table[bx] = 0
            T.copy(acc, C[by * 128, bx * 128])

    return gemm


def test_copies_run_ahead_only_when_nothing_can_observe_it():
    p = as_program(_gemm()).proto
    ra = run_ahead(p)
    assert ra is not None and ra.copies == (0, 1) and ra.release == (2, 2)
    assert run_ahead(as_program(_gemm(copy_b_first=True)).proto).copies == (0, 1)
    # An offset read from a table the kernel never writes: the producer reads it too. One
    # the kernel writes is not known to another thread early.
    assert run_ahead(as_program(_gemm(b_from_table=True)).proto).copies == (0, 1)
    assert run_ahead(as_program(_gemm(b_from_table=True, write_table=True)).proto).copies \
        == (0,)
    # The tile is read before the copy in the body: it would see the next tile.
    ra = run_ahead(as_program(_gemm(read_before=True)).proto)
    assert ra.copies == (2,)  # B only (A_s is also written by the store)
    # The kernel writes A: its tiles must be read when the program reads them.
    assert run_ahead(as_program(_gemm(write_a=True)).proto).copies == (1,)


def _gathered(write_rows=False, read_before=False):
    """A GEMM whose A tile is gathered through row indices (X's row idx[i], or 0 past a
    bound), B copied: the knobs that decide whether the gather may run ahead."""
    @tiled.kernel
    def gathered(X: T.Tensor((512, 256), "float16"), Idx: T.Tensor((128,), "int32"),
                 B: T.Tensor((256, 128), "float16"), C: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, 1, threads=128) as (_bx, _by):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(4, num_stages=2):
                if read_before:
                    acc[0, 0] = T.cast(A_s[0, 0], "float32")
                for i, c in T.Parallel(128, 64):
                    A_s[i, c] = T.if_then_else(Idx[i] < 500, X[Idx[i], k * 64 + c], 0)
                T.copy(B[k * 64, 0], B_s)
                T.gemm(A_s, B_s, acc)
            if write_rows:
                X[0, 0] = T.cast(acc[0, 0], "float16")
            T.copy(acc, C)

    return gathered


def test_gather_nests_run_ahead_only_when_nothing_can_observe_it():
    """A T.Parallel nest filling a whole shared tile from a global tensor runs ahead like a
    copy (its index table too, in a loop of copies, gathers and gemms); not when the kernel
    writes the tensor, nor when the body reads the tile before the nest."""
    ra = run_ahead(as_program(_gathered()).proto)
    assert ra.copies == (0, 1) and ra.gathers == {0}
    assert run_ahead(as_program(_gathered(write_rows=True)).proto).copies == (1,)
    ra = run_ahead(as_program(_gathered(read_before=True)).proto)
    assert ra.copies == (2,) and not ra.gathers
    # On sm_90a the producer warpgroup issues the gather, loading the row indices itself.
    src, _, low = _lower(_gathered())
    assert low.wsloop.gathers and "ring_gathered" in src and "Idx_ptr" in src


def test_attention_loads_k_and_v_from_the_producer():
    """TileLang's FlashAttention: K's copy opens the loop, V's sits before the second gemm;
    each gets its own full and empty barriers, released after its gemm."""
    from tests.conformance.cases import load_all

    case = load_all()["mha_fwd_bshd"]
    src, pool, low = _lower(case.factory(**case.gpu).kernel)
    w = low.wsloop
    assert [(rc.pos, rc.release) for rc in w.copies] == [(0, 2), (12, 13)]
    assert w.stages == 2 and low.launch_threads == 256 + 128  # d = 128: two stages fit
    body = src[src.index("attention_kernel(half* __restrict__ Out_ptr"):]
    assert "setmaxnreg_inc<232>" in body and "setmaxnreg_dec<40>" in body
    assert [low.buffers[rc.tile].name for rc in w.heads] == ["q_tile"]  # the producer's too
    assert body.count("tiled::sm90::tma_load(") == 6  # two 64-wide panels each (Q, K, V)
    # K's stage freed after S = Q K^T in the peeled first step and in the loop, V's after
    # the deferred P V in the loop and after it (ws_rotate.py); walking the grid, Q's after
    # the loop
    assert low.wsloop.persistent and body.count("tiled::sm90::ring_release(") == 5
    loop = body[body.index("for (int v_1"):body.index("tiled::sm90::consumer_sync", body.index(
        "for (int v_1"))]
    assert "consumer_sync" not in loop and "__syncthreads" not in loop  # no barrier per step
    assert pool <= 227 * 1024


def test_a_dense_ring_tile_takes_one_box_and_mma_tiles_keep_cp_async():
    # 16-wide K tiles (32-byte rows): mma.sync (padded rows), so the loop stays a cp.async
    # pipeline.
    src, _, low = _lower(_gemm(k_tile=16, scale_in_loop=True))
    assert low.wsloop is None and low.launch_threads == 256
    assert "cp_async_wait<2>" in src
    # 32-wide (64-byte rows, TileLang's block_K = 32): wgmma, two iterations per ring stage
    # (merged): A's two tiles one panel of 128-byte rows (box [64, 128]), B's (MN-major)
    # panels of 64 K rows (boxes [64, 64])
    _, _, low = _lower(_gemm(k_tile=32, scale_in_loop=True))
    a, b = low.wsloop.copies
    assert low.wsloop.merge == 2
    assert (a.box, a.swizzle, a.boxes, a.nbytes) == ([64, 128], 128, 1, 128 * 128)
    assert (b.box, b.swizzle, b.boxes, b.nbytes) == ([64, 64], 128, 2, 64 * 128 * 2)
    _, _, low = _lower(_gemm(scale_in_loop=True))  # 64-wide: wgmma panels, fed by TMA
    assert low.wsloop.stages == 4 and low.launch_threads == 256 + 128

    @tiled.kernel
    def scale_rows(X: T.Tensor((4096, 256), "float32"), Y: T.Tensor((4096, 256), "float32")):
        with T.Kernel(32, threads=128) as bx:
            tile = T.alloc_shared((32, 256), "float32")
            for k in T.Pipelined(4, num_stages=2):
                T.copy(X[bx * 128 + k * 32, 0], tile)
                for i, j in T.Parallel(32, 256):
                    Y[bx * 128 + k * 32 + i, j] = tile[i, j] * 2.0

    _, pool, low = _lower(scale_rows)
    (rc,) = low.wsloop.copies
    assert rc.swizzle == 0 and rc.box == [256, 32] and rc.boxes == 1
    assert low.tensor_maps["tiled_tmap_r0"]["box"] == [256, 32]
    # One consumer warpgroup: a producer warp, and a ring two blocks per SM hold (3 stages).
    w = low.wsloop
    assert low.launch_threads == 128 + 32 and w.stages == 3 and w.min_blocks == 2
    assert pool <= 113 * 1024


def test_a_ring_that_does_not_fit_leaves_the_loop_unpipelined():
    """num_stages=1 over a 128 KiB tile fits once; a two-stage ring would not."""
    @tiled.kernel
    def big(X: T.Tensor((4096, 256), "float32"), Y: T.Tensor((4096, 256), "float32")):
        with T.Kernel(32, threads=256) as bx:
            tile = T.alloc_shared((128, 256), "float32")
            for k in T.Pipelined(1, num_stages=1):
                T.copy(X[bx * 128 + k, 0], tile)
                for i, j in T.Parallel(128, 256):
                    Y[bx * 128 + i, j] = tile[i, j] * 2.0

    src, pool, low = _lower(big)
    assert low.wsloop is None and low.launch_threads == 256 and pool == 128 * 256 * 4
    assert "consumer_sync" not in src


def test_strides_tma_cannot_take_keep_the_cp_async_pipeline():
    src, _, low = _lower(_gemm(k=516, k_tile=64))  # A's rows: 1032 bytes, not 16 * n
    assert low.wsloop is None and "cp_async_wait<2>" in src
    _, _, low = _lower(_gemm(k=520, k_tile=64))  # 1040 bytes: TMA takes them
    assert low.wsloop is not None
    src, _, low = _lower(_gemm(), warp_specialize=False)
    assert low.wsloop is None and "cp_async_wait<2>" in src


@pytest.mark.parametrize("threads,regs", [(128, None), (256, 232), (384, 152)])
def test_register_split(threads, regs):
    from tiled.compiler.targets.cuda.ws_plan import GATHER_PRODUCER_REGS, consumer_regs

    assert consumer_regs(threads) == regs
    assert consumer_regs(256, GATHER_PRODUCER_REGS) == 200  # a gathering producer keeps 96


def test_causal_blocks_launch_longest_first():
    """The causal kernel's trip count grows with bx: blocks launch from the last bx down;
    the other kernels keep the grid's order."""
    from tests.conformance.cases import load_all

    cases = load_all()
    for name, backwards in (("mha_fwd_bshd_causal", True), ("mha_fwd_bshd", False)):
        case = cases[name]
        src, _, _ = _lower(case.factory(**case.gpu).kernel)
        assert ("(32 - ((int)blockIdx.x))" in src or "(31 - ((int)blockIdx.x))" in src) \
            == backwards, name


def test_consumers_that_gather_element_by_element_keep_more_blocks_per_sm():
    """TileLang's implicit-GEMM convolution as written, before passes/divmod.py frees its
    gather's indices of the column: no cp.async vectors (an element loop), so the filter copy
    alone would run ahead and the loop gets no producer."""
    from tests.conformance.cases import load_all

    case = load_all()["conv2d_nhwc"]
    _, _, low = _lower(case.factory(**case.gpu).kernel)
    assert low.wsloop is None and low.launch_threads == case.gpu.get("threads", 128)


def test_gathers_run_ahead_on_a_producer_warpgroup():
    """TileLang's Hopper convolution (T.c2d_im2col): the im2col tile's gather is a ring copy
    that every thread of a producer warpgroup issues as cp.async vectors, each arriving on
    the stage's full barrier (its count the producer's threads) when its vectors land; the
    filter tile is TMA, issued by the producer's first thread; the consumers wait, fence the
    gathered stage for wgmma's proxy, and never synchronize the block in the loop."""
    from tests.conformance.cases import load_all

    case = load_all()["conv2d_im2col"]
    src, _, low = _lower(case.factory(**case.gpu).kernel)
    w = low.wsloop
    assert [(rc.pos, rc.gather is not None) for rc in w.copies] == [(0, True), (1, False)]
    assert w.producer_threads == 128 and low.launch_threads == 256 + 128
    assert "setmaxnreg_inc<200>" in src and "setmaxnreg_dec<96>" in src
    assert "== 0) ? (uint)128 : (uint)1)" in src  # the gather's full barriers' arrivals
    assert src.count("tiled::sm90::ring_gathered(") == 1
    assert "if (((int)threadIdx.x) == 256)" in src  # the TMA issuer
    assert not w.persistent  # (ws_plan.persistent_choice: a gathering ring's blocks do not walk)
    loop = src[src.index("for (int v_1"):]
    loop = loop[:loop.index("retire<0>")]
    gathered = loop.index("bar_wait")  # copy 0's full barrier, then its fence
    assert loop[gathered:].index("fence_proxy_async_shared") < loop.index("wgmma")
    assert "consumer_sync" not in loop and "__syncthreads" not in loop


def test_pingpong_is_an_option():
    from tests.conformance.cases import load_all

    case = load_all()["mha_fwd_bshd"]
    kernel = case.factory(**case.gpu).kernel
    plain, _, low = _lower(kernel)
    assert "turn_" not in plain and not low.wsloop.pingpong
    turns, _, low = _lower(kernel, pingpong=True, persistent=1)  # one loop nest to read
    assert low.wsloop.pingpong
    assert turns.count("tiled::sm90::turn_first()") == turns.count("tiled::sm90::turn_last()") \
        == 1
    # S = Q K^T and the deferred O += P V are issued as a pair in the warpgroup's turn
    loop = _loop_text(turns)
    assert loop.index("turn_wait()") < loop.index("wgmma_rows_issue<half, 64, 128, 128, 128, "
                                                  "true, false, true>") < \
        loop.index("wgmma_rows_rs_issue<half, 64, 128, 128, false>") < \
        loop.index("turn_pass()")
    assert turns.count("turn_wait()") == turns.count("turn_pass()") == 3  # step 0, loop, last


def _loop_text(src: str) -> str:
    start = src.index("for (int v_1")
    return src[start:src.index("\n    }\n", start)]


def test_gemms_stay_in_flight_until_something_needs_them():
    """A GEMM main loop keeps one wgmma in flight and frees the previous iteration's stages
    behind it; its `if k == 0: T.clear(acc)` runs once before the loop. FlashAttention is
    software-pipelined (ws_rotate.py): step k issues S = Q K(k)^T, then the P V(k - 1) it
    deferred, waits for S alone (retire<1>, which frees K's stage) and computes the softmax
    while P V runs; the statement that writes P waits for P V and frees V's previous stage.
    The first step (no P V before it) is peeled; the last P V runs after the loop."""
    from tests.conformance.cases import load_all

    cases = load_all()
    case = cases["gemm_nt"]
    src, _, _ = _lower(case.factory(**case.gpu).kernel, persistent=1)
    loop = _loop_text(src)
    assert loop.count("retire<1>") == 1 and "retire<0>" not in loop
    assert loop.index("wgmma_rows_issue<") < loop.index("retire<1>")
    assert loop.count("if (0 < v_1)") == 2  # A's and B's previous stages
    assert "C_local_ptr[0] = 0x0p+0f" not in loop and "C_local_ptr[0] = 0x0p+0f" in src
    assert "retire<0>();\n    tiled::sm90::hold_f32<128>" in src  # after the loop

    case = cases["mha_fwd_bshd"]
    src, _, _ = _lower(case.factory(**case.gpu).kernel, persistent=1)
    assert "for (int v_1 = 1; v_1 <" in src
    loop = _loop_text(src)
    s_issue = loop.index("wgmma_rows_issue<")
    pv = loop.index("wgmma_rows_rs_issue<")
    waited = loop.index("retire<1>")
    assert s_issue < pv < waited < loop.index("hold_f32<64>(", waited) < \
        loop.index("ring_release", waited) < loop.index("max(")
    p_wait = loop.index("retire<0>")
    assert loop.index("max(") < p_wait < loop.index("hold_words<32>(") < \
        loop.index("ring_release", p_wait) < loop.index("_cast_ptr[0] =", p_wait)
    assert loop.count("wgmma_rows_rs_issue<") == 1 and loop.count("retire<") == 2
    first, after = src[:src.index("for (int v_1")], src[src.index("for (int v_1"):]
    assert "wgmma_rows_rs_issue<" not in first[first.rindex("wgmma_rows_issue<"):]
    assert after.count("wgmma_rows_rs_issue<") == 2  # the loop's and the last P V


def test_a_register_operand_is_filled_while_another_gemm_runs(tmp_path):
    """Two register-operand gemms a step, each operand computed from its own shared tile (a
    mixed-input GEMM's dequantization, written element by element): the second operand is
    filled while the first gemm is in flight (its issue, then the fill, then the second
    issue and retire<1>); what touches an accumulator still waits (retire<0> before the
    epilogue of the step), and ptxas serializes nothing."""
    @tiled.kernel
    def halves(A: T.Tensor((256, 512), "float16"), B: T.Tensor((256, 512), "float16"),
               C: T.Tensor((256, 256), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            a0_s = T.alloc_shared((64, 32), "float16")
            a1_s = T.alloc_shared((64, 32), "float16")
            b0_s = T.alloc_shared((128, 32), "float16")
            b1_s = T.alloc_shared((128, 32), "float16")
            a0 = T.alloc_fragment((64, 32), "float16", name="a0")
            a1 = T.alloc_fragment((64, 32), "float16", name="a1")
            part = T.alloc_fragment((64, 128), "float32", name="part")
            acc = T.alloc_fragment((64, 128), "float32", name="acc")
            T.clear(acc)
            for k in T.Pipelined(8, num_stages=2):
                T.copy(A[by * 64, k * 64], a0_s)
                T.copy(A[by * 64, k * 64 + 32], a1_s)
                T.copy(B[bx * 128, k * 64], b0_s)
                T.copy(B[bx * 128, k * 64 + 32], b1_s)
                for i, j in T.Parallel(64, 32):
                    a0[i, j] = a0_s[i, j] * T.cast(0.5, "float16")
                T.gemm(a0, b0_s, part, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(64, 32):
                    a1[i, j] = a1_s[i, j] * T.cast(0.5, "float16")
                T.gemm(a1, b1_s, part, transpose_B=True)
                for i, j in T.Parallel(64, 128):
                    acc[i, j] += part[i, j] * 2.0
            T.copy(acc, C[by * 64, bx * 128])

    src, _, _ = _lower(halves)
    loop = _loop_text(src)
    first = loop.index("wgmma_rows_rs_issue<")
    second = loop.index("wgmma_rows_rs_issue<", first + 1)
    assert loop.index("a1_ptr[0] =", first) < second < loop.index("retire<1>") < \
        loop.index("retire<0>") < loop.index("acc_ptr[0] =", second)
    assert "retire<" not in loop[first:second]
    if shutil.which("nvcc"):
        from tests.compiler.test_sm90_sass import _ptxas_remarks

        assert _ptxas_remarks(src, tmp_path) == []


def test_blocks_walk_the_grid_when_they_run_alike():
    """min(blocks, SMs) blocks walk the program's blocks (the ring's stages and phases carry
    on from block to block, so the producer loads the next block's tiles while the
    consumers finish this one): by default for a loop of gemms that every block runs alike
    (ws_plan.PERSISTENT_BY_DEFAULT, after the H200 runs it names), not for a causal loop;
    the option persistent=2 / 1 forces it on / off."""
    from tests.conformance.cases import load_all

    cases = load_all()
    for name, options, persistent in (("mha_fwd_bshd", {}, True),
                                      ("gemm_nt", {}, True),
                                      ("gemm_nt", {"persistent": 1}, False),
                                      ("mha_fwd_bshd_causal", {}, False),
                                      ("mha_fwd_bshd_causal", {"persistent": 2}, True),
                                      ("mha_fwd_bshd", {"persistent": 2}, True),
                                      ("mha_fwd_bshd", {"persistent": 1}, False),
                                      ("gemm_nt", {"persistent": 2}, True)):
        case = cases[name]
        src, _, low = _lower(case.factory(**case.gpu).kernel, **options)
        assert low.wsloop.persistent == persistent, (name, options)
        assert ("tiled::sm90::grid_dim_x()" in src) == persistent, (name, options)
    c = tiled.compile(cases["mha_fwd_bshd"].factory(**cases["mha_fwd_bshd"].gpu).kernel,
                      target="cuda:sm_90a", cache=False, persistent=2)
    assert c.manifest.grid[0] == ("min", ("mul", ("mul", 32, 16), 8), "tiled_sm_count")


def _head_kernel(write_q=False, q_from_table=False):
    """Attention's shape in small: Q copied before the loop, K tiles in it."""
    @tiled.kernel
    def heads(Q: T.Tensor((4, 256, 64), "float16"), K: T.Tensor((4, 1024, 64), "float16"),
              Table: T.Tensor((4,), "int32"), Out: T.Tensor((4, 256, 64), "float32")):
        with T.Kernel(2, 4, threads=256) as (bx, by):
            q = T.alloc_shared((128, 64), "float16")
            k = T.alloc_shared((64, 64), "float16")
            s = T.alloc_fragment((128, 64), "float32")
            T.clear(s)
            if q_from_table:
                T.copy(Q[Table[by], bx * 128, 0], q)
            else:
                T.copy(Q[by, bx * 128, 0], q)
            if write_q:
                q[0, 0] = T.cast(0.0, "float16")
            for j in T.Pipelined(16, num_stages=2):
                T.copy(K[by, j * 64, 0], k)
                T.gemm(q, k, s, transpose_B=True)
            T.copy(s[0:128, 0:64], Out[by, bx * 128, 0])

    return heads


def test_the_producer_loads_head_copies():
    """A copy before the loop that another thread could issue at the block's start (Q) is
    the producer's: the consumers wait on its full barrier where the program copies and,
    walking the grid, free it after its last use (the loop) on its empty barrier, which the
    producer waits on before loading the next block's. Not when the program writes the
    tile too, nor when its offset loads a value (the table might be the kernel's own)."""
    from tiled.compiler.targets.cuda.ws_plan import walk_group

    ra = run_ahead(as_program(_head_kernel()).proto)
    assert ra.heads == (1,) and ra.head_release == (2,)  # after the loop, its last use
    assert run_ahead(as_program(_head_kernel(write_q=True)).proto).heads == ()
    assert run_ahead(as_program(_head_kernel(q_from_table=True)).proto).heads == ()
    for persistent in (1, 2):
        src, _, low = _lower(_head_kernel(), persistent=persistent)
        w = low.wsloop
        assert [low.buffers[rc.tile].name for rc in w.heads] == ["q"]
        assert src.count("tiled::sm90::tma_load(") == 2 and "cp_async" not in src
        consumer = src[:src.index("setmaxnreg_dec")]
        producer = src[src.index("setmaxnreg_dec"):]
        base = w.bar_offset // 8
        head_full, head_empty = f"[{base + w.head_full(0)}]", f"[{base + w.head_empty(0)}]"
        assert f"ring_fill((&(((uint64_t*)_ptr){head_full}))" in producer
        assert f"bar_wait((&(((uint64_t*)_ptr){head_full}))" in consumer
        walked = persistent == 2
        assert (f"ring_release((&(((uint64_t*)_ptr){head_empty}))" in consumer) == walked
        assert (f"bar_wait((&(((uint64_t*)_ptr){head_empty}))" in producer) == walked
        # The walk: K's tiles do not move with x, so x goes fastest.
        assert walk_group(low, [2, 4]) == 1
    _, _, low = _lower(_gemm())
    assert walk_group(low, [2, 2]) == 8  # A's and B's tiles move with y and x


def test_head_copies_in_two_slots(monkeypatch):
    """With ws_plan.HEAD_SLOTS = 2 (not the default: not yet timed), a walking block's head
    tile has two slots, block i's in slot i % 2 with barriers of its own, phase (i / 2) % 2;
    the consumers' gemms read Q from the block's slot, and the ring keeps the stages that
    still fit (TileLang-style attention, d = 128: two)."""
    from tests.conformance.cases import load_all
    from tiled.compiler.targets.cuda import ws_plan

    monkeypatch.setattr(ws_plan, "HEAD_SLOTS", 2)
    case = load_all()["mha_fwd_bshd"]
    src, pool, low = _lower(case.factory(**case.gpu).kernel)
    w = low.wsloop
    assert w.persistent and w.head_slots == 2 and w.stages == 2 and pool <= 227 * 1024
    base = w.bar_offset // 8
    consumer = src[src.index("attention_kernel(half* __restrict__ Out_ptr"):]
    consumer, producer = consumer[:consumer.index("setmaxnreg_dec")], \
        consumer[consumer.index("setmaxnreg_dec"):]
    assert f"[((v_1 & 1) + {base + w.head_full(0)})])), ((uint)((v_1 & 3) >> 1)))" in consumer
    assert f"ring_release((&(((uint64_t*)_ptr)[((v_1 & 1) + {base + w.head_empty(0)})" \
        in consumer
    assert f"[((v_3 & 1) + {base + w.head_empty(0)})])), ((uint)1 - ((uint)((v_3 & 3) >> 1" \
        in producer
    q = low.shared[w.heads[0].tile]
    assert q.stages == 2
    # the first gemm's A operand (Q) at the block's slot
    assert f"[((((v_1 & 1) * {q.rows * q.stride})" in consumer


def test_a_persistent_walk_frees_the_stages_its_last_gemm_held():
    """A GEMM loop's last wgmma is retired after the loop. Without a persistent walk its
    stages need no release (the producer is done); with one, the producer fills them again
    for the next block and waits for their release, so they are freed right after that
    retire (the H200 hung on every block's second tile without it)."""
    from tests.conformance.cases import load_all

    case = load_all()["gemm_nt"]
    for persistent in (1, 2):
        src, _, _ = _lower(case.factory(**case.gpu).kernel, persistent=persistent)
        after = src[src.index("retire<0>();"):]
        after = after[:after.index("int cse_")]  # up to the epilogue's stores
        assert after.count("ring_release") == (2 if persistent == 2 else 0), after


def test_whole_kernel_paths_can_step_aside():
    """whole_kernel_paths=False routes the kernels the whole-kernel paths recognize through
    the per-op lowering: the repo's attention example gets the TMA-fed loop and wgmma. The
    seed's 128x128x32 GEMM takes the per-op path by default (its 32-wide 16-bit K tiles two
    per ring stage, ws_pairs.py), its one warpgroup walking persistently, one block per SM
    with 4 merged stages."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import flash_attention
    import gemm

    fa = flash_attention.flash_attention(2, 4, 4, 512, 512, 128, False, "bfloat16",
                                         block_M=128, block_N=128, threads=256, num_stages=2)
    _, _, whole = _lower(fa)
    _, _, per_op = _lower(fa, whole_kernel_paths=False)
    assert whole.attn is not None and whole.wsloop is None
    assert per_op.attn is None and per_op.wsloop is not None and per_op.wgmma_ops
    seed = gemm.matmul(1024, 1024, 1024, 128, 128, 32, 3, "float16", threads=128)
    _, _, per_op = _lower(seed)
    assert per_op.wsloop is not None and per_op.wgmma_ops
    _, _, off = _lower(seed, whole_kernel_paths=False)
    assert off.wsloop is not None
    w = per_op.wsloop
    assert w.persistent and w.merge == 2 and w.stages == 4 and w.min_blocks == 1
    c = tiled.compile(seed, target="cuda:sm_90a", cache=False, whole_kernel_paths=False)
    assert c.manifest.grid[0] == ("min", ("mul", 8, 8), "tiled_sm_count")
