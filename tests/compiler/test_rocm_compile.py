"""The rocm backend compiles examples/ kernels for rocm:gfx942 and rocm:gfx90a into HSACO code
object v5, and every artifact passes the structural checks: ELF machine EM_AMDGPU and the gfx
id, code object version 5, the AMDHSA metadata (kernarg layout, LDS bytes, register counts,
wavefront 64, workgroup limit) equal to the manifest's code_object, v_mfma in T.gemm
kernels, no scratch, and ld.lld --no-undefined refusing an unresolved call. Needs clang-22,
lld-22 and llvm-22 (scripts/test.sh installs them); nothing runs on an AMD GPU here."""

from __future__ import annotations

import re

import pytest

import tiled
import tiled.lang as T
from tests.emulated_examples import example
from tiled.compiler import compile_program
from tiled.compiler.targets.rocm.codeobject import EM_AMDGPU, read_code_object
from tiled.compiler.toolchain.hip import SOURCE_SECTION, compile_hsaco, disassemble
from tiled.errors import CompileError, ToolchainError, UnsupportedTarget

ARCHS = ("gfx942", "gfx90a")


def kernels():
    return {"elementwise": example("elementwise").add(),
            "softmax": example("softmax").softmax(),
            "gemm_f16": example("gemm").matmul(256, 256, 256),
            "gemm_bf16": example("gemm").matmul(T.dyn("M"), 256, 128, dtype="bfloat16")}


@pytest.fixture(scope="module")
def compiled():
    return {(name, arch): compile_program(k, f"rocm:{arch}")
            for name, k in kernels().items() for arch in ARCHS}


def test_targets_parse():
    for arch in ARCHS:
        assert str(tiled.compiler.parse_target(f"rocm:{arch}")) == f"rocm:{arch}"
    with pytest.raises(UnsupportedTarget, match="gfx942, gfx90a"):
        tiled.compiler.parse_target("rocm:gfx1100")
    with pytest.raises(CompileError, match="rocm:gfx942"):
        tiled.compiler.parse_target("rocm")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["elementwise", "softmax", "gemm_f16", "gemm_bf16"])
def test_code_object_matches_manifest(compiled, name, arch):
    ck = compiled[(name, arch)]
    m = ck.manifest
    assert (m.target, m.artifact_format, m.arch) == (f"rocm:{arch}", "hsaco", arch)
    data = ck.artifact
    assert int.from_bytes(data[18:20], "little") == EM_AMDGPU
    co = read_code_object(data)
    assert (co.machine, co.arch, co.code_object_version) == (EM_AMDGPU, arch, 5)
    assert co.target == f"amdgcn-amd-amdhsa--{arch}" and co.xnack == co.sramecc == "any"
    k = co.kernel(m.symbol)
    rec = m.code_object
    assert k[".wavefront_size"] == rec["wavefront_size"] == 64
    assert k[".group_segment_fixed_size"] == rec["lds_bytes"]
    assert k[".kernarg_segment_size"] == rec["kernarg_size"]
    assert k[".max_flat_workgroup_size"] == rec["max_workgroup_size"] >= m.block[0]
    for key in ("vgpr_count", "sgpr_count", "agpr_count"):
        assert k[f".{key}"] == rec[key]
    explicit = [a for a in k[".args"] if not a[".value_kind"].startswith("hidden_")]
    assert [{"offset": a[".offset"], "size": a[".size"]} for a in explicit] == rec["kernarg"]
    assert len(rec["kernarg"]) == len(m.kernel_args)
    # No scratch: no private segment, no spills.
    assert rec["private_segment_bytes"] == rec["vgpr_spill_count"] == 0
    assert rec["sgpr_spill_count"] == 0
    # The kernel's HIP source travels in the code object (the emulation rebuilds from it).
    assert co.section_text(SOURCE_SECTION) == ck.source


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_issues_mfma_from_lds(compiled, arch):
    asm = disassemble(compiled[("gemm_f16", arch)].artifact, arch)
    mfma = re.findall(r"\bv_mfma_f32_16x16x16_?f16\b", asm)
    assert mfma, "no MFMA in the T.gemm kernel"
    assert re.search(r"\bds_read", asm) and re.search(r"\bds_write", asm)
    assert re.search(r"\bs_barrier\b", asm)
    assert not re.search(r"\bscratch_|\bbuffer_store", asm), "the kernel spills to scratch"
    asm16 = disassemble(compiled[("gemm_bf16", arch)].artifact, arch)
    assert re.search(r"\bv_mfma_f32_16x16x16_?bf16", asm16)


def test_lds_pool_is_the_code_objects_group_segment(compiled):
    m = compiled[("gemm_f16", "gfx942")].manifest
    # 3 stages of a 128x32 A tile and a 32x128 B tile, rows padded by 8 halves.
    assert m.code_object["lds_bytes"] == 3 * (128 * 40 + 32 * 136) * 2
    assert m.dynamic_smem_bytes == 0


def test_link_refuses_undefined_symbols():
    src = ('#include "tiled_hip.h"\nextern "C" __device__ float tanf(float);\n'
           'extern "C" __global__ void k(float* x) { x[0] = tanf(x[0]); }\n')
    with pytest.raises(ToolchainError, match=r"undefined (hidden )?symbol: tanf"):
        compile_hsaco(src, "gfx942")


def test_explicit_hopper_path_is_refused_with_its_location():
    ws = example("gemm_ws_explicit").matmul(256, 256, 256)
    with pytest.raises(CompileError, match=r"explicit Hopper path.*rocm:gfx942") as e:
        compile_program(ws, "rocm:gfx942")
    assert "gemm_ws_explicit.py" in str(e.value)


def test_loops_that_never_run_and_located_whole_kernel_errors():
    """Two of the compiler's fuzz findings (tests/compiler/test_fuzz_findings.py) on rocm: loops
    whose extents fold to 0 compile; too much LDS is an error located at the kernel."""

    @tiled.kernel
    def empty_loops(A: T.Tensor((256, 64), "float16"), B: T.Tensor((64, 256), "float16"),
                    C: T.Tensor((256, 256), "float16")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(32 // 100, num_stages=1):  # (3 stages: 105 KiB of LDS)
                T.copy(A[by * 128, k * 64], A_s)
                T.copy(B[k * 64, bx * 128], B_s)
                T.gemm(A_s, B_s, acc)
            for i in T.Parallel(512 % 1):
                C[i, 0] = 1.0
            T.copy(acc, C[by * 128, bx * 128])

    assert compile_program(empty_loops, "rocm:gfx90a").manifest.name == "empty_loops"

    @tiled.kernel
    def big(A: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((160, 128), "float32")  # 80 KiB: fits CUDA GPUs, not AMD's LDS
            T.copy(A[0, 0], s[0:128, 0:128])
            T.copy(s[0:128, 0:128], A[0, 0])

    with pytest.raises(CompileError, match=r"test_rocm_compile.py:\d+: kernel needs 80 KiB of "
                                           r"LDS .* gfx942 has 64 KiB"):
        compile_program(big, "rocm:gfx942")
