"""Compile checks for the CUDA device header (tiled_cuda.h); no GPU needed.

* tests/gpu/header_selftest.cu builds as the executable the GPU engineer runs
  (sm_90a) and as an sm_80 cubin.
* A small translation unit instantiating every template of the header
  (all cp_async sizes and waits, gemm_ss for half/bf16 in all transpose
  combinations incl. an odd number of n8 tiles, gemm_ss_simt for several
  dtype pairs, shfl_xor / warp reductions for several types) builds with
  nvcc -cubin for sm_80 and sm_90a, without warnings and without any
  stack frame (register arrays must stay in registers); its PTX contains the
  intended instructions; its cubins carry the right SM in the ELF e_flags.
* When cuobjdump and nvdisasm are available, the SASS is checked for
  LDSM / HMMA / LDGSTS and for the absence of local memory traffic.
Everything skips when nvcc is not on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "tiled" / "compiler" / "targets" / "cuda" / "include"
SELFTEST = REPO / "tests" / "gpu" / "header_selftest.cu"
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

ARCH_FLAGS = {
    "sm_80": ["-arch=sm_80"],
    "sm_90a": ["-gencode", "arch=compute_90a,code=sm_90a"],
}
SM_NUMBER = {"sm_80": 0x50, "sm_90a": 0x5A}

INSTANTIATE_SRC = r"""
#include "tiled_cuda.h"

// ---- cp.async ----
extern "C" __global__ void k_cp_async(const uint8_t* g, int n, uint8_t* out) {
  __shared__ __align__(16) uint8_t s[3 * 16 * 128];
  const int t = threadIdx.x;
  const bool p = t < n;
  tiled::cp_async<4>(s + t * 4, g + t * 4, p);
  tiled::cp_async_commit();
  tiled::cp_async<8>(s + 512 + t * 8, g + t * 8, p);
  tiled::cp_async_commit();
  tiled::cp_async<16>(s + 2048 + t * 16, g + t * 16, p);
  tiled::cp_async_commit();
  tiled::cp_async_wait<2>();
  tiled::cp_async_wait<1>();
  tiled::cp_async_wait<0>();
  tiled::cp_async_wait_all();
  __syncthreads();
  out[t] = s[t * 3];
}

// ---- tensor-core gemm ----
template <typename T, int M, int N, int K, int WARP_M, int WARP_N, bool TA, bool TB, int LDA,
          int LDB>
__global__ void k_gemm(float* out) {
  extern __shared__ __align__(16) unsigned char sm[];
  const T* A = reinterpret_cast<const T*>(sm);
  const T* B = A + (TA ? K : M) * LDA;
  constexpr int NACC = tiled::acc_size<M, N, WARP_M, WARP_N>();
  float acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
  tiled::gemm_ss<T, M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB>(A, B, acc);
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    int r, c;
    tiled::acc_coord<M, N, WARP_M, WARP_N>(i, r, c);
    out[r * N + c] = acc[i];
  }
}

#define GEMM(T, M, N, K, WM, WN, TA, TB, LDA, LDB) \
  template __global__ void k_gemm<T, M, N, K, WM, WN, TA, TB, LDA, LDB>(float*);
#define GEMM4(T, M, N, K, WM, WN, P)                    \
  GEMM(T, M, N, K, WM, WN, false, false, K + P, N + P)  \
  GEMM(T, M, N, K, WM, WN, false, true, K + P, K + P)   \
  GEMM(T, M, N, K, WM, WN, true, false, M + P, N + P)   \
  GEMM(T, M, N, K, WM, WN, true, true, M + P, K + P)
GEMM4(half, 64, 64, 32, 2, 2, 8)
GEMM4(__nv_bfloat16, 64, 64, 32, 2, 2, 0)
GEMM4(half, 16, 8, 16, 1, 1, 0)
GEMM4(__nv_bfloat16, 32, 24, 32, 1, 1, 8)
GEMM(half, 128, 256, 32, 2, 4, false, false, 40, 264)

// ---- SIMT gemm ----
template <typename TA_, typename TB_, typename TC, int M, int N, int K, int THREADS, bool TA,
          bool TB, int LDA, int LDB>
__global__ void k_simt(TC* out) {
  extern __shared__ __align__(16) unsigned char sm[];
  const TA_* A = reinterpret_cast<const TA_*>(sm);
  const TB_* B = reinterpret_cast<const TB_*>(sm + 16384);
  constexpr int NACC = tiled::simt_acc_size<M, N, THREADS>();
  TC acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = TC(0);
  tiled::gemm_ss_simt<TA_, TB_, TC, M, N, K, THREADS, TA, TB, LDA, LDB>(A, B, acc);
#pragma unroll
  for (int i = 0; i < NACC; ++i) out[threadIdx.x + i * THREADS] = acc[i];
}
#define SIMT(TA_, TB_, TC, M, N, K, THREADS, TA, TB, LDA, LDB) \
  template __global__ void k_simt<TA_, TB_, TC, M, N, K, THREADS, TA, TB, LDA, LDB>(TC*);
SIMT(float, float, float, 64, 64, 32, 128, false, false, 32, 64)
SIMT(float, float, float, 33, 17, 9, 64, true, true, 34, 10)
SIMT(int8_t, int8_t, int32_t, 64, 64, 32, 128, false, true, 33, 33)
SIMT(int8_t, int8_t, int32_t, 33, 17, 9, 64, true, false, 36, 20)
SIMT(half, half, float, 33, 17, 9, 64, false, false, 9, 17)
SIMT(half, half, half, 16, 16, 16, 32, true, true, 16, 16)
SIMT(__nv_bfloat16, __nv_bfloat16, float, 16, 16, 16, 32, false, false, 16, 16)

