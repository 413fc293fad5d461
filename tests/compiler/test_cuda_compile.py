"""CUDA compiles without a GPU: every example kernel becomes a cubin for sm_80 and sm_90a whose
ELF header names the architecture and whose symbol table holds the manifest's kernel symbol."""

import shutil
import struct
import sys
from pathlib import Path

import pytest

import tiled
import tiled.lang as T

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise
import gemm as gemm_example
import softmax as softmax_example

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

EM_CUDA = 190


def elf_info(data: bytes):
    """(e_machine, SM number from e_flags, names in .symtab) of a 64-bit little-endian ELF."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    e_machine, = struct.unpack_from("<H", data, 18)
    e_flags, = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names = set()
    for sh in sections:
        if sh[1] == 2:  # SHT_SYMTAB
            strtab = sections[sh[6]]
            for off in range(sh[4], sh[4] + sh[5], sh[9]):
                name_off, = struct.unpack_from("<I", data, off)
                start = strtab[4] + name_off
                names.add(data[start:data.index(b"\0", start)].decode())
    sm = (e_flags >> 8) & 0xFF
    return e_machine, sm, names


KERNELS = {
    "gemm_fp16": lambda: gemm_example.matmul(T.dyn("M"), 1024, 1024),
    "gemm_bf16": lambda: gemm_example.matmul(1000, 1000, 1000, dtype="bfloat16",
                                             out_dtype="float32"),
    "gemm_fp32": lambda: gemm_example.matmul(1000, 1000, 1000, block_M=64, block_N=64,
                                             dtype="float32"),
    "softmax": lambda: softmax_example.softmax(256),
    "elementwise": elementwise.add,
}


@pytest.mark.parametrize("arch,sm", [("sm_80", 0x50), ("sm_90a", 0x5A)])
@pytest.mark.parametrize("name", list(KERNELS))
def test_cubin_arch_and_symbol(name, arch, sm):
    k = tiled.compile(KERNELS[name](), target=f"cuda:{arch}")
    machine, sm_num, symbols = elf_info(k.artifact)
    assert machine == EM_CUDA
    assert sm_num == sm
    assert k.manifest.symbol in symbols
    assert k.manifest.arch == arch and k.manifest.artifact_format == "cubin"
    # Every tensor parameter reaches the kernel: as a pointer, or (the sm_90a GEMM path, whose
    # A and B only TMA reads) as a TMA descriptor.
    used = {a.param for a in k.manifest.kernel_args if a.kind in ("tensor", "tensor_map")}
    assert used == {i for i, p in enumerate(k.manifest.params) if p.kind == "tensor"}


def test_gemm_uses_tensor_cores_and_async_copies():
    k = tiled.compile(KERNELS["gemm_fp16"](), target="cuda:sm_80")
    assert "tiled::gemm_ss<half, 128, 128, 32" in k.source
    assert "tiled::cp_async<16>" in k.source and "cp_async_wait<2>" in k.source
    # 3 stages of a padded 128x32 A tile and a padded 32x128 B tile.
    assert k.manifest.dynamic_smem_bytes == 3 * (128 * 40 + 32 * 136) * 2


def test_shared_memory_over_the_limit_is_a_clear_error():
    big = gemm_example.matmul(4096, 4096, 4096, block_M=256, block_N=256, block_K=64,
                              num_stages=4, threads=256)
    with pytest.raises(tiled.CompileError, match="KiB of shared memory"):
        tiled.compile(big, target="cuda:sm_80")


def test_nvrtc_and_nvcc_both_produce_cubins():
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC comes with the dev extra")
    k = KERNELS["softmax"]()
    for compiler in ("nvcc", "nvrtc"):
        c = tiled.compile(k, target="cuda:sm_90a", cuda_compiler=compiler)
        machine, sm, symbols = elf_info(c.artifact)
        assert (machine, sm) == (EM_CUDA, 0x5A) and c.manifest.symbol in symbols, compiler


def _barriers_under_branches(source: str) -> list[int]:
    """Line numbers of __syncthreads() that sit inside an `if` block of the kernel body."""
    body = source[source.index('extern "C" __global__'):]
    stack, bad = [], []
    for n, line in enumerate(body.splitlines()):
        text = line.strip()
        if text.startswith("}"):
            stack.pop()
        if "__syncthreads()" in text and "if" in stack:
            bad.append(n)
        if text.endswith("{"):
            stack.append("if" if text.lstrip("} ").startswith(("if", "else")) else "block")
    return bad


@pytest.mark.parametrize("name", ["op_copies", "op_stats", "op_unary_fp16",
                                  "op_gemm_fp16_ta1_tb0"])
def test_no_barrier_inside_per_thread_branches(name):
    """A __syncthreads() under a per-thread condition deadlocks the block (seen on the H200
    before the barrier tracker was suspended inside T.Parallel)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
    import op_kernels

    k = tiled.compile(op_kernels.kernels()[name], target="cuda:sm_90a")
    assert _barriers_under_branches(k.source) == []
