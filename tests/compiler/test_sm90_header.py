"""Compile checks for the sm_90a device header (tiled_sm90.h); no GPU needed.

* benchmarks/gpu/sm90/ws_gemm.cu (the warp-specialised GEMM probe, built only from
  tiled_sm90.h) compiles for sm_90a without warnings (a warning here is how ptxas says it
  ignored setmaxnreg or serialised wgmma) and with no stack frame or spills.
* Its PTX holds the intended sm_90a instructions; its SASS (cuobjdump) holds HGMMA
  (wgmma), UTMALDG (TMA load), SYNCS (mbarrier) and USETMAXREG, and no local memory.
* Including tiled_sm90.h in an sm_80 (or plain sm_90) build is harmless: it declares
  nothing there but the TensorMap type and TILED_SM90A_ENABLED == 0.
Everything skips when nvcc is not on PATH; the SASS check also needs cuobjdump (the dev
extra nvidia-cuda-cuobjdump provides it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.compiler.test_cuda_header import _find_tool

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "tiled" / "compiler" / "targets" / "cuda" / "include"
WS_GEMM = REPO / "benchmarks" / "gpu" / "sm90" / "ws_gemm.cu"
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None
)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

SM90A = ["-gencode", "arch=compute_90a,code=sm_90a"]
FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-I", str(INCLUDE)]


def _nvcc(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NVCC, *FLAGS, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ws_gemm_cubin(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("sm90") / "ws_gemm.cubin"
    res = _nvcc(["-cubin", *SM90A, "-Xptxas", "-v", "-o", str(out), str(WS_GEMM)])
    assert res.returncode == 0, res.stderr
    return out, res.stdout + res.stderr


def test_ws_gemm_builds_without_warnings_or_spills(ws_gemm_cubin):
    _, log = ws_gemm_cubin
    assert "warning" not in log.lower(), log
    entries = re.findall(r"Compiling entry function '(\w+)'", log)
    assert "ws_gemm_f16_128x256_s4" in entries and "ws_gemm_bf16_128x256_s4" in entries
    frames = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log
    )
    assert len(frames) == len(entries), log
    assert all(f == ("0", "0", "0") for f in frames), log


def test_ws_gemm_ptx_uses_sm90a_instructions(tmp_path):
    ptx_path = tmp_path / "ws_gemm.ptx"
    res = _nvcc(["-ptx", *SM90A, "-o", str(ptx_path), str(WS_GEMM)])
    assert res.returncode == 0, res.stderr
    ptx = ptx_path.read_text()
    for instr in [
        "mbarrier.init.shared::cta.b64",
        "mbarrier.arrive.expect_tx.shared::cta.b64",
        "mbarrier.try_wait.parity.shared::cta.b64",
        "fence.mbarrier_init.release.cluster",
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
        "prefetch.tensormap",
        "wgmma.fence.sync.aligned",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
        "setmaxnreg.inc.sync.aligned.u32",
        "setmaxnreg.dec.sync.aligned.u32",
    ]:
        assert instr in ptx, f"{instr} missing from PTX"
    assert ".local" not in ptx, "local memory in PTX (dynamically indexed register array?)"


def test_ws_gemm_sass(ws_gemm_cubin):
    cuobjdump = _find_tool("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not available (dev extra nvidia-cuda-cuobjdump)")
    cubin, _ = ws_gemm_cubin
    sass = subprocess.run(
        [cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    for op in ["HGMMA.64x256x16.F32", "HGMMA.64x256x16.F32.BF16", "UTMALDG", "SYNCS", "USETMAXREG"]:
        assert op in sass, f"{op} missing from SASS"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory traffic in SASS"


# Every primitive instantiated, so an sm_90a build type-checks all of them (the probe GEMM
# leaves some unused) and the sm_80 / sm_90 builds prove the guard.
ALL_PRIMITIVES_SRC = r"""
#include "tiled_sm90.h"
#include "tiled_cuda.h"

