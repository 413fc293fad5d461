"""The sm_90a attention path (sm90_attn.py): which programs take it, what their
manifests and cubins hold (SASS read with cuobjdump; no GPU needed), and the rows layout its
softmax runs on. Numerics are checked on the H200 by benchmarks/gpu/flash_attention.py."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.compiler.passes.layout_kinds import ReplicatedLayout
from tiled.compiler.targets.cuda.layouts import (
    MmaRows,
    WgmmaLayout,
    WgmmaRows,
    infer_layouts,
)
from tiled.ir.program import as_program
from tiled.ir.walk import walk
from tiled.runtime.manifest import expr_names
from tiled.v1 import tile_ir_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import flash_attention as fa

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.mark.parametrize("dim,causal,dtype,kv_heads", [(128, False, "bfloat16", 16),
                                                       (64, True, "float16", 4)])
def test_flash_attention_takes_the_warp_specialized_path(tmp_path, dim, causal, dtype,
                                                         kv_heads):
    k = fa.flash_attention(8, 16, kv_heads, 4096, 4096, dim, causal, dtype, block_M=128,
                           block_N=128, threads=256)
    c = tiled.compile(k, "cuda:sm_90a", cache=False)
    m = c.manifest
    assert m.block[0] == 256 + 128  # two consumer warpgroups and the producer
    if causal:  # blocks of different lengths: the program's grid, the hardware balances them
        assert list(m.grid) == [32, 16, 8]
    else:  # persistent: min(blocks, SMs) blocks walk the program's blocks
        assert "tiled_sm_count" in expr_names(m.grid[0]) and list(m.grid[1:]) == [1, 1]
    maps = [a for a in m.kernel_args if a.kind == "tensor_map"]
    # Q, K, V: one 4-D descriptor each, a 64-column panel of one head's rows per box.
    assert sorted(a.param for a in maps) == [0, 1, 2]
    assert {a.box for a in maps} == {(64, 128, 1, 1)} and {a.swizzle for a in maps} == {128}
    text = sass(c.artifact, tmp_path)
    for op in ("HGMMA", "UTMALDG.4D", "SYNCS", "USETMAXREG", "SHFL.BFLY"):
        assert op in text, op
    assert "LDL" not in text and "STL" not in text  # no register spills
    assert "WsAttn<" in c.source and "::store<" in c.source  # 16-byte output stores


def test_ptxas_does_not_serialize_the_wgmma_pipeline(tmp_path):
    """ptxas serializes every wgmma of a kernel (remark C7514) when it cannot prove that no
    accumulator is read while in flight: the attention loop keeps every wait static."""
    k = fa.flash_attention(2, 4, 4, 1024, 1024, 128, True, "bfloat16", block_M=128,
                           block_N=128, threads=256)
    c = tiled.compile(k, "cuda:sm_90a", cache=False)
    src = tmp_path / "k.cu"
    src.write_text(c.source)
    from tiled.compiler.toolchain.nvcc import INCLUDE_DIR

    out = subprocess.run(["nvcc", "-cubin", "-O3", "-std=c++17", "-w",
                          "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                          "-I", str(INCLUDE_DIR), "-o", str(tmp_path / "k.cubin"), str(src)],
                         capture_output=True, text=True, check=True)
    assert "Compiling entry function" in out.stderr
    assert "C7514" not in out.stderr and "serialized" not in out.stderr, out.stderr


def test_symbolic_sequence_lengths_take_the_path():
    S = T.dyn("S")
    c = tiled.compile(fa.flash_attention(1, 2, 2, S, S, 64, True), "cuda:sm_90a", cache=False)
    assert "WsAttn<" in c.source
    assert [a.name for a in c.manifest.kernel_args if a.kind == "dim"] == ["S"]


def test_other_programs_keep_the_generic_path():
    k = fa.flash_attention(1, 2, 2, 256, 256, 64)
    assert "WsAttn<" not in tiled.compile(k, "cuda:sm_90a", cache=False,
                                          warp_specialize=False).source
    assert "WsAttn<" not in tiled.compile(k, "cuda:sm_80", cache=False).source
    # 96 threads: not a whole warpgroup.
    odd = fa.flash_attention(1, 2, 2, 256, 256, 64, threads=96)
    assert "WsAttn<" not in tiled.compile(odd, "cuda:sm_90a", cache=False).source


def test_row_reductions_of_a_wgmma_tile_use_the_rows_layout():
    p = as_program(fa.flash_attention(1, 2, 2, 256, 256, 128, block_M=128, block_N=128,
                                      threads=256)).proto
    s, acc = (st.gemm.c for st in walk(p.kernel.body) if st.WhichOneof("kind") == "gemm")
    rows = {st.reduce.dst for st in walk(p.kernel.body) if st.WhichOneof("kind") == "reduce"}
    lay = infer_layouts(p, {s: WgmmaLayout(128, 128, 2), acc: WgmmaLayout(128, 128, 2)})
    assert {lay[b] for b in rows} == {WgmmaRows(128, 2)}
    alpha = [b.id for b in p.buffers if b.scope == pb.FRAGMENT and len(b.shape) == 1]
    assert len(alpha) == 3 and {lay[b] for b in alpha} == {WgmmaRows(128, 2)}
    assert WgmmaRows(128, 2).local_size == 2  # two rows per thread: t / 4 and t / 4 + 8
    # Without the wgmma accumulators (the generic path: mma.sync on a 2 x 4 warp grid) the
    # row vectors take the mma accumulator's rows, split over its 4 warp columns.
    generic = infer_layouts(p)
    assert {generic[b] for b in alpha} == {MmaRows(128, 2, 4)}


def test_a_row_vector_read_over_a_tile_with_other_rows_is_replicated():
    @tiled.kernel
    def rows_mismatch(A: T.Tensor((128, 128), "float16"), Out: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared((128, 128), "float16")
            S = T.alloc_fragment((128, 128), "float32")
            C = T.alloc_fragment((128, 128), "float32")
            m = T.alloc_fragment((128,), "float32")
            T.copy(A, A_s)
            T.clear(S)
            T.gemm(A_s, A_s, S, transpose_B=True)
            T.reduce_max(S, m, dim=1)
            for i, j in T.Parallel(128, 128):
                C[i, j] = m[j]  # indexed by the column: not a row read
            T.copy(C, Out)

    p = as_program(rows_mismatch).proto
    s = next(st.gemm.c for st in walk(p.kernel.body) if st.WhichOneof("kind") == "gemm")
    m = next(st.reduce.dst for st in walk(p.kernel.body) if st.WhichOneof("kind") == "reduce")
    assert isinstance(infer_layouts(p, {s: WgmmaLayout(128, 128, 2)})[m], ReplicatedLayout)


@pytest.mark.parametrize("layout,causal,varlen", [("bshd", False, False), ("bhsd", True, False),
                                                  ("bshd", True, True)])
def test_the_attention_ops_kernels_take_the_path(layout, causal, varlen):
    """tiled.ops.attention's kernel (a mask, GQA, varlen offsets read from cu_seqlens, and a
    T.copy between fragments in the loop) has the FlashAttention shape the path takes."""
    from tiled.ops import prefill

    k = prefill.prefill_kernel(32, 8, 128, "bfloat16", layout, causal, 0, 0.0, 128 ** -0.5,
                               varlen, False, BM=128, BN=128, threads=256)
    c = tiled.compile(k, "cuda:sm_90a", cache=False)
    assert "WsAttn<" in c.source and c.manifest.block[0] == 256 + 128
    persistent = "tiled_sm_count" in expr_names(c.manifest.grid[0])
    assert persistent == (not causal and not varlen)  # only then do all blocks walk alike
