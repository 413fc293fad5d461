"""Shared tiles whose lifetimes do not meet share bytes where the pool would not fit otherwise
(passes/resources.overlay, targets/cuda/pool.py): TileLang's deepseek_mla example at its own
block_N 64 keeps its output tile over the key ring's bytes, with a barrier between."""

import itertools
import random
import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler.passes.resources import Slot, overlay
from tiled.compiler.targets.cuda.kernel import lower_cuda
from tiled.compiler.targets.cuda.limits import MAX_SMEM
from tiled.ir.program import as_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _meet(a: Slot, b: Slot) -> bool:
    a_first = a.life[1] < b.life[0] and not b.early
    b_first = b.life[1] < a.life[0] and not a.early
    return not (a_first or b_first)


def test_tiles_whose_lives_do_not_meet_share_bytes_and_the_later_waits():
    a = Slot(0, 4096, 128, (0, 2), False)
    b = Slot(1, 1024, 128, (1, 1), False)
    c = Slot(2, 4096, 128, (3, 4), False)  # after a and b: takes a's bytes
    offsets, reuses = overlay([a, b, c])
    assert offsets[0] != offsets[1] and offsets[2] == offsets[0]
    assert reuses == {2: {0}}


def test_a_tile_written_ahead_takes_no_earlier_tiles_bytes():
    a = Slot(0, 4096, 128, (0, 0), False)
    ring = Slot(1, 4096, 1024, (2, 2), True)  # a producer may fill it before statement 2
    out = Slot(2, 4096, 128, (3, 3), False)  # but a later tile may take the ring's bytes
    offsets, reuses = overlay([a, ring, out])
    assert offsets[1] >= offsets[0] + 4096 or offsets[1] + 4096 <= offsets[0]
    assert offsets[1] % 1024 == 0 and 2 in reuses and 1 not in reuses