extern "C" __global__ void __launch_bounds__(256, 1)
k_all(const __grid_constant__ tiled::sm90::TensorMap tm, half* c, __nv_bfloat16* cb, int m,
      int n) {
#if TILED_SM90A_ENABLED
  namespace s9 = tiled::sm90;
  __shared__ __align__(1024) unsigned char tile[2 * 64 * 256 * 2];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    s9::mbarrier_init(&bar, 1);
    s9::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x >= 128) {
    s9::setmaxnreg_dec<40>();
    if (threadIdx.x == 128) {
      s9::tma_prefetch_desc(&tm);
      s9::mbarrier_arrive_expect_tx(&bar, 8192);
      s9::tma_load_2d(tile, &tm, &bar, 0, 0);
    }
  } else {
    s9::setmaxnreg_inc<232>();
    s9::mbarrier_wait_parity(&bar, 0);
    float a64[32], a128[64], a256[128];
    const uint64_t da = s9::desc_kmajor_sw128(tile);
    const uint64_t db = s9::desc_mnmajor_sw128(tile + 16384, 8192);
    const uint64_t dk = s9::desc_at(s9::make_smem_desc(tile, 16, 1024), 32);
    s9::wgmma_fence();
    s9::wgmma_ss<half, 64, 0, 0>(a64, da, dk, 0);
    s9::wgmma_ss<__nv_bfloat16, 64, 0, 1>(a64, da, db, 1);
    s9::wgmma_ss<half, 128, 0, 1>(a128, da, db, 0);
    s9::wgmma_ss<__nv_bfloat16, 128, 0, 0, 1, -1>(a128, da, dk, 1);
    s9::wgmma_ss<half, 256, 0, 1>(a256, da, db, 0);
    s9::wgmma_ss<__nv_bfloat16, 256, 0, 0>(a256, da, dk, 1);
    s9::wgmma_commit_group();
    s9::wgmma_wait_group<0>();
    s9::fence_operands(a256);
    s9::store_acc_global<half, 64>(a64, c, n, 0, 0, m, n);
    s9::store_acc_global<__nv_bfloat16, 128>(a128, cb, n, 64, 0, m, n);
    s9::store_acc_global<half, 256>(a256, c, n, 128, 0, m, n);
    s9::fence_proxy_async_shared();
    if (threadIdx.x == 0) {
      s9::tma_store_2d(&tm, tile, 0, 0);
      s9::tma_store_commit();
      s9::tma_store_wait_read<0>();
      s9::tma_store_wait<0>();
    }
    s9::mbarrier_arrive(&bar);
  }
#else
  if (threadIdx.x == 0 && m > 0) c[0] = __float2half(static_cast<float>(TILED_SM90A_ENABLED));
#endif
}
"""


@pytest.mark.parametrize(
    "arch, flags",
    [
        ("sm_90a", SM90A),
        ("sm_90", ["-gencode", "arch=compute_90,code=sm_90"]),
        ("sm_80", ["-gencode", "arch=compute_80,code=sm_80"]),
    ],
)
def test_header_instantiates_and_is_guarded(tmp_path, arch, flags):
    src = tmp_path / "all.cu"
    src.write_text(ALL_PRIMITIVES_SRC)
    ptx = tmp_path / "all.ptx"
    res = _nvcc(["-ptx", *flags, "-o", str(ptx), str(src)])
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr.lower(), res.stderr
    text = ptx.read_text()
    if arch == "sm_90a":
        for instr in [
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
            "cp.async.bulk.commit_group",
            "cp.async.bulk.wait_group.read 0",
            "fence.proxy.async.shared::cta",
            "mbarrier.arrive.shared::cta.b64",
        ]:
            assert instr in text, f"{instr} missing from sm_90a PTX"
    else:
        assert "wgmma" not in text and "mbarrier" not in text and "setmaxnreg" not in text
