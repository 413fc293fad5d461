"""The CUDA lowering of fragment copies, gemm with fragment operands, GemmWarpPolicy, absmax,
cumsum, atomic max / min and T.vectorized, checked without a GPU:

- layouts: the warp grid each policy picks; TileLang's FlashAttention forward gets one layout
  for acc_s and acc_s_cast (the mma.sync A-operand layout under FullRow) and rows layouts for
  its row vectors; a nest that writes a replicated fragment makes its fragments replicated;
- the generated source: the register-A gemm (gemm_rs) where A lies in the A-operand layout,
  A staged through shared memory otherwise, copies of one layout without barriers or shared
  memory, one lane per quad running an atomic over a rows layout, vector lanes only where
  the accesses are provably aligned;
- tiled_cuda.h's device code on the CPU: gemm_rs's instruction sequence emulated per warp
  (ldmatrix and mma.sync m16n8k16 modelled as in test_cuda_header_emulation.py) on the
  header's own index code (host-compiled with nvcc), against A @ B, with A laid out by the
  compiler's MmaLayout; the CAS loop's word update of atomic max / min for every sub-word type
  and byte position, host-compiled; the atomics' SASS.

The kernels of tests/compiler/test_cuda_tileops_gpu.py compile with nvcc for sm_80 and sm_90a
there and run against numpy references on the H200 (see its docstring).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tvm import tirx

from tests.compiler import test_cuda_tileops_gpu as cases
from tests.compiler.test_cuda_header_emulation import LANES, ldmatrix, mma_m16n8k16
from tiled.compiler.passes.layout_kinds import CyclicLayout, ReplicatedLayout
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.compiler.targets.cuda.layouts import MmaLayout, MmaRows, choose_warps, infer_layouts
from tiled.ir.program import as_program
from tiled.v1 import tile_ir_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "tiled" / "compiler" / "targets" / "cuda" / "include"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
ROW, SQUARE, COL = pb.POLICY_FULL_ROW, pb.POLICY_SQUARE, pb.POLICY_FULL_COL


def source(kernel, arch="sm_80", **options):
    """(generated CUDA source, pool bytes, the lowering)."""
    return CudaBackend().generate_source(as_program(kernel), arch, **options)


def layouts_by_name(kernel, **kw) -> dict:
    p = as_program(kernel).proto
    names = {b.id: b.name for b in p.buffers}
    return {names[b]: lay for b, lay in infer_layouts(p, **kw).items()}


def kernel_body(src: str) -> str:
    return src[src.index('extern "C" __global__'):]


# -- warp grids --------------------------------------------------------------------------------
@pytest.mark.parametrize("M,N,threads,policy,want", [
    (128, 128, 128, SQUARE, (2, 2)),  # today's choice, unchanged
    (128, 128, 128, ROW, (4, 1)),
    (128, 128, 128, COL, (1, 4)),
    (64, 256, 128, SQUARE, (1, 4)),
    (256, 128, 256, SQUARE, (4, 2)),
    (32, 128, 256, ROW, (2, 4)),  # 8 warps do not fit along M = 32: as many as fit
    (128, 16, 256, COL, (4, 2)),  # nor along N = 16
    (16, 8, 128, ROW, None),  # 4 warps fit no 16 x 8 tile
])
def test_choose_warps_follows_the_policy(M, N, threads, policy, want):
    assert choose_warps(M, N, threads, policy) == want


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_policy_changes_the_warp_grid_not_the_result_shape(arch):
    """Each policy's grid reaches gemm_ss (mma.sync). On sm_90a the K tiles are 16 wide
    (32-byte rows, which wgmma's panels do not take; 32-wide ones take wgmma, whose
    warpgroups split M whatever the policy) and the GEMM path is left aside with
    warp_specialize=False. Results are compared bitwise on the H200 (gemm_* cases)."""
    grids = {}
    bk = 16 if arch == "sm_90a" else 32
    for policy, want in ((SQUARE, "2, 2"), (ROW, "4, 1"), (COL, "1, 4")):
        k = cases.matmul(256, 256, 96, policy, block_K=bk)
        lay = layouts_by_name(k)
        grids[policy] = next(v for v in lay.values() if isinstance(v, MmaLayout))
        src, _, _ = source(k, arch, warp_specialize=False)
        assert f"tiled::gemm_ss<half, 128, 128, {bk}, {want}, false, false" in src
        art, _ = cases.compile_case(k, f"cuda:{arch}", {"warp_specialize": False})
        assert art.data[:4] == b"\x7fELF"
    assert len(set(grids.values())) == 3
    assert {g.local_size for g in grids.values()} == {128}  # same work per thread


def test_the_sm90_path_infers_wgmma_rows_layouts():
    """Under FullRow the row max of C gets C's rows layout: mma.sync's on sm_80, wgmma's
    rows on sm_90a, where the per-op path infers wgmma's layouts from the start."""
    k = cases.matmul_row_max(256, 256, 128, ROW).kernel
    assert layouts_by_name(k)["m"] == MmaRows(128, 4)
    _, _, low = source(k, "sm_90a")
    assert type(low.layouts[_bid(k, "m")]).__name__ == "WgmmaRows"


