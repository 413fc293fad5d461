"""The explicit Hopper path's nodes in the text view and the canonical form: they print as the
DSL spells them, renames and moved lines keep the digest, and every semantic edit changes it."""

import textwrap

import pytest

import tiled
import tiled.lang as T
from tiled.ir import Program, verify_program
from tiled.v1 import tile_ir_pb2 as pb

from .programs import node


def kernel(names=True, stages=2):
    def name(n):
        return n if names else n + "_2"  # the assignment targets name them when names=False

    @tiled.kernel
    def ws_gemm(A: T.Tensor((256, 256), "float16"), B: T.Tensor((256, 256), "float16"),
                C: T.Tensor((256, 256), "float32")):
        with T.Kernel(4, 4, threads=256) as (bx, by):
            A_s = T.alloc_shared((stages, 64, 64), "float16", name=name("A_s"))
            B_s = T.alloc_shared((stages, 64, 64), "float16", name=name("B_s"))
            C_l = T.alloc_fragment((64, 64), "float32", name=name("C_l"))
            full = T.alloc_barrier(stages, arrive_count=128, name=name("full"))
            empty = T.alloc_barrier(stages, arrive_count=128, name=name("empty"))
            with T.ws(1, regs=40):
                for k in T.serial(4):
                    T.mbarrier_wait_parity(empty[k % stages], 1 - k // stages % 2)
                    T.mbarrier_expect_tx(full[k % stages], 16384)
                    T.tma_copy(A[by * 64, k * 64], A_s[k % stages, :, :], full[k % stages])
                    T.tma_copy(B[k * 64, bx * 64], B_s[k % stages, :, :], full[k % stages])
                    T.mbarrier_arrive(full[k % stages])
            with T.ws(0):
                T.clear(C_l)
                for k in T.serial(4):
                    T.mbarrier_wait_parity(full[k % stages], k // stages % 2)
                    T.gemm(A_s[k % stages, :, :], B_s[k % stages, :, :], C_l)
                    T.mbarrier_arrive(empty[k % stages])
                T.fence_proxy_async()
                T.copy(C_l, C[by * 64, bx * 64])

    return ws_gemm.ir


TEXT = textwrap.dedent("""\
    kernel ws_gemm(A: Tensor[(256, 256), float16], B: Tensor[(256, 256), float16], \
C: Tensor[(256, 256), float32]):
      with Kernel(4, 4, threads=256) as (bx, by):
        A_s = alloc_shared((2, 64, 64), float16)
        B_s = alloc_shared((2, 64, 64), float16)
        C_l = alloc_fragment((64, 64), float32)
        full = alloc_barrier(2, arrive_count=128)
        empty = alloc_barrier(2, arrive_count=128)
        with ws(1, regs=40):
          for k in range(4):
            mbarrier_wait_parity(empty[k % 2], 1 - k // 2 % 2)
            mbarrier_expect_tx(full[k % 2], 16384)
            tma_copy(A[by * 64 : +64, k * 64 : +64], A_s[k % 2 : +1, 0 : +64, 0 : +64], \
full[k % 2])
            tma_copy(B[k * 64 : +64, bx * 64 : +64], B_s[k % 2 : +1, 0 : +64, 0 : +64], \
full[k % 2])
            mbarrier_arrive(full[k % 2])
        with ws(0):
          clear(C_l)
          for k in range(4):
            mbarrier_wait_parity(full[k % 2], k // 2 % 2)
            gemm(A_s[k % 2], B_s[k % 2], C_l)
            mbarrier_arrive(empty[k % 2])
          fence_proxy_async()
          copy(C_l, C[by * 64 : +64, bx * 64 : +64])""")


def test_text_view():
    assert str(kernel()) == TEXT


def test_names_and_lines_keep_the_digest():
    a, b = kernel(), kernel(names=False)
    assert a.proto.buffers[3].loc.line  # allocations carry their line
    assert a != b and a.digest == b.digest
    moved = Program(pb.Program.FromString(a.to_bytes()))
    moved.proto.buffers[6].loc.line += 1
    node(moved.proto, "kernel.body.seq.stmts[0]").loc.line += 1
    assert moved.digest == a.digest


PRODUCER = "kernel.body.seq.stmts[0].warp_group"
P_LOOP = PRODUCER + ".body.for_.body.seq"
CONSUMER_LOOP = "kernel.body.seq.stmts[1].warp_group.body.seq.stmts[1].for_.body.seq"


def _set(path, field, value):
    return lambda p: setattr(node(p, path), field, value)


@pytest.mark.parametrize("edit", [
    _set(PRODUCER, "group", 0),
    _set(PRODUCER, "regs", 48),
    _set("buffers[6]", "arrive_count", 256),
    _set(P_LOOP + ".stmts[0].mbarrier.value.binary.a", "int_value", 0),  # parity
    _set(P_LOOP + ".stmts[1].mbarrier.value", "int_value", 8192),  # bytes
    _set(P_LOOP + ".stmts[1].mbarrier", "kind", pb.MBARRIER_ARRIVE),
    _set(P_LOOP + ".stmts[2].copy.tma", "barrier", 7),  # onto `empty`
    _set(CONSUMER_LOOP + ".stmts[1].gemm.a_index[0]", "int_value", 0),  # a fixed stage
    lambda p: node(p, CONSUMER_LOOP + ".stmts[1].gemm").ClearField("b_index"),
    lambda p: node(p, P_LOOP + ".stmts[2].copy").ClearField("tma"),  # a plain copy
    lambda p: node(p, "kernel.body.seq.stmts[1].warp_group.body.seq.stmts").pop(2),  # fence
])
def test_semantic_edits_change_the_digest(edit):
    base = kernel()
    edited = Program(pb.Program.FromString(base.to_bytes()))
    edit(edited.proto)
    assert edited.digest != base.digest


def test_round_trip_keeps_the_nodes():
    p = kernel()
    again = Program.from_bytes(p.to_bytes())
    assert again == p and str(again) == TEXT
    verify_program(again)
