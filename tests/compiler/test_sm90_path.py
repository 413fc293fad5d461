"""The automatic sm_90a path (cuda_sm90.py): which GEMMs take it, and that their cubins really
use wgmma, TMA and mbarriers (SASS read with cuobjdump; no GPU needed)."""

import subprocess
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T
from tests.compiler.test_cuda_header import _find_tool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gemm


def sass(artifact: bytes, tmp_path: Path) -> str:
    tool = _find_tool("cuobjdump")
    assert tool, "cuobjdump is missing: the dev extra installs nvidia-cuda-cuobjdump"
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(artifact)
    return subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout


@pytest.mark.parametrize("dtype,bm,bn,threads", [("float16", 128, 256, 256),
                                                 ("bfloat16", 128, 128, 128)])
def test_example_gemm_is_warp_specialized_on_sm90a(tmp_path, dtype, bm, bn, threads):
    k = gemm.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), bm, bn, 64, 4, dtype, threads=threads)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    m = c.manifest
    assert m.block[0] == threads + 128  # the producer warpgroup
    maps = [a for a in m.kernel_args if a.kind == "tensor_map"]
    assert [a.param for a in maps] == [0, 1]
    assert m.grid[0][0] == "min" and m.grid[0][2] == "tiled_sm_count"  # persistent blocks
    assert list(m.grid[1:]) == [1, 1]
    text = sass(c.artifact, tmp_path)
    for instr in ("HGMMA.64x", "UTMALDG", "SYNCS", "USETMAXREG", "STG.E.128"):
        assert instr in text, instr
    assert "LDL" not in text and "STL" not in text  # the accumulator stays in registers
    assert "HMMA" not in text  # not the sm_80 instruction path


def test_sm80_and_non_matching_kernels_keep_the_sm80_path(tmp_path):
    k = gemm.matmul(256, 256, 256, 128, 128, 64, 3, "float16", threads=128)
    for target, kernel, options in [
            ("cuda:sm_80", k, {}),
            ("cuda:sm_90a", _split_k_gemm(3, 0), {}),  # 32-wide K tiles that cannot pair
            ("cuda:sm_90a", k, {"warp_specialize": False})]:
        from tiled.compiler import compile_program

        c = compile_program(kernel, target, **options)
        assert c.manifest.block[0] == 128
        assert not [a for a in c.manifest.kernel_args if a.kind == "tensor_map"]
        text = sass(c.artifact, tmp_path)
        assert "HMMA" in text and "HGMMA" not in text and "UTMALDG" not in text


def test_variants_take_the_path_too():
    """B given as N x K, a float32 output (generic epilogue) and a fused bias + ReLU epilogue:
    the kernels the H200 benchmark checks numerically (benchmarks/gpu/hopper_gemm.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    import hopper_gemm

    for name, kernel in hopper_gemm.variant_kernels().items():
        c = tiled.compile(kernel, target="cuda:sm_90a", cache=False)
        assert c.manifest.block[0] == 384, name
        assert sum(a.kind == "tensor_map" for a in c.manifest.kernel_args) == 2, name


def _plan(kernel):
    from tiled.compiler.backends.cuda_layout import infer_layouts
    from tiled.compiler.backends.cuda_sm90 import find_ws_gemm

    p = kernel.ir.proto
    return find_ws_gemm(p, infer_layouts(p))


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


def test_32_wide_k_tiles_merge_only_when_provably_exact():
    # The example's default tiles (128x128x32): two iterations per 64-wide stage.
    assert _plan(gemm.matmul(T.dyn("M"), 1024, T.dyn("K"))).merge == 2
    assert _plan(gemm.matmul(256, 256, 97 * 32)).merge == 2  # odd count that covers K
    assert _plan(gemm.matmul(4096, 4096, 4096, 128, 256, 64, 4, threads=256)).merge == 1
    assert _plan(_split_k_gemm(64, 0)).merge == 2  # even count: always exact
    # An odd count short of K would pull in a real tile; an offset base breaks the pairing.
    assert _plan(_split_k_gemm(3, 0)) is None
    assert _plan(_split_k_gemm(64, 32)) is None
