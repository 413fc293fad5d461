// tiled_sm90_ops.h -- wgmma for T.gemm in the generic sm_90a lowering, decided per op
// (tiled/compiler/targets/cuda/gemm_sm90.py).
//
// Operands are panel tiles: [rows][cols] stored as panels of 128-byte rows in the 128-byte
// swizzle, 64 16-bit / 128 8-bit / 32 32-bit elements per row, panels rows * 128 bytes apart
// (tiled_sm90_explicit.h's layout, whatever the element size). One wgmma consumes 32 bytes
// of K per row (k16 for 16-bit, k32 for float8, k8 for tf32), so slice kk of K sits at
// 32 * (kk % 4) bytes of panel kk / 4 for every dtype. A K-major operand whose K is 64 bytes
// (32 16-bit elements: TileLang's block_K = 32) is one narrow panel: 64-byte rows in the
// 64-byte swizzle, 8-row groups 512 bytes apart, slice kk at 32 * kk bytes. Compiled for
// sm_90a device passes only.
#ifndef TILED_SM90_OPS_H_
#define TILED_SM90_OPS_H_

#include "tiled_sm90_explicit.h"

#if TILED_SM90A_ENABLED

namespace tiled {
namespace sm90 {

// Two consumer warpgroups (threads 0..255) taking turns to issue their gemms (ws_loop.py):
// warpgroup w waits on named barrier 2 + w, which the other one arrives on once it has
// issued its own (256 threads per barrier: 128 waiting, 128 arriving). Warpgroup 1 lets
// warpgroup 0 go first (turn_first, before the loop) and warpgroup 0 takes the last turn
// warpgroup 1 passes it (turn_last, after the loop), so every arrival meets a wait.
__device__ __forceinline__ uint32_t consumer_warpgroup() { return threadIdx.x >> 7; }
__device__ __forceinline__ void turn_wait() {
  asm volatile("bar.sync %0, 256;" ::"r"(2 + consumer_warpgroup()) : "memory");
}
__device__ __forceinline__ void turn_pass() {
  asm volatile("bar.arrive %0, 256;" ::"r"(3 - consumer_warpgroup()) : "memory");
}
__device__ __forceinline__ void turn_first() {
  if (consumer_warpgroup() == 1) asm volatile("bar.arrive 2, 256;" ::: "memory");
}
__device__ __forceinline__ void turn_last() {
  if (consumer_warpgroup() == 0) asm volatile("bar.sync 2, 256;" ::: "memory");
}

// acc[WM x BN] += A[WM x K] @ B (ZERO: acc = A @ B, its old values ignored by the first
// wgmma's scale-d) for the calling warpgroup: `a` points at its first row of a
// panel tile of BM rows (panels BM * 128 bytes apart), `b` at a panel tile as wgmma_cols_any
// reads it; acc in the wgmma layout (WM / 64 blocks of BN / 2 floats). Fenced before;
// wgmma_rows retires it before return (wait_group 0), wgmma_rows_issue leaves it in flight;
// with TURN, issued on this warpgroup's turn. KS: the K elements A's and B's stages hold (2 *
// K where two K tiles share a ring stage, ws_loop.py: `a` and `b` then point at this
// tile's half; two narrow tiles make one panel of 128-byte rows). BP: the rows of a K-major
// B's panels where the warpgroup reads BN of them (a FullCol accumulator's columns).
template <typename T, int WM, int BM, int BN, int K, bool B_KMAJOR, bool TURN = false,
          bool ZERO = false, int KS = K, int BP = BN, typename Acc>
__device__ __forceinline__ void wgmma_rows_issue(const void* a, const void* b, Acc* acc) {
  constexpr int kSlice = 32 / sizeof(T);  // K elements of one wgmma
  constexpr bool kNarrow = narrow_panel<T, KS>();
  static_assert(WM % 64 == 0 && BM % WM == 0 &&
                    (BN % 64 == 0 || (sizeof(T) == 2 && B_KMAJOR && BN % 16 == 0) ||
                     (B_KMAJOR && BN % 32 == 0 && BN >= 96)) &&
                    (K % (4 * kSlice) == 0 || narrow_panel<T, K>()),
                "wgmma_rows shape");
  const unsigned char* sa = static_cast<const unsigned char*>(a);
  const unsigned char* sb = static_cast<const unsigned char*>(b);
  if constexpr (TURN) turn_wait();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / kSlice; ++kk) {
#pragma unroll
    for (int h = 0; h < WM / 64; ++h) {
      const uint64_t da =
          kNarrow ? desc_at(make_smem_desc(sa, 16, 512, Swizzle::k64B), h * 4096 + 32 * kk)
                  : desc_at(desc_kmajor_sw128(sa), (kk / 4) * BM * 128 + h * 8192 + 32 * (kk % 4));
      wgmma_cols_any<T, BN, K, B_KMAJOR, KS, 0, BP>(acc + h * (BN / 2), da, sb, kk,
                                             ZERO && kk == 0 ? 0u : 1u);
    }
  }
  wgmma_commit_group();
  if constexpr (TURN) turn_pass();
}
template <typename T, int WM, int BM, int BN, int K, bool B_KMAJOR, bool TURN = false,
          bool ZERO = false, int KS = K, int BP = BN, typename Acc>
__device__ __forceinline__ void wgmma_rows(const void* a, const void* b, Acc* acc) {
  wgmma_rows_issue<T, WM, BM, BN, K, B_KMAJOR, TURN, ZERO, KS, BP>(a, b, acc);
  wgmma_wait_group<0>();
}

// wgmma_cols_any with A from registers: `a` the 4 words (8 16-bit elements) of the k16 slice.
template <typename T, int BN, int K, bool B_KMAJOR, int KS = K, int COL = 0>
__device__ __forceinline__ void wgmma_cols_rs(float* acc, const uint32_t* a,
                                              const unsigned char* sb, int kk,
                                              uint32_t scale_d = 1u) {
  constexpr int kW = cols_width<BN, COL>();
  constexpr bool kNarrow = narrow_panel<T, KS>();
  WgmmaRS<T, kW, B_KMAJOR ? 0 : 1>::run(*reinterpret_cast<float(*)[kW / 2]>(acc + COL / 2), a,
                                        b_desc<BN, KS, B_KMAJOR, COL, kNarrow>(sb, kk), scale_d);
  if constexpr (COL + kW < BN)
    wgmma_cols_rs<T, BN, K, B_KMAJOR, KS, COL + kW>(acc, a, sb, kk, scale_d);
}

// acc[WM x BN] += A[WM x K] @ B (ZERO: acc = A @ B, its old values ignored by the first
// wgmma's scale-d) for the calling warpgroup, A from registers: `a` the
// thread's 16-bit elements of A in the wgmma accumulator layout of a WM x K tile (WM / 64
// blocks of K / 2 elements; two per 32-bit word, which is wgmma's A-operand layout per k16
// slice), B a panel tile as wgmma_cols_any reads it. As wgmma_rows (and _issue).
template <typename T, int WM, int BN, int K, bool B_KMAJOR, bool TURN = false,
          bool ZERO = false, int KS = K>
__device__ __forceinline__ void wgmma_rows_rs_issue(const void* a, const void* b, float* acc) {
  static_assert(WM % 64 == 0 && (BN % 64 == 0 || (B_KMAJOR && BN % 16 == 0)) &&
                    K % 16 == 0,
                "wgmma_rows_rs shape");
  const uint32_t* wa = static_cast<const uint32_t*>(a);
  const unsigned char* sb = static_cast<const unsigned char*>(b);
  if constexpr (TURN) turn_wait();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < WM / 64; ++h)
      wgmma_cols_rs<T, BN, K, B_KMAJOR, KS>(acc + h * (BN / 2), wa + h * (K / 4) + 4 * kk, sb,
                                            kk, ZERO && kk == 0 ? 0u : 1u);
  }
  wgmma_commit_group();
  if constexpr (TURN) turn_pass();
}
template <typename T, int WM, int BN, int K, bool B_KMAJOR, bool TURN = false,
          bool ZERO = false, int KS = K>
