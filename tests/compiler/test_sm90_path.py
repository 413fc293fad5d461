"""The automatic sm_90a path for GEMMs (per-op wgmma fed by a TMA producer, ws_loop.py): which
GEMMs take it, and that their cubins really use wgmma, TMA and mbarriers (SASS read with
cuobjdump; no GPU needed)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_cuda_header import _find_tool
from tiled.errors import CompileError
from tiled.runtime.manifest import SM_COUNT_DIM, expr_names

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gemm


def sass(artifact: bytes, tmp_path: Path, function: str | None = None) -> str:
    """The cubin's SASS; with `function`, that kernel's only (a cubin may hold a fallback)."""
    tool = _find_tool("cuobjdump")
    assert tool, "cuobjdump is missing: the dev extra installs nvidia-cuda-cuobjdump"
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(artifact)
    text = subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    if function is None:
        return text
    parts = text.split("Function : ")
    return next(part for part in parts[1:] if part.split()[0] == function)


@pytest.mark.parametrize("dtype,bm,bn,threads", [("float16", 128, 256, 256),
                                                 ("bfloat16", 128, 128, 128)])
def test_example_gemm_is_warp_specialized_on_sm90a(tmp_path, dtype, bm, bn, threads):
    k = gemm.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), bm, bn, 64, 4, dtype, threads=threads)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    m = c.manifest
    # the producer: a warpgroup beside two consumer warpgroups (registers moved by
    # setmaxnreg), a warp beside one, whose ring takes the SM: then a second consumer
    # warpgroup takes every other program block of the walk (ws_plan.alternate_choice)
    assert m.block[0] == (threads + 128 if threads >= 256 else 2 * threads + 32)
    maps = [a for a in m.kernel_args if a.kind == "tensor_map"]
    assert [a.param for a in maps] == [0, 1]
    assert "tiled_sm_count" in expr_names(m.grid[0])  # persistent blocks
    assert list(m.grid[1:]) == [1, 1]
    text = sass(c.artifact, tmp_path, m.symbol)
    for instr in ("HGMMA.64x", "UTMALDG", "SYNCS", "STG.E.128") + \
            (("USETMAXREG",) if threads >= 256 else ()):
        assert instr in text, instr
    assert "LDL" not in text and "STL" not in text  # the accumulator stays in registers
    assert "HMMA" not in text  # not the sm_80 instruction path
    # K and N are symbolic: A's and B's rows may be any number of bytes apart, which TMA
    # cannot describe. Those launches take the sm_80 variant shipped in the same cubin.
    assert m.requires == (("floormod", ("mul", 2, "K"), 16), ("floormod", ("mul", 2, "N"), 16))
    fb = m.fallback_manifest()
    assert fb.block[0] == threads and SM_COUNT_DIM not in expr_names(fb.grid[0]) and \
        not [a for a in fb.kernel_args if a.kind == "tensor_map"]
    fb_text = sass(c.artifact, tmp_path, fb.symbol)  # cp.async, and wgmma per op
    assert "HGMMA" in fb_text and "HMMA" not in fb_text and "UTMALDG" not in fb_text


def test_tma_strides_decide_the_path_at_compile_time(tmp_path):
    """K = 777 fp16: A's rows are 1554 bytes apart, which no TMA descriptor can describe: the
    GEMM takes the cp.async path (it launches for every shape its manifest accepts); with M
    symbolic and N, K multiples of 8 the strides are known good and no fallback is shipped."""
    ragged = tiled.compile(gemm.matmul(1000, 1024, 777, 128, 128, 64, 3, "float16",
                                       threads=128), target="cuda:sm_90a", cache=False)
    m = ragged.manifest
    assert m.block[0] == 128 and not m.requires and m.fallback is None
    assert not [a for a in m.kernel_args if a.kind == "tensor_map"]
    ragged_text = sass(ragged.artifact, tmp_path)  # cp.async into panel tiles, wgmma per op
    assert "HGMMA" in ragged_text and "UTMALDG" not in ragged_text
    serving = tiled.compile(gemm.matmul(T.dyn("M"), 4096, 4096, 128, 128, 64, 3, "float16",
                                        threads=128), target="cuda:sm_90a", cache=False)
    m = serving.manifest
    # two consumer warpgroups taking the blocks in turn, and the producer warp
    assert m.block[0] == 2 * 128 + 32 and not m.requires and m.fallback is None
    assert "gemm_fallback_kernel" not in sass(serving.artifact, tmp_path)


def test_explicit_tma_copies_need_launchable_strides():
    import gemm_ws_explicit

    with pytest.raises(CompileError, match=r"gemm_ws_explicit.py:\d+: T.tma_copy from A "
                                           r"\(1024x777 float16\): TMA needs its rows"):
        tiled.compile(gemm_ws_explicit.matmul(1024, 1024, 777), target="cuda:sm_90a",
                      cache=False)
    symbolic = tiled.compile(gemm_ws_explicit.matmul(T.dyn("M"), 1024, T.dyn("K")),
                             target="cuda:sm_90a", cache=False).manifest
    assert symbolic.requires == (("floormod", ("mul", 2, "K"), 16),)
    assert symbolic.fallback is None  # the author asked for TMA: such launches are refused


def test_sm80_and_non_matching_kernels_keep_the_sm80_path(tmp_path):
    """No warp specialization: sm_80 (mma.sync); sm_90a without warp specialization, where
    the per-op lowering issues wgmma for the tiles that fit it (64-wide K panels). 32-wide K
    tiles at an offset K base get the TMA-fed loop, two K tiles per ring stage in 128-byte
    rows; without warp specialization, wgmma on narrow 64-byte-swizzled panels filled by
    cp.async."""
    from tiled.compiler import compile_program

    k = gemm.matmul(256, 256, 256, 128, 128, 64, 3, "float16", threads=128)
    for target, kernel, options, instr in [
            ("cuda:sm_80", k, {}, "HMMA"),
            ("cuda:sm_90a", k, {"warp_specialize": False}, "HGMMA")]:
        c = compile_program(kernel, target, **options)
        assert c.manifest.block[0] == 128
        assert not [a for a in c.manifest.kernel_args if a.kind == "tensor_map"]
        text = sass(c.artifact, tmp_path)
        assert set(re.findall(r"\b(HG?MMA)\.", text)) == {instr}
        assert "UTMALDG" not in text
    c = compile_program(_split_k_gemm(3, 32), "cuda:sm_90a")
    # a producer warp beside the warpgroup, and (the ring takes the SM) a second warpgroup
    # taking every other program block
    assert c.manifest.block[0] == 2 * 128 + 32
    assert [a.swizzle for a in c.manifest.kernel_args if a.kind == "tensor_map"] == [128, 128]
    text = sass(c.artifact, tmp_path)
    assert set(re.findall(r"\b(HG?MMA)\.", text)) == {"HGMMA"} and "UTMALDG" in text
    assert not re.search(r"\b(LDL|STL)\b", text)
    c = compile_program(_split_k_gemm(3, 32), "cuda:sm_90a", warp_specialize=False)
    assert c.manifest.block[0] == 128
    assert not [a for a in c.manifest.kernel_args if a.kind == "tensor_map"]
    text = sass(c.artifact, tmp_path)
    assert set(re.findall(r"\b(HG?MMA)\.", text)) == {"HGMMA"} and "UTMALDG" not in text
    assert not re.search(r"\b(LDL|STL)\b", text)


def test_variants_take_the_path_too():
    """B given as N x K, a float32 output (generic epilogue) and a fused bias + ReLU epilogue:
    the kernels the H200 benchmark checks numerically (benchmarks/gpu/hopper_gemm.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    import hopper_gemm

    for name, kernel in hopper_gemm.variant_kernels().items():
        c = tiled.compile(kernel, target="cuda:sm_90a", cache=False)
        assert c.manifest.block[0] == 384, name
        assert sum(a.kind == "tensor_map" for a in c.manifest.kernel_args) == 2, name


def _split_k_gemm(k_tiles: int, k_base: int):
    """A 32-wide K-tile GEMM whose loop covers `k_tiles` tiles from K offset `k_base`."""
    @tiled.kernel
    def partial(A: T.Tensor((256, 4096), "float16"), B: T.Tensor((4096, 256), "float16"),
                C: T.Tensor((256, 256), "float16")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), "float16")
            B_s = T.alloc_shared((32, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(k_tiles, num_stages=3):
                T.copy(A[by * 128, k_base + k * 32], A_s)
                T.copy(B[k_base + k * 32, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * 128, bx * 128])

    return partial


def test_every_gemm_loop_takes_the_per_op_path():
    """The whole-kernel GEMM path is gone (paths.py says why): 16-bit GEMMs (the seed's
    32-wide K tiles two per ring stage), float8 ones and 16-row x tiles (wgmma n16) all take
    wgmma per op, fed by the TMA ring; its `cluster` option went with it."""
    from tests.conformance.cases import load_all
    from tiled.compiler.targets.cuda.backend import CudaBackend
    from tiled.ir.program import as_program

    def lower(kernel, **options):
        return CudaBackend().generate_source(as_program(kernel), "sm_90a", **options)[2]

    seed = gemm.matmul(1024, 1024, 1024, 128, 128, 32, 3, "float16", threads=128)
    low = lower(seed)
    assert low.wgmma_ops.accumulators and low.wsloop.merge == 2
    with pytest.raises(ValueError, match="cluster"):
        tiled.compile(seed, target="cuda:sm_90a", cache=False, cluster=2)
    fp8 = load_all()["gemm_fp8_e4m3"]
    low = lower(fp8.factory(**fp8.gpu).kernel)
    assert low.wsloop is not None and low.wgmma_ops.accumulators

    @tiled.kernel
    def sixteen_rows(X: T.Tensor((16, 4096), "bfloat16"), W: T.Tensor((4096, 4096), "bfloat16"),
                     Y: T.Tensor((4096, 16), "float32")):
        with T.Kernel(32, threads=128) as bx:  # y^T = W x^T: W's rows as M, x's as N
            w_s = T.alloc_shared((128, 64), "bfloat16")
            x_s = T.alloc_shared((16, 64), "bfloat16")
            acc = T.alloc_fragment((128, 16), "float32")
            T.clear(acc)
            for k in T.Pipelined(64, num_stages=3):
                T.copy(W[bx * 128, k * 64], w_s)
                T.copy(X[0, k * 64], x_s)
                T.gemm(w_s, x_s, acc, transpose_B=True)
            T.copy(acc, Y[bx * 128, 0])

    low = lower(sixteen_rows)
    assert low.wsloop is not None and low.wgmma_ops.accumulators  # wgmma n16, per op
