"""What the per-op sm_90a lowering issues, read from the SASS of kernels written in several
styles (the conformance suite's TileLang-style kernels, not only the repo's examples): wgmma
for every gemm that fits it (HGMMA; the RS form, a register A operand, for FlashAttention's
P), nothing on the sm_80 instructions, no local memory; memory-bound kernels with vector
accesses and warp shuffles. Compiled here, no GPU needed (numerics and speed: the H200 runs
of benchmarks/gpu/conformance.py and membound.py)."""

import re

import pytest

from tests.compiler.test_sm90_path import sass
from tests.conformance.cases import load_all

SS = re.compile(r"[HQ]GMMA\.64x\d+x(16|32|8)\.F32(\.[A-Z0-9]+)* R\d+, gdesc")
RS = re.compile(r"HGMMA\.64x\d+x16\.F32(\.BF16)? R\d+, R\d+, gdesc")


def _sass(tmp_path, name: str, **shape) -> str:
    import tiled

    case = load_all()[name]
    k = case.factory(**{**case.cpu, **shape}).kernel
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    return sass(c.artifact, tmp_path)


def _no_local(text: str) -> None:
    assert not re.search(r"\b(LDL|STL)\b", text), "local memory"


def _tma_fed(text: str) -> None:
    """A TMA producer (UTMALDG) and mbarrier waits (SYNCS) feed the loop (ws_loop.py)."""
    assert "UTMALDG" in text and re.search(r"\bSYNCS\.", text), "no TMA producer"


@pytest.mark.parametrize("name,shape", [
    ("gemm_nt", {"M": 256, "N": 256, "K": 256, "block_M": 128, "block_N": 256,
                 "block_K": 64, "threads": 256}),  # B as N x K, two consumer warpgroups
    ("gemm_splitk", {"M": 256, "N": 256, "K": 1024, "block_M": 128, "block_N": 128,
                     "block_K": 64}),  # an atomic-add epilogue
    ("gemm_streamk", {"M": 256, "N": 256, "K": 512, "units": 8, "block_M": 128,
                      "block_N": 128, "block_K": 64}),  # stream-K tiles of a loop
    ("dequant_gemm_int4", {}),  # B dequantized by T.Parallel into the panel tile
])
def test_gemms_in_other_styles_take_wgmma(tmp_path, name, shape):
    text = _sass(tmp_path, name, **shape)
    assert SS.search(text) and "HMMA" not in text
    if name in ("gemm_nt", "gemm_splitk"):  # stream-K: the loop sits in its tile loop;
        _tma_fed(text)  # int4: the loop dequantizes from global memory itself
    _no_local(text)


@pytest.mark.parametrize("name,instr", [("gemm_fp8_e4m3", "QGMMA.64x64x32.F32.E4M3.E4M3"),
                                        ("gemm_nt_tf32", "HGMMA.64x64x8.F32.TF32")])
def test_float8_and_tf32_gemms_take_their_wgmma(tmp_path, name, instr):
    text = _sass(tmp_path, name)
    assert instr in text and SS.search(text) and "HMMA" not in text
    _tma_fed(text)
    _no_local(text)


@pytest.mark.parametrize("name", ["mha_fwd_bshd", "mha_fwd_bshd_causal", "gqa_fwd_bshd",
                                  "mha_fwd_bhsd_wgmma_pipelined"])
def test_attention_takes_wgmma_ss_and_rs(tmp_path, name):
    text = _sass(tmp_path, name)
    assert SS.search(text) and RS.search(text) and "HMMA" not in text
    _tma_fed(text)
    _no_local(text)


@pytest.mark.parametrize("name", ["mha_fwd_bshd", "mha_fwd_bshd_causal", "gemm_nt"])
def test_big_tiles_fed_by_a_producer_warpgroup(tmp_path, name):
    """The H200 shapes (128-row tiles, two consumer warpgroups and a producer warpgroup):
    the registers the consumers get by setmaxnreg hold them without local memory."""
    case = load_all()[name]
    text = _sass(tmp_path, name, **case.gpu)
    assert SS.search(text) and "USETMAXREG" in text
    _tma_fed(text)
    _no_local(text)


