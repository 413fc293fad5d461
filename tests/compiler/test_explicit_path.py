"""The explicit sm_90a path (sm90_explicit.py): the hand-scheduled GEMM example compiles to a
cubin that really uses mbarriers, TMA, setmaxnreg and wgmma on 128B-swizzled panel tiles (SASS
read with cuobjdump; no GPU needed); gemms whose tiles do not fit wgmma keep mma.sync over
dense tiles, decided per tile; cpu and sm_80 refuse its statements, naming them and where they
are."""

import subprocess
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_sm90_path import sass
from tiled.errors import CompileError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gemm_ws_explicit

EXAMPLE = str(Path(gemm_ws_explicit.__file__).resolve())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_example_compiles_to_mbarriers_tma_and_wgmma(tmp_path, dtype):
    k = gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), dtype=dtype)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    m = c.manifest
    assert m.block[0] == 256 and list(m.cluster) == [1, 1, 1]
    maps = [a for a in m.kernel_args if a.kind == "tensor_map"]
    # One 128B-swizzled box of 64 columns per panel: A [128][64] is one panel, B [64][128]
    # two panels of [64][64].
    assert [(a.param, a.box, a.swizzle) for a in maps] == [(0, (64, 128), 128),
                                                           (1, (64, 64), 128)]
    # 1024 bytes of alignment slack, 4 stages of 128x64 + 64x128 panel tiles, 8 barriers.
    assert m.dynamic_smem_bytes == 1024 + 4 * (128 * 64 + 64 * 128) * 2 + 8 * 8
    text = sass(c.artifact, tmp_path)
    for instr in ("SYNCS", "UTMALDG.2D", "USETMAXREG", "HGMMA"):
        assert instr in text, instr
    assert "HMMA" not in text and "LDSM" not in text  # no mma.sync, no ldmatrix
    assert "LDL" not in text and "STL" not in text  # no register spills
    assert "tiled::sm90::tma_load_panels<1, 16384>" in c.source  # A: 1 panel of 128 rows
    assert "tiled::sm90::tma_load_panels<2, 8192>" in c.source  # B: 2 panels of 64 rows
    t = {"float16": "half", "bfloat16": "__nv_bfloat16"}[dtype]
    assert f"tiled::sm90::wgmma_tile<{t}, 128, 128, 64, false>" in c.source
    assert "tiled::sm90::setmaxnreg_dec<40>" in c.source
    assert "tiled::sm90::bar_init" in c.source and "fence_barrier_init" in c.source


def ptxas_remarks(source: str, tmp_path) -> str:
    from tiled.compiler.toolchain.nvcc import INCLUDE_DIR

    src = tmp_path / "k.cu"
    src.write_text(source)
    out = subprocess.run(["nvcc", "-cubin", "-O3", "-std=c++17", "-w",
                          "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                          "-I", str(INCLUDE_DIR), "-o", str(tmp_path / "k.cubin"), str(src)],
                         capture_output=True, text=True, check=True)
    assert "Compiling entry function" in out.stderr
    return out.stderr


def test_ptxas_does_not_serialize_the_wgmma(tmp_path):
    """ptxas serializes every wgmma of a kernel (remark C7514) when it cannot follow the
    waits: each T.gemm waits for its own group (wait_group 0, static) before the arrive. Nor
    does it drop the producer's setmaxnreg.dec (remark C7507): the regions are one if / else
    chain, so no consumer code follows it."""
    for bm, bn in ((128, 128), (64, 256)):
        k = gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), block_M=bm,
                                    block_N=bn, stages=3)
        c = tiled.compile(k, target="cuda:sm_90a", cache=False)
        assert f"wgmma_tile<half, {bm}, {bn}, 64, false>" in c.source
        err = ptxas_remarks(c.source, tmp_path)
        assert "C7514" not in err and "serialized" not in err, err
        assert "C7507" not in err, err


