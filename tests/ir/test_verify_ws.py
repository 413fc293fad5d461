"""The explicit Hopper path's verifier rules (tiled.ir.verify_ws): each misuse is rejected with
a message that names it, located at the author's line (the marker comment on it)."""

import re
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tiled import config
from tiled.errors import KernelDefinitionError, VerifyError
from tiled.ir import Program, verify_program
from tiled.v1 import tile_ir_pb2 as pb

SOURCE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file that carries `# <marker>`."""
    hits = [i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def producer_consumer(bug: str = "", threads: int = 256, stages: int = 2, BK: int = 64):
    """A small hand-scheduled GEMM; `bug` injects one misuse."""

    @tiled.kernel
    def k(A: T.Tensor((256, 256), "float16"), B: T.Tensor((256, 256), "float16"),
          C: T.Tensor((256, 256), "float32")):
        with T.Kernel(2, 2, threads=threads) as (bx, by):
            A_s = T.alloc_shared((stages, 64, BK), "float16")
            B_s = T.alloc_shared((stages, BK, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            full = T.alloc_barrier(stages, arrive_count=1 if bug == "count" else 128)  # count
            empty = T.alloc_barrier(stages, arrive_count=128)
            not_a_barrier = T.alloc_shared((stages,), "uint64")
            n = 256 // BK
            with T.ws(1 if bug != "group" else 2, regs=40 if bug != "regs" else 41):  # group
                for i in T.serial(n):
                    s = i % stages
                    T.mbarrier_wait_parity(empty[s], 1 - (i // stages) % 2)
                    if bug != "no-expect":
                        T.mbarrier_expect_tx(full[s], (64 * BK * 2) * 2)
                    T.tma_copy(A[by * 64, i * BK], A_s[s, :, :], full[s])  # tma-a
                    T.tma_copy(B[i * BK, bx * 64], B_s[s, :, :], full[s])
                    if bug == "index":
                        T.mbarrier_arrive(full[stages])  # index
                    elif bug != "no-arrive":
                        T.mbarrier_arrive(full[s])
                    if bug == "nested":
                        with T.ws(0):  # nested
                            T.fence_proxy_async()
            with T.ws(0):
                T.clear(C_l)
                for i in T.serial(n):
                    s = i % stages
                    if bug == "uninitialized":
                        T.mbarrier_wait_parity(not_a_barrier[s], 0)  # uninitialized
                    T.mbarrier_wait_parity(full[s], (i // stages) % 2)  # wait-full
                    if bug == "parity":
                        T.mbarrier_wait_parity(full[s], 2)  # parity
                    T.gemm(A_s[s, :, :], B_s[s, :, :], C_l)
                    T.mbarrier_arrive(empty[s])
                T.copy(C_l, C[by * 64, bx * 64])

    return k


def rejects(bug: str, message: str, marker: str | None, **kw) -> KernelDefinitionError:
    with pytest.raises(KernelDefinitionError) as info:
        _ = producer_consumer(bug, **kw).ir
    err = info.value
    assert re.search(message, err.message), err.message
    if marker is not None:
        assert (err.file, err.line) == (__file__, line_of(marker)), str(err)
    return err


def test_the_sample_verifies():
    verify_program(producer_consumer().ir)


@pytest.mark.parametrize(("bug", "message", "marker"), [
    ("uninitialized", r"T.mbarrier_wait_parity on not_a_barrier, a shared buffer: mbarrier ops "
                      r"need a barrier from T.alloc_barrier, which also initializes it .* a wait "
                      "never returns", "uninitialized"),
    ("no-arrive", r"T.mbarrier_wait_parity on full waits for a phase that never completes: no "
                  r"T.mbarrier_arrive names full anywhere", "wait-full"),
    ("no-expect", r"T.tma_copy completes its bytes on full, but no T.mbarrier_expect_tx",
     "tma-a"),
    ("index", r"index 2 is out of bounds for full dim 0 of extent 2", "index"),
    ("parity", "waits for parity 2; a parity is 0 or 1", "parity"),
    ("count", r"T.mbarrier_arrive here runs on 128 threads, each arriving once on full, whose "
              "phases complete after 1 arrival", None),
    ("group", r"T.ws\(2\) names warpgroup 2, but 256 threads make 2 warpgroup\(s\), 0..1",
     "group"),
    ("regs", "setmaxnreg takes 24..256 registers, a multiple of 8", "group"),
    ("nested", r"T.ws\(0\) is nested in T.ws\(1\); warpgroup regions do not nest", "nested"),
])
def test_misuse_is_rejected_where_it_is_written(bug, message, marker):
    rejects(bug, message, marker)


def test_warpgroups_need_whole_warpgroups_of_threads():
    rejects("", r"T.ws needs the kernel's threads to be a multiple of 128 .* launches 192",
            "group", threads=192)


def test_more_arrivals_than_threads_is_rejected_at_the_allocation():
    @tiled.kernel
    def k(A: T.Tensor((256,), "float16")):
        with T.Kernel(1, threads=128):
            bar = T.alloc_barrier(1, arrive_count=256)  # too-many
            T.mbarrier_arrive(bar[0])
            T.mbarrier_wait_parity(bar[0], 0)

    with pytest.raises(KernelDefinitionError, match="waits for 256 arrivals per phase, more than "
                       "the block's 128 threads can give") as info:
        _ = k.ir
    assert info.value.line == line_of("too-many")


def test_tma_boxes_need_16_byte_rows():
    rejects("", r"TMA boxes have at most 256 elements per dim and rows of a multiple of 16 "
                "bytes; these rows are 8 bytes", "tma-a", BK=4)


def test_shared_memory_over_the_limit_is_located_at_the_crossing_allocation():
    with config.override(max_shared_bytes=2 * 16384 + 8):
        err = rejects("", r"kernel allocates 33 KiB \(32816 bytes\) of shared memory, the limit "
                          r"is 33 KiB \(32776 bytes\).*; full crosses the limit\)", "count")
    assert "reduce block sizes or num_stages" in err.message


def test_barriers_are_not_memory():
    p = producer_consumer().ir.proto
    bar = next(b for b in p.buffers if b.scope == pb.BARRIER)
    store = pb.Stmt()
    store.store.buffer = bar.id
    store.store.indices.add(dtype=pb.INT32, int_value=0)
    store.store.value.CopyFrom(pb.Expr(dtype=pb.UINT64, int_value=0))
    p.kernel.body.seq.stmts.append(store)
    with pytest.raises(VerifyError, match=r"is a barrier: it is used only by T\.mbarrier_"):
        verify_program(Program(p))


def test_tma_copies_fill_whole_tiles_of_shared_buffers():
    @tiled.kernel
    def k(A: T.Tensor((256, 256), "float16")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((64, 128), "float16")
            full = T.alloc_barrier(1)
            T.mbarrier_expect_tx(full[0], 64 * 64 * 2)
            T.tma_copy(A[0, 0], A_s[0:64, 0:64], full[0])  # half-tile
            T.mbarrier_arrive(full[0])
            T.mbarrier_wait_parity(full[0], 0)

    with pytest.raises(KernelDefinitionError, match=r"T\.tma_copy fills whole 2-d tiles") as info:
        _ = k.ir
    assert info.value.line == line_of("half-tile")