// ---- warp helpers ----
template <typename T>
__global__ void k_warp(T* p, int width, int mask) {
  T v = p[threadIdx.x];
  v = tiled::shfl_xor(v, mask);
  v = tiled::warp_reduce_sum(v, width);
  v = tiled::warp_reduce_max(v, width);
  v = tiled::warp_reduce_min(v);
  p[threadIdx.x] = v;
}
template __global__ void k_warp<float>(float*, int, int);
template __global__ void k_warp<double>(double*, int, int);
template __global__ void k_warp<int>(int*, int, int);
template __global__ void k_warp<unsigned>(unsigned*, int, int);
template __global__ void k_warp<half>(half*, int, int);
template __global__ void k_warp<__nv_bfloat16>(__nv_bfloat16*, int, int);
"""


def _nvcc(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [NVCC, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Start every nvcc job at once (the selftest builds take about a minute each)."""
    d = tmp_path_factory.mktemp("cuda_header")
    inst = d / "instantiate.cu"
    inst.write_text(INSTANTIATE_SRC)
    common = ["-O3", "-std=c++17", f"-I{INCLUDE}"]
    jobs = {
        "selftest_sm_90a": (
            [*common, *ARCH_FLAGS["sm_90a"], str(SELFTEST), "-o", str(d / "selftest")],
            d / "selftest",
        ),
        "selftest_sm_80": (
            [*common, *ARCH_FLAGS["sm_80"], "-cubin", str(SELFTEST), "-o", str(d / "st80.cubin")],
            d / "st80.cubin",
        ),
    }
    for arch in ARCH_FLAGS:
        out = d / f"inst_{arch}.cubin"
        jobs[f"inst_{arch}"] = (
            [*common, *ARCH_FLAGS[arch], "-cubin", "-Xptxas", "-v", str(inst), "-o", str(out)],
            out,
        )
        ptx = d / f"inst_{arch}.ptx"
        jobs[f"inst_ptx_{arch}"] = (
            [*common, *ARCH_FLAGS[arch], "-ptx", str(inst), "-o", str(ptx)],
            ptx,
        )
    procs = {name: (_nvcc(args), out) for name, (args, out) in jobs.items()}
    results = {}
    for name, (proc, out) in procs.items():
        log, _ = proc.communicate(timeout=580)
        results[name] = (proc.returncode, log, out)
    return results


def _ok(builds, name):
    rc, log, out = builds[name]
    assert rc == 0, f"{name} failed:\n{log[-6000:]}"
    assert out.exists() and out.stat().st_size > 0
    return log, out


def _sm_of_cubin(path: Path) -> int:
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF64
    (e_flags,) = struct.unpack_from("<I", data, 0x30)
    return (e_flags >> 8) & 0xFF


@pytest.mark.slow
def test_selftest_builds_sm90a(builds):
    log, out = _ok(builds, "selftest_sm_90a")
    assert os.access(out, os.X_OK)
    assert "warning" not in log.lower(), log


@pytest.mark.slow
def test_selftest_builds_sm80(builds):
    log, out = _ok(builds, "selftest_sm_80")
    assert _sm_of_cubin(out) == SM_NUMBER["sm_80"]
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_instantiate_all_templates(builds, arch):
    log, out = _ok(builds, f"inst_{arch}")
    assert _sm_of_cubin(out) == SM_NUMBER[arch]
    assert "warning" not in log.lower(), log
    frames = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log
    )
    assert len(frames) >= 30, log  # one per kernel
    bad = [f for f in frames if f != ("0", "0", "0")]
    assert not bad, f"register arrays went to local memory:\n{log}"


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_instantiation_ptx_uses_intended_instructions(builds, arch):
    _, out = _ok(builds, f"inst_ptx_{arch}")
    ptx = out.read_text()
    for instr in [
        "cp.async.ca.shared.global",
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group 2",
        "cp.async.wait_group 0",
        "cp.async.wait_all",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "shfl.sync.bfly.b32",
    ]:
        assert instr in ptx, f"{instr} missing from {arch} PTX"
    assert ".local" not in ptx, "local memory in PTX (dynamically indexed register array?)"


def _find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    try:  # pip wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
        import nvidia  # type: ignore[import-not-found]

        for root in nvidia.__path__:
            for cand in Path(root).glob(f"*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    return None


@pytest.mark.parametrize("arch", sorted(ARCH_FLAGS))
def test_instantiation_sass(builds, arch):
    cuobjdump, nvdisasm = _find_tool("cuobjdump"), _find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    _, out = _ok(builds, f"inst_{arch}")
    env = dict(os.environ, PATH=f"{Path(nvdisasm).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sass = subprocess.run(
        [cuobjdump, "-sass", str(out)], check=True, capture_output=True, text=True, env=env
    ).stdout
    for op in [
        "LDSM.16.M88.4",
        "LDSM.16.MT88.4",
        "LDSM.16.M88.2",
        "LDSM.16.MT88.2",
        "HMMA.16816.F32",
        "HMMA.16816.F32.BF16",
        "LDGSTS",
        "LDGDEPBAR",
        "DEPBAR",
    ]:
        assert op in sass, f"{op} missing from {arch} SASS"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic in SASS"
