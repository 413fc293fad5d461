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

// (WgmmaSSK, the float8 and tf32 wgmma, is in tiled_sm90.h.)

// int8 x int8 -> int32 wgmma (m64nNk32, both operands K-major): int32 accumulators, so
// the registers are "r" operands where the float forms have "f".
#define TILED_WGMMA_I32(d, i) TILED_WGMMA_OPS32("+r", d, i)
#define TILED_WGMMA_I_32(d) TILED_WGMMA_I32(d, 0)
#define TILED_WGMMA_I_64(d) TILED_WGMMA_I32(d, 0), TILED_WGMMA_I32(d, 32)
#define TILED_WGMMA_I_128(d)                                                                    \
  TILED_WGMMA_I32(d, 0), TILED_WGMMA_I32(d, 32), TILED_WGMMA_I32(d, 64), TILED_WGMMA_I32(d, 96)
#define TILED_WGMMA_I16(d, i) TILED_WGMMA_OPS8("+r", d, i), TILED_WGMMA_OPS8("+r", d, (i) + 8)
#define TILED_WGMMA_I_48(d) TILED_WGMMA_I32(d, 0), TILED_WGMMA_I16(d, 32)
#define TILED_WGMMA_I_80(d) TILED_WGMMA_I_64(d), TILED_WGMMA_I16(d, 64)
#define TILED_WGMMA_I_96(d) TILED_WGMMA_I_64(d), TILED_WGMMA_I32(d, 64)
#define TILED_WGMMA_I_112(d) TILED_WGMMA_I_96(d), TILED_WGMMA_I16(d, 96)
template <typename T>
struct IsS8 {
  static constexpr bool value = false;
};
template <>
struct IsS8<int8_t> {
  static constexpr bool value = true;
};
template <int N>
struct WgmmaS8;
#define TILED_WGMMA_S8(N, NREG, PRED, TAIL)                                                     \
template <>                                                                                     \
struct WgmmaS8<N> {                                                                             \
  __device__ __forceinline__ static void run(int32_t (&d)[NREG], uint64_t desc_a,               \
                                             uint64_t desc_b, uint32_t scale_d) {               \
    asm volatile(                                                                               \
        "{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                       \
        "wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8 {"                                \
        TILED_WGMMA_REGS_##NREG "}, " TAIL ";\n}\n"                                             \
        : TILED_WGMMA_I_##NREG(d)                                                               \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                              \
  }                                                                                             \
};
TILED_WGMMA_S8(64, 32, "%34", "%32, %33, p")
TILED_WGMMA_S8(128, 64, "%66", "%64, %65, p")
TILED_WGMMA_S8(256, 128, "%130", "%128, %129, p")
TILED_WGMMA_S8(96, 48, "%50", "%48, %49, p")
TILED_WGMMA_S8(160, 80, "%82", "%80, %81, p")
TILED_WGMMA_S8(192, 96, "%98", "%96, %97, p")
TILED_WGMMA_S8(224, 112, "%114", "%112, %113, p")
#undef TILED_WGMMA_S8

// One m64nNk(32 bytes) wgmma from shared memory, accumulating (float, or int32 for int8).
// scale_d 0: D = A * B, the accumulator's old values ignored.
template <typename T, int N, bool B_KMAJOR, typename Acc>
__device__ __forceinline__ void wgmma_any(Acc* acc, uint64_t da, uint64_t db,
                                          uint32_t scale_d = 1u) {
  Acc(&d)[N / 2] = *reinterpret_cast<Acc(*)[N / 2]>(acc);
  if constexpr (IsS8<T>::value) {
    static_assert(B_KMAJOR, "int8 wgmma reads B K-major only");
    WgmmaS8<N>::run(d, da, db, scale_d);
  } else if constexpr (sizeof(T) == 2) {
    wgmma_ss<T, N, 0, B_KMAJOR ? 0 : 1>(d, da, db, scale_d);
  } else {
    static_assert(B_KMAJOR, "float8 and tf32 wgmma read B K-major only");
    WgmmaSSK<T, N>::run(d, da, db, scale_d);
  }
}

// One K slice (32 bytes of each row) of the m64 block whose A descriptor is `da`, over
// columns [COL, BN) of B in wgmma widths of 256 / 128 / 64. B K-major ([BN] rows per K
// panel): rows COL.. at COL * 128 bytes of panel kk / 4, the slice at 32 * (kk % 4). B
// MN-major (16-bit only; BN / 64 panels of [K][64]): column panel COL / 64 at
// COL / 64 * K * 128 bytes, panels K * 128 apart (LBO), slice kk at 2048 * kk.
// Whether a K-major operand of K elements of T is one narrow panel: rows of 64 bytes in the
// 64-byte swizzle, 8-row groups 512 bytes apart (gemm_sm90.py's panel_row_bytes).
template <typename T, int K>
__host__ __device__ constexpr bool narrow_panel() {
  return K * sizeof(T) == 64;
}

// NARROW (K-major B of one narrow panel, narrow_panel): rows COL.. at COL * 64 bytes.
// BP: the rows of a K-major B's panels, BN unless the warpgroup reads BN of them (a FullCol
// accumulator's columns, gemm_sm90.py; `sb` then points at its first row).
template <int BN, int K, bool B_KMAJOR, int COL, bool NARROW = false, int BP = BN>
__device__ __forceinline__ uint64_t b_desc(const unsigned char* sb, int kk) {
  if constexpr (B_KMAJOR && NARROW)
    return desc_at(make_smem_desc(sb, 16, 512, Swizzle::k64B), COL * 64 + 32 * kk);
  if constexpr (B_KMAJOR)
    return desc_at(desc_kmajor_sw128(sb), (kk / 4) * BP * 128 + COL * 128 + 32 * (kk % 4));
  return desc_at(make_smem_desc(sb, K * 128, 1024), (COL / 64) * K * 128 + 2048 * kk);
}

// The wgmma width for columns [COL, BN): the widest of 256, 224, 192, 160, 128, 96, 64, 32,
// 16 they fill, so that a 224-column tile is one instruction a K slice rather than three
// (128 + 64 + 32), each of which reads the whole A slice from shared memory again (a K-major
// 16-bit B's tile may end in 16 or 32 columns past its 64s: 80 = 64 + 16). An MN-major B
// spans whole 64-column panels, so its widths stay multiples of 64 there.
template <int BN, int COL>
__host__ __device__ constexpr int cols_width() {
  constexpr int kLeft = BN - COL;
  return kLeft >= 256 ? 256 : kLeft >= 224 ? 224 : kLeft >= 192 ? 192 : kLeft >= 160 ? 160
       : kLeft >= 128 ? 128 : kLeft >= 96 ? 96 : kLeft >= 64 ? 64 : kLeft >= 32 ? 32 : 16;
}

// KS: the K elements B's stage holds (2 * K where two K tiles share a ring stage, ws_loop.py:
// `sb` then points at this tile's half).
template <typename T, int BN, int K, bool B_KMAJOR, int KS = K, int COL = 0, int BP = BN,
          typename Acc>
__device__ __forceinline__ void wgmma_cols_any(Acc* acc, uint64_t da, const unsigned char* sb,
                                               int kk, uint32_t scale_d = 1u) {
  constexpr int kW = cols_width<BN, COL>();
  constexpr bool kNarrow = narrow_panel<T, KS>();
  wgmma_any<T, kW, B_KMAJOR>(acc + COL / 2, da,
                             b_desc<BN, KS, B_KMAJOR, COL, kNarrow, BP>(sb, kk), scale_d);
  if constexpr (COL + kW < BN)
    wgmma_cols_any<T, BN, K, B_KMAJOR, KS, COL + kW, BP>(acc, da, sb, kk, scale_d);
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
      const uint64_t da =
          desc_at(desc_kmajor_sw128(sa), (kk / 4) * BM * 128 + h * 8192 + 32 * (kk % 4));
      wgmma_cols_any<T, BN, K, B_KMAJOR>(acc + h * (BN / 2), da, sb, kk);
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