def test_accumulator_epilogues_store_vectors(tmp_path):
    """T.copy(acc, C[...]) from a wgmma accumulator to global memory writes vectors, not one
    element per slot: 16 bytes a lane for a 16-bit C (a quad transposes its words;
    tiled.ops' y = x W^T on the per-op path), 8 for a float32 C (gemm_nt's)."""
    import tiled
    from tiled.ops.gemm import linear_kernel

    case = load_all()["gemm_nt"]
    text = sass(tiled.compile(case.factory(**case.gpu).kernel, target="cuda:sm_90a",
                              cache=False).artifact, tmp_path)
    assert re.search(r"\bSTG\.E\.64\b", text)
    _no_local(text)
    k = linear_kernel(4096, 4096, 4096, "bfloat16", "bfloat16", kind="tile", BM=128, BN=256,
                      threads=256)
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False,
                              whole_kernel_paths=False).artifact, tmp_path)
    assert re.search(r"\bSTG\.E\.128\b", text)
    _tma_fed(text)
    _no_local(text)


@pytest.mark.parametrize("name,shape", [
    ("rms_norm", {"M": 64, "N": 4096, "blk_m": 1}),
    ("softmax", {"M": 64, "N": 4096, "blk_m": 1}),
])
def test_row_kernels_vectorize_and_shuffle(tmp_path, name, shape):
    text = _sass(tmp_path, name, **shape)
    assert re.search(r"\b(LDG|LDS)\.E?\.?(64|128)\b|\bLDS\.(64|128)\b", text)
    assert re.search(r"\bSTG\.E\.(64|128)\b", text)
    assert "SHFL.BFLY" in text
    _no_local(text)


@pytest.mark.parametrize("act", ["gelu", "silu", "gelu_tanh"])
def test_gated_activations_move_vectors(tmp_path, act):
    """Exact GELU calls T.erf, which TVM did not mark vectorizable: its whole nest ran one
    2-byte element at a time (LDG.E.U16) where SiLU's moved 8 bytes (tiled.compiler.tir)."""
    import tiled
    import tiled.ops as ops
    from tests.compiler.test_sm90_path import sass

    k = ops.kernel_factory("gated_activation", "cuda:sm_90a", N=4096, dtype="bfloat16",
                           act=act)
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert re.search(r"\bLDG\.E\.(64|128)", text) and re.search(r"\bSTG\.E\.(64|128)", text)
    assert not re.search(r"\b(LDG|STG)\.E\.U16", text)
    _no_local(text)


@pytest.mark.parametrize("op,n", [("rms_norm", 4096), ("layer_norm", 4096),
                                  ("layer_norm", 8192), ("softmax", 4096)])
def test_ops_row_kernels_at_their_launch(tmp_path, op, n):
    """tiled.ops' row kernels as the op launches them on CUDA (its launch config: 256 / 512
    threads a row at these widths) move vectors, reduce by shuffles, use no local memory."""
    import tiled
    import tiled.ops as ops
    from tests.compiler.test_sm90_path import sass

    dtype = "float32" if op == "softmax" else "bfloat16"
    params = {"N": n, "dtype": dtype}
    if op != "softmax":
        params["eps"] = 1e-6
    if op == "layer_norm":
        params["affine"] = True
    k = ops.kernel_factory(op, "cuda:sm_90a", **params)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False)
    assert c.manifest.block[0] >= 256
    text = sass(c.artifact, tmp_path)
    assert re.search(r"\bLDG\.E\.(64|128)", text) and re.search(r"\bSTG\.E\.(64|128)", text)
    assert "SHFL.BFLY" in text
    _no_local(text)