def test_a_row_vector_filled_in_its_own_nest_takes_the_rows_of_its_readers():
    """A per-row scale loaded element by element (no reduction places it) and read as s[i]
    over a FullRow accumulator lives in the accumulator's rows (two floats per thread), not
    replicated (128 per thread)."""
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def row_scaled(A: T.Tensor((128, 32), "float16"), B: T.Tensor((128, 32), "float16"),
                   S: T.Tensor((128,), "float32"), C: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((128, 32), "float16")
            b = T.alloc_shared((128, 32), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            s = T.alloc_fragment((128,), "float32")
            T.copy(A[0, 0], a)
            T.copy(B[0, 0], b)
            for i in T.Parallel(128):
                s[i] = S[i] * 2.0
            T.clear(acc)
            T.gemm(a, b, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(128, 128):
                acc[i, j] *= s[i]
            T.copy(acc, C[0, 0])

    lay = layouts_by_name(row_scaled)
    assert lay["s"] == MmaRows(128, 4) == lay["acc"].rows()


def _bid(kernel, name: str) -> int:
    return next(b.id for b in as_program(kernel).proto.buffers if b.name == name)


# -- FlashAttention as TileLang writes it ----------------------------------------------------------
def test_flash_attention_fullrow_layouts():
    lay = layouts_by_name(cases.flash_attention(1, 2, 256, 64, False))
    acc = MmaLayout(64, 64, 4, 1)
    assert lay["acc_s"] == lay["acc_s_cast"] == lay["acc_o"] == acc
    for v in ("scores_max", "scores_max_prev", "scores_scale", "scores_sum", "logsum"):
        assert lay[v] == MmaRows(64, 4) == acc.rows(), v


def test_flash_attention_square_layouts():
    """Square splits each row over 2 warps: the row statistics take the rows layout of the
    2 x 2 warp grid (4 floats a thread: a warp row holds 32 rows, 4 per quad; not 64
    replicated ones indexed by lane, which nvcc puts in local memory), and each row
    reduction exchanges the two warps' partials through the scratch area after its quad
    shuffles."""
    k = cases.flash_attention(1, 2, 256, 64, False, policy=SQUARE)
    lay = layouts_by_name(k)
    assert lay["acc_s"] == lay["acc_s_cast"] == MmaLayout(64, 64, 2, 2)
    for v in ("scores_max", "scores_max_prev", "scores_scale", "scores_sum", "logsum"):
        assert lay[v] == MmaRows(64, 2, 2) == lay["acc_s"].rows(), v
    src, pool, low = source(k, "sm_80")
    body = kernel_body(src)
    assert body.count("__shfl_xor_sync") == 2 * 4 * 2  # 2 reductions x 4 rows x 2 shuffles
    assert "float scores_max_ptr[4]" in body and "float logsum_ptr[4]" in body
    assert pool - low.scratch_offset >= 2 * 64 * 4  # a partial per warp column and row


def test_flash_attention_fullrow_keeps_p_in_registers():
    src, pool, low = source(cases.flash_attention(1, 2, 256, 64, False), "sm_80")
    body = kernel_body(src)
    assert "tiled::gemm_ss<half, 64, 64, 64, 4, 1, false, true, 72, 72>" in body  # S = Q K^T
    assert "tiled::gemm_rs<half, 64, 64, 64, 4, false, 72>" in body  # O += P V, P in registers
    assert body.count("__shfl_xor_sync") == 2 * 2 * 2  # 2 row reductions x 2 rows x 2 shuffles
    assert low.attn is None  # A in registers: not the sm90 attention path
    # Q, K, V padded gemm tiles and O's staging tile; no scratch area.
    assert pool == 3 * 64 * 72 * 2 + 64 * 64 * 2


def test_flash_attention_on_sm90a_takes_wgmma_per_op():
    """The same kernel on sm_90a: S = Q K^T on wgmma from shared memory (SS), O += P V on
    wgmma with P in registers (RS: the cast copy of S lies in the wgmma A-operand layout),
    Q, K, V as swizzled panel tiles (no padding), row statistics on wgmma's rows layout; the
    loop's K and V copies run ahead on a TMA producer warp (ws_loop.py): a 4-stage ring
    each, a full and an empty barrier per stage, two blocks per SM; the producer loads Q
    too (a head copy: a full and an empty barrier of its own)."""
    src, pool, low = source(cases.flash_attention(1, 2, 256, 64, False), "sm_90a")
    body = kernel_body(src)
    # Issued and left in flight in the TMA-fed loop (ws_rotate.py), S set by its gemm (its
    # clear folded into the first wgmma's zero scale-d: acc_init.py)
    assert "tiled::sm90::wgmma_rows_issue<half, 64, 64, 64, 64, true, false, true>" in body
    assert "tiled::sm90::wgmma_rows_rs_issue<half, 64, 64, 64, false>" in body
    assert "gemm_ss" not in body and "gemm_rs" not in body
    assert body.count("__shfl_xor_sync") == 2 * (2 * 2 * 2)  # the loop and its peeled step
    assert low.attn is None and low.wgmma_ops
    names = {bid: b.name for bid, b in low.buffers.items()}
    assert {names[b] for b in low.wgmma_ops.panels} == {"Q_shared", "K_shared", "V_shared"}
    w = low.wsloop
    assert {names[b] for b in w.tiles} == {"K_shared", "V_shared"} and w.stages == 4
    assert low.launch_threads == 128 + 32 and w.min_blocks == 2  # a producer warp
    assert [rc.box for rc in w.copies] == [[64, 1, 64, 1]] * 2  # BSHD: a 4-D box per panel
    assert [names[rc.tile] for rc in w.heads] == ["Q_shared"]
    assert body.count("tiled::sm90::tma_load(") == 3 and "cp_async_wait<1>" not in body
    tile = 64 * 64 * 2
    assert pool == tile * (1 + 4 + 4 + 1) + 256  # Q, the rings, O's staging, 18 barriers


def test_flash_attention_square_stages_p_through_shared_memory():
    src, pool, _ = source(cases.flash_attention(1, 2, 256, 64, False, policy=SQUARE))
    body = kernel_body(src)
    assert "gemm_rs" not in body
    assert body.count("tiled::gemm_ss<half, 64, 64, 64, 2, 2, false") == 2
    assert pool > 3 * 64 * 72 * 2 + 64 * 64 * 2  # a scratch area for P and the reductions


@needs_nvcc
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("policy", [ROW, SQUARE])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_flash_attention_compiles(tmp_path, arch, policy, causal):
    from tests.compiler.test_sm90_path import sass

    art, m = cases.compile_case(cases.flash_attention(2, 4, 200, 64, causal, policy=policy),
                                f"cuda:{arch}")
    ws = arch == "sm_90a"  # wgmma per op either way, K and V from a TMA producer
    assert m.block == ((128 + 32 if ws else 128), 1, 1)
    if _cuobjdump():
        text = sass(art.data, tmp_path)
        if arch == "sm_80":
            assert "HMMA.16816.F32" in text and "LDSM" in text
        else:  # wgmma per op: SS for S = Q K^T, RS (a register A operand) for O += P V
            assert re.search(r"HGMMA\.64x64x16\.F32 R\d+, gdesc", text)
            assert re.search(r"HGMMA\.64x64x16\.F32 R\d+, R\d+, gdesc", text)
            assert "HMMA" not in text
            assert ("UTMALDG" in text) == ws
        if policy == ROW or arch == "sm_90a":  # Square's replicated row vectors (mma.sync)
            assert "LDL" not in text and "STL" not in text  # are indexed by thread: local


def _cuobjdump() -> bool:
    from tests.compiler.test_cuda_header import _find_tool

    return _find_tool("cuobjdump") is not None


# -- layout rules ---------------------------------------------------------------------------------
def test_rows_layout_matches_its_accumulator():
    """MmaRows: the row of every slot of MmaLayout(M, N, W, 1) in every thread is the row of
    its row slot, and row_members lists exactly the slots of that row."""
    for M, N, W, WN in ((64, 64, 4, 1), (128, 32, 4, 1), (64, 24, 2, 1), (128, 128, 8, 1),
                        (64, 64, 2, 2), (64, 512, 4, 2), (16, 32, 1, 4)):
        acc, rows = MmaLayout(M, N, W, WN), MmaRows(M, W, WN)
        assert acc.rows() == rows
        for tx in range(32 * W * WN):
            members = {s: set(acc.row_members(s)) for s in range(rows.local_size)}
            assert set().union(*members.values()) == set(range(acc.local_size))
            for idx in range(acc.local_size):
                (r, _), _ = acc.coords(tx, idx)
                slot = int(acc.row_slot(idx))
                assert idx in members[slot]
                assert int(rows.coords(tx, slot)[0][0]) == int(r)
        # One holder of each row writes it out: lane 0 of a quad in the warp row's first warp.
        leaders = [tx for tx in range(32 * W * WN)
                   if int(rows.leader(tirx.IntImm("int32", tx)))]
        held = [int(rows.coords(tx, s)[0][0]) for tx in leaders for s in range(rows.local_size)]
        assert sorted(held) == list(range(M))


def _replicated_write_kernel():
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float32"), Out: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            S = T.alloc_shared((64, 64), "float32")
            m = T.alloc_fragment((64,), "float32")
            prev = T.alloc_fragment((64,), "float32")
            T.copy(A[0, 0], S)
            T.fill(prev, 1.0)
            T.reduce_max(S, m, dim=1)  # replicated (a shared source)
            for i in T.Parallel(64):
                m[i] = T.max(m[i], prev[i])  # writes the replicated m
            T.copy(m, Out[0])

    return k


def test_a_nest_writing_a_replicated_fragment_replicates_its_fragments():
    """Each thread runs such a nest whole: prev must be there in every thread too (cyclic,
    only the thread of each element would have updated its copy of m)."""
    lay = layouts_by_name(_replicated_write_kernel())
    assert lay["m"] == lay["prev"] == ReplicatedLayout((64,))


def test_copies_between_fragments():
    lay = layouts_by_name(cases.fragment_copies(ROW).kernel)
    assert lay["acc"] == lay["acc_h"] == MmaLayout(64, 64, 4, 1)
    assert lay["part"] == CyclicLayout((32, 64), 128, 8)  # a part: another layout
    body = kernel_body(source(cases.fragment_copies(ROW).kernel)[0])
    # acc -> acc_h is 32 per-thread casts, with no barrier between the gemm and O1's stores.
    gemm_at = body.index("tiled::gemm_ss")
    first_barrier = body.index("__syncthreads", gemm_at)
    assert body[gemm_at:first_barrier].count("= ((half)") == 32


def test_atomics_over_a_rows_layout_run_in_one_lane_per_quad():
    body = kernel_body(source(cases.absmax_and_rows(ROW).kernel)[0])
    assert body.count("if ((((int)threadIdx.x) % 4) == 0) {\n    atomicAdd(") == 2


def test_atomic_max_min_calls():
    body = kernel_body(source(cases.atomics().kernel)[0])
    for dt in ("int", "int64_t", "int8_t", "float", "half", "double"):
        assert f"tiled::atomic_max((&(Max_{_dt(dt)}_ptr" in body, dt
        assert f"tiled::atomic_min((&(Min_{_dt(dt)}_ptr" in body, dt


def _dt(ctype: str) -> str:
    return {"int": "int32", "int64_t": "int64", "int8_t": "int8", "float": "float32",
            "half": "float16", "double": "float64"}[ctype]


def test_vector_lanes_only_where_aligned():
    body = kernel_body(source(cases.vector_loops().kernel)[0])
    assert "*(float4*)(Y_ptr" in body and "*(float4*)(X_ptr" in body  # aligned: lanes
    assert "*(half4*)(W_ptr" in body  # a shared source with a stride of whole vectors
    assert "(float4*)(Z_ptr" not in body  # X[... + 1]: misaligned, unrolled
    assert "Z_ptr[(" in body


def test_vector_lanes_keep_the_loop_serial():
    """A T.vectorized loop whose iterations see each other's writes (a store read back at
    another element, a store every iteration makes to one element) keeps its serial order."""
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def dep(Y: T.Tensor((1028,), "float32"), S: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(256):
                for v in T.unroll(4):
                    Y[i * 4 + 4 + v] = Y[i * 4 + v] + 1
                cases.vectorize_last()
            for i in T.Parallel(4):
                for v in T.unroll(4):
                    S[i] = S[i] + Y[i * 4 + v]
                cases.vectorize_last()

    body = kernel_body(source(dep)[0])
    assert "float4" not in body


def test_a_nest_naming_its_own_scalars_is_split_over_the_threads():
    """`x = A[...]` read after a write to A lives in a local the DSL makes; each iteration
    sets it before reading it, so the nest is still dealt over the threads (before: every
    thread ran all of it, and in place, which made tiled.ops.rotary_embedding read 1% of
    copy bandwidth on the H200). A local the nest only updates still makes it run whole."""
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def swap_halves(Q: T.Tensor((4, 256), "float32")):
        with T.Kernel(4, threads=128) as t:
            for i in T.Parallel(128):
                x = Q[t, i]
                Q[t, i] = Q[t, i + 128]
                Q[t, i + 128] = x

    body = kernel_body(source(swap_halves)[0])
    assert "threadIdx.x" in body and "for (int" not in body

    @tiled.kernel
    def total(A: T.Tensor((256,), "float32"), S: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_var("float32")
            s = 0.0
            for i in T.Parallel(256):
                s = s + A[i]
            S[0] = s

    assert "for (int" in kernel_body(source(total)[0])  # each thread sums all of A


def test_scan_of_a_replicated_vector_stays_in_each_thread():
    k = cases.prefix_sums(ROW).kernel
    lay = layouts_by_name(k)
    assert lay["r"] == lay["r_scan"] == ReplicatedLayout((64,))
    assert lay["acc_scan"] == lay["acc"] == MmaLayout(64, 32, 4, 1)  # moved whole: one layout
    # float32 tiles of a float32 tensor: runs of 16 bytes (passes/layout.py, _run_lengths)
    assert lay["F"] == lay["G"] == CyclicLayout((64, 32), 128, 4)
    assert lay["racc"] == MmaRows(64, 4)  # scanned where it lies, through shared memory


def test_fragment_operands_of_other_dtypes_are_staged():
    k = cases.gemm_fragment_operands(SQUARE, a_dtype="float32").kernel
    lay = layouts_by_name(k)
    assert lay["acc"] == CyclicLayout((64, 64), 128)  # float32 A: the SIMT gemm
    body = kernel_body(source(k)[0])
    assert "tiled::gemm_ss_simt<float, half, float, 64, 64, 64, 128, false, false, 64, 64>" \
        in body
    assert "tiled::gemm_ss<half, 64, 64, 64, 2, 2, false, false, 72, 72>" in body  # B staged


# -- gemm_rs, emulated on the header's index code ----------------------------------------------
RS_CONFIGS = [  # (M, N, K, WARPS, TRANS_B)
    (64, 64, 64, 4, False), (64, 64, 64, 4, True), (64, 128, 64, 4, False),
    (128, 64, 32, 8, True), (16, 24, 16, 1, False), (32, 40, 48, 2, True),
]

RS_DUMP = r"""
#include "tiled_cuda.h"
#include <cstdio>

template <int M, int N, int K, int W, bool TB, int LDB>
void dump(int id) {
  constexpr int MT = M / W / 16, NT = N / 8;
  printf("CFG %d\n", id);
  for (int idx = 0; idx < tiled::acc_size<M, K, W, 1>(); ++idx)
    for (int tid = 0; tid < 32 * W; ++tid) {
      int r, c;
      tiled::detail::acc_coord_of<M, K, W, 1>(tid, idx, r, c);
      printf("A %d %d %d %d\n", idx, tid, r, c);
    }
  for (int idx = 0; idx < tiled::acc_size<M, N, W, 1>(); ++idx)
    for (int tid = 0; tid < 32 * W; ++tid) {
      int r, c;
      tiled::detail::acc_coord_of<M, N, W, 1>(tid, idx, r, c);
      printf("C %d %d %d %d\n", idx, tid, r, c);
    }
  for (int ks = 0; ks < K / 16; ++ks) {
    for (int mt = 0; mt < MT; ++mt)
      for (int j = 0; j < 4; ++j)
        printf("R %d %d %d %d\n", mt, ks, j, tiled::detail::gemm_rs_a_index<K>(mt, ks, j));
    for (int nt = 0; nt < NT; ++nt) {
      const bool x4 = nt + 1 < NT && nt % 2 == 0, x2 = NT % 2 == 1 && nt == NT - 1;
      if (!x4 && !x2) continue;
      printf("B %d %d %d", ks, nt, x4 ? 4 : 2);
      for (int l = 0; l < 32; ++l)
        printf(" %d", x4 ? tiled::detail::gemm_b_addr<N, K, 1, TB, LDB, true>(0, l, ks, nt)
                         : tiled::detail::gemm_b_addr<N, K, 1, TB, LDB, false>(0, l, ks, nt));
      printf("\n");
    }
  }
}

int main() {
%CALLS%
  return 0;
}
"""


def _ldb(cfg) -> int:
    _, N, K, _, tb = cfg
    return (K if tb else N) + 8


@pytest.fixture(scope="module")
def rs_tables(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not installed")
    calls = "\n".join(f"  dump<{M}, {N}, {K}, {W}, {str(tb).lower()}, {_ldb(c)}>({i});"
                      for i, c in enumerate(RS_CONFIGS) for M, N, K, W, tb in [c])
    d = tmp_path_factory.mktemp("rsdump")
    (d / "dump.cu").write_text(RS_DUMP.replace("%CALLS%", calls))
    subprocess.run([NVCC, "-std=c++17", "-O1", f"-I{INCLUDE}", str(d / "dump.cu"), "-o",
                    str(d / "dump")], check=True, capture_output=True)
    out = subprocess.run([str(d / "dump")], check=True, capture_output=True, text=True).stdout
    tables, cur = {}, None
    for line in out.splitlines():
        f = line.split()
        if f[0] == "CFG":
            cur = tables.setdefault(int(f[1]), {"A": {}, "C": {}, "R": {}, "B": {}})
        elif f[0] in "AC":
            cur[f[0]][(int(f[1]), int(f[2]))] = (int(f[3]), int(f[4]))
        elif f[0] == "R":
            cur["R"][tuple(map(int, f[1:4]))] = int(f[4])
        else:
            cur["B"][(int(f[1]), int(f[2]))] = (int(f[3]), np.array(f[4:], dtype=int))
    return tables


def emulate_gemm_rs(cfg, t, rng, swap_a_tiles=False):
    """(C, expected): gemm_rs's instruction sequence for every warp, on the header's tables."""
    M, N, K, W, tb = cfg
    ldb = _ldb(cfg)
    a = rng.integers(-8, 9, (M, K)).astype(np.float64)
    b_dense = rng.integers(-8, 9, (N, K) if tb else (K, N)).astype(np.float64)
    sB = np.full((b_dense.shape[0], ldb), np.nan)  # padding poisons C if read
    sB[:, :b_dense.shape[1]] = b_dense
    sB = sB.ravel()
    init = rng.integers(-4, 5, (M, N)).astype(np.float64)
    MT, NT = M // W // 16, N // 8
    NA, NC = MT * K // 8 * 4, MT * NT * 4  # A and C slots per thread
    C = np.full((M, N), np.nan)
    for warp in range(W):
        tids = warp * 32 + LANES
        frag = np.array([[a[t["A"][(i, tid)]] for i in range(NA)] for tid in tids])
        acc = np.array([[init[t["C"][(i, tid)]] for i in range(NC)] for tid in tids])
        for ks in range(K // 16):
            bf = [None] * NT
            for nt in range(NT):
                if (ks, nt) not in t["B"]:
                    continue
                num, addrs = t["B"][(ks, nt)]
                regs = ldmatrix(sB, addrs, num, trans=not tb)
                bf[nt] = regs[:, 0:2]
                if num == 4:
                    bf[nt + 1] = regs[:, 2:4]
            for mt in range(MT):
                order = (2, 3, 0, 1) if swap_a_tiles else (0, 1, 2, 3)
                af = np.stack([frag[:, [t["R"][(mt, ks, j)], t["R"][(mt, ks, j)] + 1]]
                               for j in order], axis=1)  # [lane, 4, 2]
                for nt in range(NT):
                    sl = slice((mt * NT + nt) * 4, (mt * NT + nt) * 4 + 4)
                    acc[:, sl] = mma_m16n8k16(af, bf[nt], acc[:, sl])
        for i in range(NC):
            for lane, tid in enumerate(tids):
                C[t["C"][(i, tid)]] = acc[lane, i]
    return C, init + a @ (b_dense.T if tb else b_dense)


@pytest.mark.parametrize("index", range(len(RS_CONFIGS)))
def test_gemm_rs_emulation_on_the_header_index_code(rs_tables, index):
    C, want = emulate_gemm_rs(RS_CONFIGS[index], rs_tables[index], np.random.default_rng(5))
    np.testing.assert_array_equal(C, want)


def test_gemm_rs_emulation_detects_a_wrong_register_order(rs_tables):
    C, want = emulate_gemm_rs(RS_CONFIGS[0], rs_tables[0], np.random.default_rng(6),
                              swap_a_tiles=True)
    assert not np.array_equal(C, want)


@pytest.mark.parametrize("index", range(len(RS_CONFIGS)))
def test_compiler_layout_is_the_header_a_fragment(rs_tables, index):
    """The compiler writes acc_s_cast by MmaLayout(M, K, W, 1) (T.copy, T.Parallel); gemm_rs
    reads it by acc_coord_of<M, K, W, 1>: the two agree on every thread and slot."""
    M, _, K, W, _ = RS_CONFIGS[index]
    lay = MmaLayout(M, K, W, 1)
    for (idx, tid), (r, c) in rs_tables[index]["A"].items():
        (lr, lc), _ = lay.coords(tid, idx)
        assert (int(lr), int(lc)) == (r, c)


# -- atomic max / min ------------------------------------------------------------------------------
WORD_DUMP = r"""
#include "tiled_cuda.h"
#include <cstdio>
#include <type_traits>

template <int OP, typename T>
void one(const char* name, uint32_t word, int shift, T v) {
  printf("%s %d %d %u %u %u\n", name, OP, shift, word,
         static_cast<uint32_t>(tiled::detail::bits_of(v)),
         tiled::detail::word_update<OP, T>(word, shift, v));
}

int main() {
  const uint32_t words[] = {0x3c00bc00u, 0x7e00fc00u, 0x80017fffu, 0x00000000u, 0xc0490fdbu};
  const float vals[] = {-2.5f, 0.0f, 1.0f, 65504.0f, -0.0f};
  for (uint32_t w : words)
    for (float f : vals)
      for (int s = 0; s < 4; ++s)
        for (int op = 1; op <= 2; ++op) {
          auto each = [&](auto tag) {
            constexpr int OP = decltype(tag)::value;
            one<OP>("half", w, 16 * (s & 1), __float2half(f));
            one<OP>("bf16", w, 16 * (s & 1), __float2bfloat16(f));
            one<OP>("int8", w, 8 * s, static_cast<int8_t>(f * 40));
            one<OP>("uint8", w, 8 * s, static_cast<uint8_t>(f * 40));
            one<OP>("float", w, 0, f);
          };
          if (op == 1) each(std::integral_constant<int, tiled::detail::OP_MAX>());
          else each(std::integral_constant<int, tiled::detail::OP_MIN>());
        }
  for (uint32_t w : words)
    for (int s = 0; s < 4; ++s) {
      one<tiled::detail::OP_ADD>("int8", w, 8 * s, static_cast<int8_t>(-100 + 37 * s));
      one<tiled::detail::OP_ADD>("uint8", w, 8 * s, static_cast<uint8_t>(200 + 11 * s));
      one<tiled::detail::OP_ADD>("int16", w, 16 * (s & 1), static_cast<int16_t>(-30000 + s));
    }
  return 0;
}
"""


def _as(name: str, bits: int) -> float:
    if name == "half":
        return float(np.array([bits], np.uint16).view(np.float16)[0])
    if name == "bf16":
        return float(np.array([bits << 16], np.uint32).view(np.float32)[0])
    if name == "float":
        return float(np.array([bits], np.uint32).view(np.float32)[0])
    if name == "int16":
        return float(np.array([bits], np.uint16).view(np.int16)[0])
    return float(np.array([bits], np.uint8).view(np.int8 if name == "int8" else np.uint8)[0])


@needs_nvcc
def test_atomic_word_update(tmp_path):
    """The CAS loop's update of the aligned word: max / min replace the element at `shift`
    only when the value wins (greater / smaller; NaN never wins, a stored NaN stays), adds
    wrap in the element's width, and the other bytes of the word are kept."""
    (tmp_path / "w.cu").write_text(WORD_DUMP)
    subprocess.run([NVCC, "-std=c++17", f"-I{INCLUDE}", str(tmp_path / "w.cu"), "-o",
                    str(tmp_path / "w")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "w")], check=True, capture_output=True, text=True)
    width = {"half": 16, "bf16": 16, "int8": 8, "uint8": 8, "int16": 16, "float": 32}
    lines = out.stdout.splitlines()
    assert len(lines) == 5 * 5 * 4 * 2 * 5 + 5 * 4 * 3
    adds = replaced = 0
    for line in lines:
        name, *nums = line.split()
        op, shift, word, v, got = map(int, nums)
        mask = (1 << width[name]) - 1
        rest = 0xFFFFFFFF & ~(mask << shift)
        assert got & rest == word & rest, line  # the neighbours are kept
        old, new = (word >> shift) & mask, (got >> shift) & mask
        if op == 0:
            want = (old + v) & mask  # wraps in the element's width
            adds += 1
        else:
            a, b = _as(name, v), _as(name, old)
            wins = (a > b) if op == 1 else (a < b)  # False with a NaN on either side
            want = v if wins else old
            replaced += wins
        assert new == want, line
    assert adds == 60 and replaced > 100


@needs_nvcc
def test_atomic_word_add_wraps_at_the_edges(tmp_path):
    src = WORD_DUMP.split("int main() {")[0] + r"""
int main() {
  one<tiled::detail::OP_ADD>("int8", 0x7f00ff80u, 0, static_cast<int8_t>(-1));   // -128 - 1
  one<tiled::detail::OP_ADD>("int8", 0x7f00ff80u, 24, static_cast<int8_t>(1));   // 127 + 1
  one<tiled::detail::OP_ADD>("uint8", 0x12ff3456u, 16, static_cast<uint8_t>(2)); // 255 + 2
  one<tiled::detail::OP_ADD>("int16", 0x80007fffu, 0, static_cast<int16_t>(1));  // 32767 + 1
  return 0;
}
"""
    (tmp_path / "a.cu").write_text(src)
    subprocess.run([NVCC, "-std=c++17", f"-I{INCLUDE}", str(tmp_path / "a.cu"), "-o",
                    str(tmp_path / "a")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "a")], check=True, capture_output=True, text=True)
    got = [int(line.split()[-1]) for line in out.stdout.splitlines()]
    assert got == [0x7f00ff7f, 0x8000ff80, 0x12013456, 0x80008000]


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_atomics_sass(tmp_path, arch):
    """32- and 64-bit integers take the hardware's max / min; the rest a CAS loop."""
    if not _cuobjdump():
        pytest.skip("cuobjdump missing")
    from tests.compiler.test_sm90_path import sass

    art, _ = cases.compile_case(cases.atomics().kernel, f"cuda:{arch}")
    text = sass(art.data, tmp_path)
    for op in ("MAX.S32", "MIN.S32", "MAX.S64", "MIN.S64"):  # reductions: the old value unused
        assert re.search(rf"\b(RED|ATOM)G?\.E\.{op}\b", text), op
    assert re.search(r"\bATOMG?\.E\.CAS\.64\b", text)  # double
    assert re.search(r"\bATOMG?\.E\.CAS\.STRONG", text)  # 32-bit words: sub-word types too


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