def test_overlay_never_lets_tiles_that_meet_touch_and_keeps_alignments():
    rng = random.Random(7)
    for _ in range(200):
        slots = []
        for bid in range(rng.randint(1, 8)):
            first = rng.randint(0, 6)
            slots.append(Slot(bid, rng.choice([128, 640, 4096, 8192]), rng.choice([128, 1024]),
                              (first, first + rng.randint(0, 3)), rng.random() < 0.3))
        offsets, reuses = overlay(slots)
        for s in slots:
            assert offsets[s.bid] % s.align == 0
            for o in slots:
                shared = offsets[s.bid] < offsets[o.bid] + o.nbytes and \
                    offsets[o.bid] < offsets[s.bid] + s.nbytes
                if o is not s and shared:
                    assert not _meet(s, o), (s, o, offsets)
                    later = s if s.life[0] > o.life[1] else o
                    assert (o if later is s else s).bid in reuses[later.bid]
        # never larger than the tiles placed end to end
        assert max(offsets[s.bid] + s.nbytes for s in slots) <= \
            sum(-(-s.nbytes // 1024) * 1024 + 1024 for s in slots)


def _staged_gemm(BM=128, BN=128, K=512, dtype="float16"):
    @tiled.kernel
    def staged_gemm(A: T.Tensor((256, K), dtype), B: T.Tensor((K, 256), dtype),
                    C: T.Tensor((256, 256), dtype)):
        with T.Kernel(256 // BN, 256 // BM, threads=128) as (bx, by):
            a = T.alloc_shared((BM, 32), dtype)
            b = T.alloc_shared((32, BN), dtype)
            c_s = T.alloc_shared((BM, BN), dtype)
            c = T.alloc_fragment((BM, BN), "float32")
            T.clear(c)
            for k in T.Pipelined(K // 32, num_stages=3):
                T.copy(A[by * BM, k * 32], a)
                T.copy(B[k * 32, bx * BN], b)
                T.gemm(a, b, c)
            T.copy(c, c_s)
            T.copy(c_s, C[by * BM, bx * BN])

    return staged_gemm


def test_a_pool_that_fits_is_laid_out_end_to_end_as_before():
    _, low = lower_cuda(as_program(_staged_gemm()), "sm_80")
    assert not low.overlaid and not low.reuses
    spans = sorted((t.offset, t.offset + t.nbytes) for t in low.shared.values())
    assert all(hi <= lo2 for (_, hi), (lo2, _) in itertools.pairwise(spans))


def test_tilelang_mla_at_block_n_64_fits_with_its_output_over_the_ring(tmp_path):
    """examples/mla_decode.py at TileLang's own block_N 64, 2 stages: Q (64 KiB), the key ring
    (2 x 72 KiB) and O_shared (64 KiB) add up past sm_90a's 227 KiB; O_shared lives after
    the loop, so it takes the ring's bytes. The TMA producer stays (one block per program
    block: a walking producer would load the next block's tiles during the epilogue), and
    the consumers meet at a barrier before their first store to O_shared."""
    from tests.emulated_examples import example

    k = example("mla_decode").mla_decode(4, 128, 256, 512, 64, block_N=64)
    _, low = lower_cuda(as_program(k), "sm_90a")
    names = {low.buffers[b].name: t for b, t in low.shared.items()}
    assert low.overlaid and low.pool_bytes <= MAX_SMEM["sm_90a"]
    assert low.wsloop is not None and not low.wsloop.persistent
    o, kv = names["O_shared"], names["KV_shared"]
    assert o.offset < kv.offset + kv.nbytes and kv.offset < o.offset + o.nbytes
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    assert c.manifest.block[0] == 384 and "UTMALDG" in text
    assert set(re.findall(r"\bHG?MMA\.\w+", text)) == {"HGMMA.64x32x16", "HGMMA.64x256x16"}
    assert not re.search(r"\b(LDL|STL)\b", text)
    # O_shared written by 16-byte stores (WgmmaTile::store), read by 16-byte loads
    assert "WgmmaTile<64, 512, 2, 2>::store" in c.source
    assert "STS.128" in text and "LDS.128" in text and "STG.E.128" in text
    # the consumers' barrier right after the loop's last normalization, before O_shared
    tail = c.source[c.source.rindex("/ logsum_ptr"):]
    assert re.match(r"[^;]*;\s*tiled::sm90::consumer_sync<256>\(\);", tail)


def test_the_explicit_path_never_overlays():
    from tiled.compiler.targets.cuda.sm90_explicit import ExplicitLowering

    assert ExplicitLowering.overlays is False


def _two_phase(rows: int, cols: int):
    """Y = (X + 1) * X2 through two shared tiles: X's lives in the first two statements, Y's
    after; side by side they pass the target's limit."""
    M = T.dyn("M")

    @tiled.kernel
    def two_phase(X: T.Tensor((M, cols), "float32"), X2: T.Tensor((M, cols), "float32"),
                  Y: T.Tensor((M, cols), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            a = T.alloc_shared((rows, cols), "float32")
            f = T.alloc_fragment((rows, cols), "float32")
            b = T.alloc_shared((rows, cols), "float32")
            T.copy(X[bx * rows, 0], a)
            T.copy(a, f)
            for i, j in T.Parallel(rows, cols):
                b[i, j] = (f[i, j] + 1) * X2[bx * rows + i, j]
            T.copy(b, Y[bx * rows, 0])

    return two_phase


@pytest.mark.parametrize("target,rows,cols", [("rocm:gfx942", 64, 160), ("metal:apple8", 32, 160)])
def test_tiles_sharing_bytes_compute_on_emulation(target, rows, cols):
    """2 x rows x cols x 4 bytes pass ROCm's 64 KiB of LDS (80 KiB) and Metal's 32 KiB of
    threadgroup memory (40 KiB), so the two tiles share bytes; the emulators' shared arenas
    start poisoned, so a read of the wrong bytes shows."""
    from tiled.compiler import compile_program

    k = compile_program(_two_phase(rows, cols), target)
    rng = np.random.default_rng(rows)
    x, x2 = rng.standard_normal((2, 3 * rows - 5, cols)).astype(np.float32)
    y = np.zeros_like(x)
    k.emulate(x, x2, y)
    np.testing.assert_allclose(y, (x + 1) * x2, rtol=1e-6)
