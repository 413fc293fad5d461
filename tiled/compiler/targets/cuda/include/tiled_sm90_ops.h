// tiled_sm90_ops.h -- wgmma for T.gemm in the generic sm_90a lowering, decided per op
// (tiled/compiler/targets/cuda/gemm_sm90.py).
//
// Operands are panel tiles: [rows][cols] stored as panels of 128-byte rows in the 128-byte
// swizzle, 64 16-bit / 128 8-bit / 32 32-bit elements per row, panels rows * 128 bytes apart
// (tiled_sm90_explicit.h's layout, whatever the element size). One wgmma consumes 32 bytes
// of K per row (k16 for 16-bit, k32 for float8, k8 for tf32), so slice kk of K sits at
// 32 * (kk % 4) bytes of panel kk / 4 for every dtype. Compiled for sm_90a device passes only.
#ifndef TILED_SM90_OPS_H_
#define TILED_SM90_OPS_H_

#include "tiled_sm90_explicit.h"

#if TILED_SM90A_ENABLED

namespace tiled {
namespace sm90 {

// float8 (e4m3, e5m2) and tf32 wgmma: both operands K-major (the only form PTX has for them).
template <typename T, int N>
struct WgmmaSSK;

#define TILED_WGMMA_SSK(T, TY, N, K, NREG, TAIL)                                                \
template <>                                                                                     \
struct WgmmaSSK<T, N> {                                                                         \
  __device__ __forceinline__ static void run(float (&d)[NREG], uint64_t desc_a,                 \
                                             uint64_t desc_b) {                                 \
    asm volatile(                                                                               \
        "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." TY "." TY " {"                    \
        TILED_WGMMA_REGS_##NREG "}, " TAIL ";\n"                                                \
        : TILED_WGMMA_D_##NREG(d)                                                               \
        : "l"(desc_a), "l"(desc_b));                                                            \
  }                                                                                             \
};
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 64, 32, 32, "%32, %33, 1, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 128, 32, 64, "%64, %65, 1, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 256, 32, 128, "%128, %129, 1, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 64, 32, 32, "%32, %33, 1, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 128, 32, 64, "%64, %65, 1, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 256, 32, 128, "%128, %129, 1, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 64, 8, 32, "%32, %33, 1, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 128, 8, 64, "%64, %65, 1, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 256, 8, 128, "%128, %129, 1, 1, 1")
#undef TILED_WGMMA_SSK

// One m64nNk(32 bytes) wgmma from shared memory, accumulating.
template <typename T, int N, bool B_KMAJOR>
__device__ __forceinline__ void wgmma_any(float* acc, uint64_t da, uint64_t db) {
  float(&d)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(acc);
  if constexpr (sizeof(T) == 2) {
    wgmma_ss<T, N, 0, B_KMAJOR ? 0 : 1>(d, da, db, 1u);
  } else {
    static_assert(B_KMAJOR, "float8 and tf32 wgmma read B K-major only");
    WgmmaSSK<T, N>::run(d, da, db);
  }
}

// One K slice (32 bytes of each row) of the m64 block whose A descriptor is `da`, over
// columns [COL, BN) of B in wgmma widths of 256 / 128 / 64. B K-major ([BN] rows per K
// panel): rows COL.. at COL * 128 bytes of panel kk / 4, the slice at 32 * (kk % 4). B
// MN-major (16-bit only; BN / 64 panels of [K][64]): column panel COL / 64 at
// COL / 64 * K * 128 bytes, panels K * 128 apart (LBO), slice kk at 2048 * kk.
template <typename T, int BN, int K, bool B_KMAJOR, int COL = 0>
__device__ __forceinline__ void wgmma_cols_any(float* acc, uint64_t da, const unsigned char* sb,
                                               int kk) {
  constexpr int kRest = BN - COL;
  constexpr int kW = kRest >= 256 ? 256 : kRest >= 128 ? 128 : 64;
  const uint64_t db =
      B_KMAJOR ? desc_kmajor_sw128(sb + (kk / 4) * BN * 128 + COL * 128 + 32 * (kk % 4))
               : make_smem_desc(sb + (COL / 64) * K * 128 + 2048 * kk, K * 128, 1024);
  wgmma_any<T, kW, B_KMAJOR>(acc + COL / 2, da, db);
  if constexpr (COL + kW < BN) wgmma_cols_any<T, BN, K, B_KMAJOR, COL + kW>(acc, da, sb, kk);
}

// acc[WM x BN] += A[WM x K] @ B for the calling warpgroup: `a` points at its first row of a
// panel tile of BM rows (panels BM * 128 bytes apart), `b` at a panel tile as wgmma_cols_any
// reads it; acc in the wgmma layout (WM / 64 blocks of BN / 2 floats). Fenced before,
// retired before return (wait_group 0).
template <typename T, int WM, int BM, int BN, int K, bool B_KMAJOR>
__device__ __forceinline__ void wgmma_rows(const void* a, const void* b, float* acc) {
  constexpr int kSlice = 32 / sizeof(T);  // K elements of one wgmma
  static_assert(WM % 64 == 0 && BM % WM == 0 && BN % 64 == 0 && K % (4 * kSlice) == 0,
                "wgmma_rows shape");
  const unsigned char* sa = static_cast<const unsigned char*>(a);
  const unsigned char* sb = static_cast<const unsigned char*>(b);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / kSlice; ++kk) {
#pragma unroll
    for (int h = 0; h < WM / 64; ++h) {
      const uint64_t da = desc_kmajor_sw128(sa + (kk / 4) * BM * 128 + h * 8192 + 32 * (kk % 4));
      wgmma_cols_any<T, BN, K, B_KMAJOR>(acc + h * (BN / 2), da, sb, kk);
    }
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
}

// wgmma_cols with A from registers: `a` the 4 words (8 16-bit elements) of the k16 slice.
template <typename T, int BN, int K, bool B_KMAJOR, int COL = 0>
__device__ __forceinline__ void wgmma_cols_rs(float* acc, const uint32_t* a,
                                              const unsigned char* sb, int kk) {
  constexpr int kRest = BN - COL;
  constexpr int kW = kRest >= 256 ? 256 : kRest >= 128 ? 128 : 64;
  const uint64_t db =
      B_KMAJOR ? desc_kmajor_sw128(sb + (kk / 4) * BN * 128 + COL * 128 + 32 * (kk % 4))
               : make_smem_desc(sb + (COL / 64) * K * 128 + 2048 * kk, K * 128, 1024);
  WgmmaRS<T, kW, B_KMAJOR ? 0 : 1>::run(*reinterpret_cast<float(*)[kW / 2]>(acc + COL / 2), a,
                                        db, 1u);
  if constexpr (COL + kW < BN) wgmma_cols_rs<T, BN, K, B_KMAJOR, COL + kW>(acc, a, sb, kk);
}

// acc[WM x BN] += A[WM x K] @ B for the calling warpgroup, A from registers: `a` the
// thread's 16-bit elements of A in the wgmma accumulator layout of a WM x K tile (WM / 64
// blocks of K / 2 elements; two per 32-bit word, which is wgmma's A-operand layout per k16
// slice), B a panel tile as wgmma_cols reads it. Fenced before, retired before return.
template <typename T, int WM, int BN, int K, bool B_KMAJOR>
__device__ __forceinline__ void wgmma_rows_rs(const void* a, const void* b, float* acc) {
  static_assert(WM % 64 == 0 && BN % 64 == 0 && K % 16 == 0, "wgmma_rows_rs shape");
  const uint32_t* wa = static_cast<const uint32_t*>(a);
  const unsigned char* sb = static_cast<const unsigned char*>(b);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < WM / 64; ++h)
      wgmma_cols_rs<T, BN, K, B_KMAJOR>(acc + h * (BN / 2), wa + h * (K / 4) + 4 * kk, sb, kk);
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
}

// Panel tiles assume the dynamic pool starts on a 1024-byte boundary of the shared window
// (the swizzle's period); it does on sm_90, and a kernel whose pool did not would compute
// garbage, so it stops instead.
__device__ __forceinline__ void check_panel_pool(const void* pool) {
  if (smem_addr(pool) & 1023) __trap();
}

}  // namespace sm90
}  // namespace tiled

#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_OPS_H_