def test_cpu_and_sm80_refuse_the_explicit_path():
    k = gemm_ws_explicit.matmul(512, 512, 512)
    line = next(i + 1 for i, text in enumerate(Path(EXAMPLE).read_text().splitlines())
                if "with T.ws(1" in text)
    for target, name in (("cpu", "cpu"), ("cuda:sm_80", "cuda:sm_80")):
        with pytest.raises(CompileError) as info:
            tiled.compile(k, target=target, cache=False)
        assert info.value.loc == f"{EXAMPLE}:{line}"
        assert "T.ws is part of the explicit Hopper path" in info.value.message
        assert f"compiles for cuda:sm_90a only, not {name}" in info.value.message


def test_tile_ops_in_warpgroup_one_count_threads_from_its_first():
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared((64, 32), "float16")  # 32-wide K: mma.sync
            C_l = T.alloc_fragment((64, 64), "float32")
            bar = T.alloc_barrier(1, arrive_count=128)
            with T.ws(0):
                T.mbarrier_expect_tx(bar[0], 64 * 32 * 2)
                T.tma_copy(A[0, 0], A_s, bar[0])
                T.mbarrier_arrive(bar[0])
            with T.ws(1):
                T.mbarrier_wait_parity(bar[0], 0)
                T.clear(C_l)
                T.gemm(A_s, A_s, C_l, transpose_B=True)
                for i, j in T.Parallel(64, 64):
                    C_l[i, j] = C_l[i, j] * 2
                T.copy(C_l, C[0, 0])

    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert "tiled::gemm_ss<half, 64, 64, 32, 2, 2, false, true, 32, 32, 128>" in c.source
    assert "((int)threadIdx.x) == 0" in c.source  # warpgroup 0's first thread issues the TMA


def test_fragments_stay_inside_warpgroup_regions():
    @tiled.kernel
    def k(C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=256):
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)  # outside
            with T.ws(0):
                T.copy(C_l, C[0, 0])

    with pytest.raises(CompileError, match=r"fragment C_l is used outside T\.ws") as info:
        tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert info.value.loc.endswith(f":{k.ir.proto.kernel.body.seq.stmts[0].loc.line}")


def test_the_runtime_packs_the_swizzled_tensor_maps():
    """The compiled manifest, packed by the thin runtime with a recording encoder (no GPU):
    one SWIZZLE_128B descriptor per operand, boxes (inner, outer) of 64 columns."""
    from tests.runtime.test_cuda_pack import cai
    from tests.runtime.test_cuda_tensor_map import RecordingEncoder
    from tiled.runtime import bind_args
    from tiled.runtime.cuda import pack_kernel_params
    from tiled.runtime.launch import TensorMapRequest

    m = tiled.compile(gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K")),
                      target="cuda:sm_90a", cache=False).manifest
    a, b, c = 0x7F0000000000, 0x7F0000100000, 0x7F0000200000
    args = bind_args(m.params, [cai((300, 256), "<f2", a), cai((256, 264), "<f2", b),
                                cai((300, 264), "<f2", c)], "cuda")
    enc = RecordingEncoder()
    pack_kernel_params(m, args, encode_tensor_map=enc)
    assert enc.requests == [TensorMapRequest("float16", a, (256, 300), (512,), (64, 128), 128),
                            TensorMapRequest("float16", b, (264, 256), (528,), (64, 64), 128)]


