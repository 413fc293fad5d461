"""The explicit sm_90a path (cuda_explicit.py): the hand-scheduled GEMM example compiles to a
cubin that really uses mbarriers, TMA and setmaxnreg (SASS read with cuobjdump; no GPU
needed); cpu and sm_80 refuse its statements, naming them and where they are."""

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
def test_example_compiles_to_mbarriers_and_tma(tmp_path, dtype):
    k = gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), dtype=dtype)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    m = c.manifest
    assert m.block[0] == 256 and list(m.cluster) == [1, 1, 1]
    maps = [a for a in m.kernel_args if a.kind == "tensor_map"]
    assert [(a.param, a.box, a.swizzle) for a in maps] == [(0, (64, 128), 0), (1, (128, 64), 0)]
    # 4 stages of dense (unpadded) 128x64 + 64x128 tiles, then 8 barriers.
    assert m.dynamic_smem_bytes == 4 * (128 * 64 + 64 * 128) * 2 + 8 * 8
    text = sass(c.artifact, tmp_path)
    for instr in ("SYNCS", "UTMALDG.2D", "USETMAXREG", "HMMA"):
        assert instr in text, instr
    assert "tiled::sm90::setmaxnreg_dec<40>" in c.source
    assert "tiled::sm90::bar_init" in c.source and "fence_barrier_init" in c.source


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
            A_s = T.alloc_shared((64, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            bar = T.alloc_barrier(1, arrive_count=128)
            with T.ws(0):
                T.mbarrier_expect_tx(bar[0], 64 * 64 * 2)
                T.tma_copy(A[0, 0], A_s, bar[0])
                T.mbarrier_arrive(bar[0])
            with T.ws(1):
                T.mbarrier_wait_parity(bar[0], 0)
                T.clear(C_l)
                T.gemm(A_s, A_s, C_l)
                for i, j in T.Parallel(64, 64):
                    C_l[i, j] = C_l[i, j] * 2
                T.copy(C_l, C[0, 0])

    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert "tiled::gemm_ss<half, 64, 64, 64, 2, 2, false, false, 64, 64, 128>" in c.source
    assert "((int)threadIdx.x) == 0" in c.source  # warpgroup 0's first thread issues the TMA


def test_fragments_stay_inside_warpgroup_regions():
    @tiled.kernel
    def k(C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=256):
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)  # outside
            with T.ws(0):
                T.copy(C_l, C[0, 0])

    with pytest.raises(CompileError, match=r"fragment frag1 is used outside T\.ws") as info:
        tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert info.value.loc.endswith(f":{k.ir.proto.kernel.body.seq.stmts[0].loc.line}")


def test_the_runtime_packs_the_unswizzled_tensor_maps():
    """The compiled manifest, packed by the thin runtime with a recording encoder (no GPU):
    one SWIZZLE_NONE descriptor per operand, boxes (inner, outer) as the copies' tiles."""
    from tests.runtime.test_cuda_pack import cai
    from tests.runtime.test_cuda_tensor_map import RecordingEncoder
    from tiled.runtime import bind_args
    from tiled.runtime.cuda import TensorMapRequest, pack_kernel_params

    m = tiled.compile(gemm_ws_explicit.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K")),
                      target="cuda:sm_90a", cache=False).manifest
    a, b, c = 0x7F0000000000, 0x7F0000100000, 0x7F0000200000
    args = bind_args(m.params, [cai((300, 256), "<f2", a), cai((256, 264), "<f2", b),
                                cai((300, 264), "<f2", c)], "cuda")
    enc = RecordingEncoder()
    pack_kernel_params(m, args, encode_tensor_map=enc)
    assert enc.requests == [TensorMapRequest("float16", a, (256, 300), (512,), (64, 128), 0),
                            TensorMapRequest("float16", b, (264, 256), (528,), (128, 64), 0)]
