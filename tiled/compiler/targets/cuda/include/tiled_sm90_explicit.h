// tiled_sm90_explicit.h -- device functions of the explicit Hopper path (T.ws, T.mbarrier_*,
// T.tma_copy, T.fence_proxy_async; tiled/compiler/targets/cuda/sm90_explicit.py).
//
// Thin wrappers over tiled_sm90.h's primitives, with the signatures the generated code calls:
// barriers and shared tiles arrive as untyped pointers into the dynamic pool (TVM spells
// their element types its own way) and tensor maps as the `const void*` that points at the
// kernel's `const __grid_constant__ TensorMap` parameter.  Compiled for sm_90a device passes
// only, like tiled_sm90.h.
#ifndef TILED_SM90_EXPLICIT_H_
#define TILED_SM90_EXPLICIT_H_

#include "tiled_sm90.h"

#if TILED_SM90A_ENABLED

namespace tiled {
namespace sm90 {

__device__ __forceinline__ void bar_init(void* bar, uint32_t count) {
  mbarrier_init(static_cast<uint64_t*>(bar), count);
}

__device__ __forceinline__ void bar_arrive(void* bar) {
  mbarrier_arrive(static_cast<uint64_t*>(bar));
}

__device__ __forceinline__ void bar_wait(void* bar, uint32_t parity) {
  mbarrier_wait_parity(static_cast<uint64_t*>(bar), parity);
}

// Raises the current phase's expected transaction bytes without arriving (the explicit
// path keeps arrivals and bytes apart: T.mbarrier_arrive counts threads, this counts bytes).
__device__ __forceinline__ void bar_expect_tx(void* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(
                   smem_addr(bar)),
               "r"(tx_bytes)
               : "memory");
}

// -- panel tiles: T.gemm on wgmma (sm90_wgmma.py) ---------------------------------
// Panel tiles live in one region of the pool that starts at the first 1024-byte boundary
// at or after `region` (the compiler reserves 1024 bytes of slack): the 128-byte swizzle
// repeats every 8 rows of 128 bytes, and TMA and the wgmma descriptors both assume a tile
// starts on that period. Writer (TMA) and reader (wgmma) align the same pointer the same way.
__device__ __forceinline__ unsigned char* panel_region(void* region) {
  unsigned char* p = static_cast<unsigned char*>(region);
  return p + ((1024 - (smem_addr(p) & 1023)) & 1023);
}

// The tile [rows][64 * PANELS] at (c0 = column, c1 = row) of `map` (SWIZZLE_128B, box
// {64, rows}) into the panel tile at byte `offset` of the region: panel p (columns
// [64p, 64p + 64)) at offset + p * PANEL_BYTES. One thread; all boxes complete on `bar`.
template <int PANELS, int PANEL_BYTES>
__device__ __forceinline__ void tma_load_panels(void* region, int32_t offset, const void* map,
                                                void* bar, int32_t c0, int32_t c1) {
  unsigned char* dst = panel_region(region) + offset;
  const TensorMap* m = static_cast<const TensorMap*>(map);
  uint64_t* b = static_cast<uint64_t*>(bar);
#pragma unroll
  for (int p = 0; p < PANELS; ++p) tma_load_2d(dst + p * PANEL_BYTES, m, b, c0 + 64 * p, c1);
}

// One k16 step of the m64 block whose A descriptor is `da`, over columns [COL, BN) of B in
// wgmma widths of 256 / 128 / 64. B K-major ([BN][64] per K panel): rows COL.. start at
// COL * 128 bytes of the panel, k16 slice kk at 32 * (kk % 4). B MN-major (BN / 64 panels of
// [K][64]): column panel COL / 64 at COL / 64 * K * 128 bytes, panels K * 128 apart (LBO),
// k16 slice kk at 2048 * kk.
template <typename T, int BN, int K, bool B_KMAJOR, int COL = 0>
__device__ __forceinline__ void wgmma_cols(float* acc, uint64_t da, const unsigned char* sb,
                                           int kk) {
  constexpr int kRest = BN - COL;
  constexpr int kW = kRest >= 256 ? 256 : kRest >= 128 ? 128 : 64;
  const uint64_t db =
      B_KMAJOR ? desc_kmajor_sw128(sb + (kk / 4) * BN * 128 + COL * 128 + 32 * (kk % 4))
               : make_smem_desc(sb + (COL / 64) * K * 128 + 2048 * kk, K * 128, 1024);
  wgmma_ss<T, kW, 0, B_KMAJOR ? 0 : 1>(*reinterpret_cast<float(*)[kW / 2]>(acc + COL / 2), da,
                                       db, 1u);
  if constexpr (COL + kW < BN) wgmma_cols<T, BN, K, B_KMAJOR, COL + kW>(acc, da, sb, kk);
}

// acc[BM x BN] += A[BM x K] @ B for one warpgroup, A and B panel tiles at byte offsets
// a_off / b_off of the region (A K-major; B as B_KMAJOR says); acc in the wgmma layout
// (BM / 64 blocks of BN / 2 floats). Fenced before (the accumulator may have been written
// by ordinary instructions), retired before return (wait_group 0): the caller may then
// release the stage and touch the accumulator, and ptxas sees every wait.
template <typename T, int BM, int BN, int K, bool B_KMAJOR>
__device__ __forceinline__ void wgmma_tile(void* region, int32_t a_off, int32_t b_off,
                                           float* acc) {
  static_assert(BM % 64 == 0 && BN % 64 == 0 && BN <= 256 && K % 64 == 0, "wgmma_tile shape");
  const unsigned char* base = panel_region(region);
  const unsigned char* sa = base + a_off;
  const unsigned char* sb = base + b_off;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < BM / 64; ++h) {
      const uint64_t da = desc_kmajor_sw128(sa + (kk / 4) * BM * 128 + h * 8192 + 32 * (kk % 4));
      wgmma_cols<T, BN, K, B_KMAJOR>(acc + h * (BN / 2), da, sb, kk);
    }
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
}

// A barrier among the 128 threads of one warpgroup (named barrier ID, 1..15); the other
// warpgroups never join it, so a warpgroup region can synchronize its own shared accesses.
template <int ID>
__device__ __forceinline__ void warpgroup_sync() {
  asm volatile("bar.sync %0, 128;" ::"n"(ID) : "memory");
}

}  // namespace sm90
}  // namespace tiled

#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_EXPLICIT_H_
