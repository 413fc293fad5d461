"""The explicit Hopper primitives (tiled.lang.hopper) record the Tile IR nodes they stand for;
T.gemm takes one stage of a staged shared buffer."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.v1 import tile_ir_pb2 as pb


def test_primitives_record_their_nodes():
    @tiled.kernel
    def k(A: T.Tensor((128, 128), "float16")):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared((2, 64, 64), "float16")
            bars = T.alloc_barrier(2, arrive_count=128)
            one = T.alloc_barrier(1, arrive_count=128)
            with T.ws(1, regs=40):
                T.mbarrier_expect_tx(bars[1], 8192)
                T.tma_copy(A[64, 0], A_s[1, :, :], bars[1])
                T.mbarrier_arrive(bars[1])
                T.mbarrier_arrive(one)
                T.fence_proxy_async()
            T.mbarrier_wait_parity(bars[1], 0)
            T.mbarrier_wait_parity(one, 0)

    p = k.ir.proto
    bars = p.buffers[2]
    assert (bars.scope, bars.dtype, bars.shape[0].size, bars.arrive_count) == \
        (pb.BARRIER, pb.UINT64, 2, 128)
    assert p.buffers[3].arrive_count == 128
    ws, wait, _ = p.kernel.body.seq.stmts
    assert (ws.warp_group.group, ws.warp_group.regs) == (1, 40)
    expect, tma, arrive, arrive_one, fence = ws.warp_group.body.seq.stmts
    assert expect.mbarrier.kind == pb.MBARRIER_EXPECT_TX and expect.mbarrier.value.int_value == 8192
    assert tma.copy.tma.barrier == bars.id and tma.copy.tma.index.int_value == 1
    assert list(tma.copy.src.extents) == [64, 64] and list(tma.copy.dst.extents) == [1, 64, 64]
    assert arrive.mbarrier.kind == pb.MBARRIER_ARRIVE and not arrive.mbarrier.HasField("value")
    assert arrive_one.mbarrier.barrier.index.int_value == 0  # a barrier of one needs no index
    assert fence.WhichOneof("kind") == "fence_proxy_async"
    assert wait.mbarrier.kind == pb.MBARRIER_WAIT_PARITY and wait.mbarrier.value.int_value == 0
    assert ws.loc.line and tma.loc.line == ws.loc.line + 2


def staged_gemm(stages=3):
    @tiled.kernel
    def k(A: T.Tensor((64, 96), "float32"), B: T.Tensor((96, 32), "float32"),
          C: T.Tensor((64, 32), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((stages, 64, 32), "float32")
            B_s = T.alloc_shared((stages, 32, 32), "float32")
            C_l = T.alloc_fragment((64, 32), "float32")
            T.clear(C_l)
            for i in T.serial(3):
                T.copy(A[0, i * 32], A_s[i % stages, :, :])
                T.copy(B[i * 32, 0], B_s[i % stages, :, :])
            for i in T.serial(3):
                T.gemm(A_s[i % stages, :, :], B_s[i % stages, :, :], C_l)
            T.copy(C_l, C[0, 0])

    return k


def test_gemm_on_stages_of_a_staged_buffer_runs_on_cpu():
    k = staged_gemm()
    g = next(s for s in k.ir.proto.kernel.body.seq.stmts[2:] if s.WhichOneof("kind") == "for_")
    assert len(g.for_.body.gemm.a_index) == 1 and len(g.for_.body.gemm.b_index) == 1
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 96)).astype("float32")
    b = rng.standard_normal((96, 32)).astype("float32")
    c = np.zeros((64, 32), "float32")
    tiled.compile(k, target="cpu")(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_gemm_takes_whole_stages_only():
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((2, 64, 64), "float16")
            C_l = T.alloc_fragment((32, 64), "float32")
            T.gemm(A_s[0, 0:32, :], A_s[1, :, :], C_l)

    with pytest.raises(KernelDefinitionError, match=r"one whole 2-d tile of a staged buffer"):
        _ = k.ir


def test_barrier_arguments_are_checked_where_written():
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            bars = T.alloc_barrier(2)
            T.mbarrier_arrive(bars)

    with pytest.raises(KernelDefinitionError, match=r"expected one barrier, bar\[i\]"):
        _ = k.ir