__device__ __forceinline__ void wgmma_rows_rs(const void* a, const void* b, float* acc) {
  wgmma_rows_rs_issue<T, WM, BN, K, B_KMAJOR, TURN, ZERO, KS>(a, b, acc);
  wgmma_wait_group<0>();
}

// -- wgmma left in flight (wgmma_waits.py) ------------------------------------------
// The *_issue forms above return with the group in flight. `retire<N>` waits until at most
// N groups are; then `hold_*` ties the registers of each retired group (its accumulator,
// its register A operand) to that point, so that the compiler neither reads an
// accumulator nor reuses an operand's registers while the hardware still owns them.
template <int N>
__device__ __forceinline__ void retire() { wgmma_wait_group<N>(); }
template <int N>
__device__ __forceinline__ void hold_f32(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void hold_f32(int32_t* d) {  // an int8 gemm's int32 accumulator
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void hold_words(void* p) {
  uint32_t* w = static_cast<uint32_t*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(w[i])::"memory");
}

// Panel tiles assume the dynamic pool starts on a 1024-byte boundary of the shared window
// (the swizzle's period); it does on sm_90, and a kernel whose pool did not would compute
// garbage, so it stops instead.
__device__ __forceinline__ void check_panel_pool(const void* pool) {
  if (smem_addr(pool) & 1023) __trap();
}

// -- the T.Pipelined ring of the generic lowering (ws_loop.py) -----------------------
// One producer thread fills a stage: it arrives on the stage's full barrier and expects the
// bytes its TMA boxes bring (the phase completes when they land).
__device__ __forceinline__ void ring_fill(void* bar, uint32_t tx_bytes) {
  mbarrier_arrive_expect_tx(static_cast<uint64_t*>(bar), tx_bytes);
}

// A producer thread has issued its cp.async vectors of a gathered stage: the stage's full
// barrier (its arrive count the producer's threads) counts it once they have all landed
// (.noinc: the arrival is one of the count, not added to it).
__device__ __forceinline__ void ring_gathered(void* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

// A consumer warp is done with a stage: once all its lanes are here, lane 0 arrives on the
// stage's empty barrier (its arrive count is the consumer warps).
__device__ __forceinline__ void ring_release(void* bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(static_cast<uint64_t*>(bar));
}

}  // namespace sm90
}  // namespace tiled

#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_OPS_H_