def _two_gemms(k_b: int, read_b: bool):
    """Two gemms in one consumer region: (A1, B1) always fits wgmma; (A2, B2) has a K tile of
    `k_b` and, with `read_b`, B2 is also read element by element."""

    @tiled.kernel
    def k(A: T.Tensor((256, 256), "float16"), B: T.Tensor((256, 256), "float16"),
          C: T.Tensor((256, 256), "float32"), D: T.Tensor((256, 256), "float32")):
        with T.Kernel(1, threads=256):
            A1 = T.alloc_shared((2, 128, 64), "float16")
            B1 = T.alloc_shared((2, 64, 128), "float16")
            A2 = T.alloc_shared((64, k_b), "float16")
            B2 = T.alloc_shared((k_b, 64), "float16")
            C1 = T.alloc_fragment((128, 128), "float32")
            C2 = T.alloc_fragment((64, 64), "float32")
            bar = T.alloc_barrier(1, arrive_count=128)
            with T.ws(1):
                T.mbarrier_expect_tx(bar[0], 2 * 2 * 128 * 64 * 2 + 2 * 64 * k_b * 2)
                for s in T.serial(2):
                    T.tma_copy(A[0, s * 64], A1[s, :, :], bar[0])
                    T.tma_copy(B[s * 64, 0], B1[s, :, :], bar[0])
                T.tma_copy(A[0, 0], A2, bar[0])
                T.tma_copy(B[0, 0], B2, bar[0])
                T.mbarrier_arrive(bar[0])
            with T.ws(0):
                T.mbarrier_wait_parity(bar[0], 0)
                T.clear(C1)
                T.clear(C2)
                for s in T.serial(2):
                    T.gemm(A1[s, :, :], B1[s, :, :], C1)
                T.gemm(A2, B2, C2)
                if read_b:
                    for i, j in T.Parallel(64, 64):
                        C2[i, j] = C2[i, j] + B2[0, j]
                for i, j in T.Parallel(128, 128):
                    C1[i, j] = C1[i, j] * 2
                T.copy(C1, C[0, 0])
                T.copy(C2, D[0, 0])

    return k


@pytest.mark.parametrize(("k_b", "read_b"), [(32, False), (64, True)])
def test_tiles_that_do_not_fit_wgmma_keep_mma_sync(tmp_path, k_b, read_b):
    """Decided per tile: (A1, B1) take wgmma and swizzled 64-wide boxes, while (A2, B2) (a
    32-wide K tile, or B2 also read element by element) keep dense tiles and mma.sync."""
    c = tiled.compile(_two_gemms(k_b, read_b), target="cuda:sm_90a", cache=False)
    assert "tiled::sm90::wgmma_tile<half, 128, 128, 64, false>" in c.source
    assert "tiled::gemm_ss<half, 64, 64, " in c.source
    maps = [(a.param, a.box, a.swizzle) for a in c.manifest.kernel_args
            if a.kind == "tensor_map"]
    assert sorted(maps) == sorted([(0, (64, 128), 128), (1, (64, 64), 128),
                                   (0, (k_b, 64), 0), (1, (64, k_b), 0)])
    text = sass(c.artifact, tmp_path)
    assert "HGMMA" in text and "HMMA" in text


def test_a_k_tile_of_two_panels_and_a_kmajor_b():
    """K = 128: A [64][128] is two K panels; B [N][K] (transpose_B) is K-major, two panels of
    [64 rows][64]; both copies are two 64-wide boxes."""

    @tiled.kernel
    def k(A: T.Tensor((64, 128), "bfloat16"), B: T.Tensor((192, 128), "bfloat16"),
          C: T.Tensor((64, 192), "float32")):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared((64, 128), "bfloat16")
            B_s = T.alloc_shared((192, 128), "bfloat16")
            C_l = T.alloc_fragment((64, 192), "float32")
            bar = T.alloc_barrier(1, arrive_count=128)
            with T.ws(1):
                T.mbarrier_expect_tx(bar[0], (64 + 192) * 128 * 2)
                T.tma_copy(A[0, 0], A_s, bar[0])
                T.tma_copy(B[0, 0], B_s, bar[0])
                T.mbarrier_arrive(bar[0])
            with T.ws(0):
                T.mbarrier_wait_parity(bar[0], 0)
                T.gemm(A_s, B_s, C_l, transpose_B=True, clear_accum=True)
                T.copy(C_l, C[0, 0])

    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert "wgmma_tile<__nv_bfloat16, 64, 192, 128, true>" in c.source  # n128 + n64 wgmmas
    assert "tma_load_panels<2, 8192>" in c.source and "tma_load_panels<2, 24576>" in c.source
    maps = [(a.param, a.box, a.swizzle) for a in c.manifest.kernel_args
            if a.kind == "tensor_map"]
    assert maps == [(0, (64, 64), 128), (1, (64, 192), 128)]