def test_int8_gemm_takes_integer_wgmma(tmp_path):
    """int8 x int8 -> int32 (B given N x K, as wgmma reads int8): IGMMA from TMA-fed panel
    tiles. Compiled and read here; not yet run on the H200 (no conformance case)."""
    import tiled
    import tiled.lang as T

    M = N = K = 512

    @tiled.kernel
    def gemm_i8(A: T.Tensor((M, K), "int8"), B: T.Tensor((N, K), "int8"),
                C: T.Tensor((M, N), "int32")):
        with T.Kernel(N // 128, M // 128, threads=256) as (bx, by):
            A_s = T.alloc_shared((128, 128), "int8")
            B_s = T.alloc_shared((128, 128), "int8")
            C_l = T.alloc_fragment((128, 128), "int32")
            T.clear(C_l)
            for k in T.Pipelined(K // 128, num_stages=3):
                T.copy(A[by * 128, k * 128], A_s)
                T.copy(B[bx * 128, k * 128], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            T.copy(C_l, C[by * 128, bx * 128])

    c = tiled.compile(gemm_i8, target="cuda:sm_90a", cache=False)
    text = sass(c.artifact, tmp_path)
    assert "IGMMA.64x128x32.S8.S8" in text and "HMMA" not in text and "IMMA" not in text
    _tma_fed(text)
    _no_local(text)


def _ptxas_remarks(source: str, tmp_path) -> list[str]:
    """ptxas's performance remarks on `source` (it prints them on success, as `ptxas info`
    lines naming a C75xx code, e.g. C7515: wgmma serialized because ordinary instructions
    define an accumulator register while a wgmma is in flight)."""
    import subprocess

    from tiled import config
    from tiled.compiler.toolchain.nvcc import INCLUDE_DIR

    src = tmp_path / "k.cu"
    src.write_text(source)
    proc = subprocess.run([config.get("nvcc"), "-cubin", "-O3", "-std=c++17", "-w",
                           "-gencode=arch=compute_90a,code=sm_90a", "-I", str(INCLUDE_DIR),
                           "-o", str(tmp_path / "k.cubin"), str(src)],
                          capture_output=True, text=True, check=True)
    return [line for line in (proc.stdout + proc.stderr).splitlines()
            if re.search(r"\(C75\d\d\)", line)]


PER_OP = {"whole_kernel_paths": False}


@pytest.mark.parametrize("name,gpu,options", [
    ("mha_fwd_bshd", True, {}), ("mha_fwd_bshd_causal", True, {}), ("gqa_fwd_bshd", False, {}),
    ("mha_fwd_bhsd_wgmma_pipelined", False, {}), ("gemm_nt", True, {}),
    # the per-op path on what the whole-kernel GEMM path takes by default: merged 32-wide K
    # tiles (ws_pairs.py), TileLang's register-A GEMM (A staged through shared memory, its
    # C_local -> C_cast -> C epilogue folded: passes/staging.py, passes/fold.py), float8
    ("gemm", False, PER_OP), ("gemm_rs", True, PER_OP), ("gemm_fp8_e4m3", True, PER_OP)])
def test_no_wgmma_is_serialized(tmp_path, name, gpu, options):
    """The wgmma schedules the lowering picks (the software-pipelined attention loop of
    ws_rotate.py, the GEMM loops of wgmma_waits.py and ws_pairs.py) never make ptxas
    serialize the wgmmas."""
    import tiled

    case = load_all()[name]
    k = case.factory(**{**case.cpu, **(case.gpu if gpu else {})}).kernel
    c = tiled.compile(k, target="cuda:sm_90a", cache=False, **options)
    assert "wgmma_rows" in c.source
    assert _ptxas_remarks(c.source, tmp_path) == []


def test_the_serialization_check_sees_a_serialized_wgmma(tmp_path):
    """The check above is not blind: an accumulator register written between a wgmma's
    issue and its wait is reported (C7515)."""
    import tiled

    case = load_all()["mha_fwd_bshd"]
    c = tiled.compile(case.factory(**case.gpu).kernel, target="cuda:sm_90a", cache=False)
    src = c.source
    at = src.index(";", src.index("wgmma_rows_rs_issue<", src.index("for (int v_1"))) + 1
    bad = src[:at] + "\n o_ptr[3] = 1.0f;\n" + src[at:]
    assert any("C7515" in line for line in _ptxas_remarks(bad, tmp_path))


@pytest.mark.parametrize("cfg", [dict(BM=128, BN=128, threads=256, stages=4),
                                 dict(BM=128, BN=256, threads=256, stages=3)])
@pytest.mark.parametrize("pingpong", [False, True])
def test_block_scaled_fp8_steps(tmp_path, cfg, pingpong):
    """tiled.ops.fp8's block-scaled GEMM builds a fresh product every K step (clear_accum)
    and rescales it into the running sum: the step's first float8 wgmma takes a zero scale-d
    (no register stores clear the product), no wgmma is serialized, and the two consumer
    warpgroups take turns issuing theirs (so that one's rescale meets the other's MMA),
    whatever the `pingpong` option (which asks turns of loops of two gemms). At 128 x 256
    the product and the sum are 256 floats a thread: that config spills as written (before
    these changes too)."""
    import tiled
    from tiled.ops import fp8

    k = fp8.scaled_gemm_kernel(128, 7168, 2048, "bfloat16", True, **cfg)
    c = tiled.compile(k, target="cuda:sm_90a", cache=False, pingpong=pingpong)
    assert not re.search(r"part_ptr\[\d+\] = 0x0p", c.source)
    assert "turn_first" in c.source
    text = sass(c.artifact, tmp_path)
    first = re.findall(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 (R\d+), gdesc\[UR\d+\], (\S+)", text)
    assert first and any(src.startswith("RZ") for _, src in first), first
    if cfg["BN"] == 128:
        _no_local(text)
    assert _ptxas_remarks(c.source, tmp_path) == []


@pytest.mark.parametrize("name", ["conv2d_nhwc", "conv2d_im2col"])
def test_convolutions_gathered_by_a_producer_warpgroup(tmp_path, name):
    """TileLang's convolution in both of its styles at the conformance GPU shape: the im2col
    tile's gather runs ahead on the producer warpgroup (cp.async vectors, LDGSTS, that
    arrive on the stage's mbarrier), the filter tile by TMA, the consumers only wait and
    issue wgmma; no local memory (the producer keeps 96 registers: ws_plan.py)."""
    case = load_all()[name]
    text = _sass(tmp_path, name, **case.gpu)
    assert SS.search(text) and "HMMA" not in text
    _tma_fed(text)
    assert "LDGSTS.E.BYPASS.128" in text and "ARRIVES.LDGSTSBAR" in text
    _no_local(text)


@pytest.mark.parametrize("bn,widths", [(160, ("64x160x16",)),
                                        (80, ("64x64x16", "64x16x16")),
                                        (112, ("64x96x16", "64x16x16")),
                                        (224, ("64x224x16",))])
def test_filter_tiles_past_their_64s_take_narrow_wgmmas(tmp_path, bn, widths):
    """A K-major 16-bit B tile whose rows end 16 / 32 / 48 / 96 past a multiple of 64 (a
    convolution's 160-wide filter tile, sized so that its layer fills the SMs) takes wgmma:
    one instruction where a width of 96 / 160 / 192 / 224 covers it, then n32 and / or n16
    (tiled_sm90_explicit.h cols_width), and nothing else."""
    import tiled
    from tiled.ops import conv

    k = conv.conv2d_kernel(640, 16, 16, 640, 3, 3, 1, 1, 1, "bfloat16", False, BM=128,
                           BN=bn, BC=64, threads=256, stages=4)
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert set(re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32\.BF16", text)) == set(widths)
    assert "HMMA" not in text
    _no_local(text)


# A descriptor built from an address: its start field masked to 18 bits (LOP3 / ULOP3 with
# 0x3ff..). A call of wgmma_rows_issue builds one for A's tile and one for B's and takes each
# wgmma's as a constant past them (desc_at, one add); built from every wgmma's own address,
# there were two for each wgmma (A's and B's).
_BUILT = re.compile(r"\bU?LOP3\.LUT \w+, \w+, 0x3ff[0-9a-f]*,")


@pytest.mark.parametrize("name", ["gemm", "gemm_nt", "gemm_fp8_e4m3", "gemm_nt_tf32"])
def test_wgmma_descriptors_are_a_constant_past_their_tiles(tmp_path, name):
    text = _sass(tmp_path, name)
    gmma = len(SS.findall(text))
    assert gmma and len(_BUILT.findall(text)) <= gmma, (len(_BUILT.findall(text)), gmma)


@pytest.mark.parametrize("bn,width", [(224, "64x224x32"), (160, "64x160x32"), (96, "64x96x32")])
def test_float8_tiles_off_the_64s_take_one_wgmma_width(tmp_path, bn, width):
    """float8 wgmma has widths past 64 in steps of 32 too (tiled_sm90.h): a 224-column tile,
    which puts N = 7168 (DeepSeek-V3) in 32 tiles a row where 128 / 256 columns leave a
    partial last wave, issues one QGMMA a K slice, TMA-fed, not the sm_80 fallback."""
    import tiled
    from tiled.ops.fp8 import scaled_gemm_kernel

    k = scaled_gemm_kernel(512, 7168, 2048, "bfloat16", False, BM=128, BN=bn, threads=256,
                           stages=3)
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert set(re.findall(r"QGMMA\.(\d+x\d+x\d+)\.F32\.E4M3", text)) == {width}
    assert "HMMA" not in text
    _tma_fed(text)
    _no_local(text)
