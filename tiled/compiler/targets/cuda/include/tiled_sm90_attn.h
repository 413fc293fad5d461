// tiled_sm90_attn.h -- the sm_90a warp-specialized attention pipeline that
// sm90_attn.py emits for FlashAttention-shaped programs.
//
// Built on tiled_sm90.h's primitives (mbarrier, TMA, wgmma descriptors); written from
// the PTX ISA. Everything is compiled only for sm_90a device passes.
//
// Shape of the pipeline: one producer warpgroup (its first thread) TMA-loads the Q tile
// once, then per iteration a K and a V tile into a STAGES-deep ring; NWG consumer
// warpgroups each own 64 query rows and run the program between the wgmma calls here.
// Every tile is D / 64 panels of [rows][64] 16-bit elements, 128B-swizzled (one TMA box
// per panel), so Q and K are K-major wgmma operands and V is an MN-major one.
#ifndef TILED_SM90_ATTN_H_
#define TILED_SM90_ATTN_H_

#include "tiled_sm90.h"

#if TILED_SM90A_ENABLED
namespace tiled {
namespace sm90 {
namespace attn {

// WgmmaRS (A from registers) is tiled_sm90.h's.

// Ties the registers of d to this point: reads after it see the values a wgmma wrote
// once its group was waited for.
template <int NREG>
__device__ __forceinline__ void fence_registers(float* d) {
#pragma unroll
  for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The pipeline, for a persistent block that runs program blocks b = 0, 1, ... in turn:
// Q tiles in two slots (block b uses slot b % 2, so the producer loads the next block's Q
// while the consumers work on this one), K / V tiles in a STAGES-deep ring counted across
// blocks (k numbers the K / V tiles of the block's whole life: stage k % STAGES, phase
// (k / STAGES) & 1). Barriers after the tiles: [s] Q of slot s landed; [2 + s] Q of slot s
// read (one arrival per consumer warp); [4 + s] K of stage s landed; [4 + STAGES + s] V of
// stage s landed; [4 + 2 * STAGES + s] K of stage s read; [4 + 3 * STAGES + s] V of stage s
// read. K and V are freed separately: K as soon as S = Q K^T is done, V after P V.
template <typename T, int BM, int BN, int D, int STAGES, int NWG>
struct WsAttn {
  static constexpr uint32_t kQBytes = BM * D * 2;
  static constexpr uint32_t kTileBytes = BN * D * 2;  // one K or V tile
  static_assert(BM == 64 * NWG && D % 64 == 0 && BN % 16 == 0, "WsAttn tile");

  __device__ __forceinline__ static unsigned char* ring(unsigned char* pool) {
    return pool + ((1024 - (smem_addr(pool) & 1023)) & 1023);
  }
  __device__ __forceinline__ static uint64_t* bars(unsigned char* pool) {
    return reinterpret_cast<uint64_t*>(ring(pool) + 2 * kQBytes + 2 * STAGES * kTileBytes);
  }
  __device__ __forceinline__ static unsigned char* q_tile(unsigned char* pool, int b, int j) {
    return ring(pool) + (b & 1) * kQBytes + j * BM * 128;
  }
  __device__ __forceinline__ static unsigned char* k_tile(unsigned char* pool, int k, int j) {
    return ring(pool) + 2 * kQBytes + (k % STAGES) * 2 * kTileBytes + j * BN * 128;
  }
  __device__ __forceinline__ static unsigned char* v_tile(unsigned char* pool, int k, int j) {
    return k_tile(pool, k, j) + kTileBytes;
  }
  __device__ __forceinline__ static uint64_t* q_bar(unsigned char* pool, int b) {
    return bars(pool) + (b & 1);
  }
  __device__ __forceinline__ static uint64_t* q_free(unsigned char* pool, int b) {
    return bars(pool) + 2 + (b & 1);
  }
  __device__ __forceinline__ static uint64_t* k_bar(unsigned char* pool, int k) {
    return bars(pool) + 4 + k % STAGES;
  }
  __device__ __forceinline__ static uint64_t* v_bar(unsigned char* pool, int k) {
    return bars(pool) + 4 + STAGES + k % STAGES;
  }
  __device__ __forceinline__ static uint64_t* k_free(unsigned char* pool, int k) {
    return bars(pool) + 4 + 2 * STAGES + k % STAGES;
  }
  __device__ __forceinline__ static uint64_t* v_free(unsigned char* pool, int k) {
    return bars(pool) + 4 + 3 * STAGES + k % STAGES;
  }

  // Thread 0; the caller then synchronizes the block.
  __device__ __forceinline__ static void init(unsigned char* pool) {
    uint64_t* b = bars(pool);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&b[s], 1);
      mbarrier_init(&b[2 + s], NWG * 4);
    }
    for (int i = 0; i < 2 * STAGES; ++i) mbarrier_init(&b[4 + i], 1);
    for (int i = 0; i < 2 * STAGES; ++i) mbarrier_init(&b[4 + 2 * STAGES + i], NWG * 4);
    fence_barrier_init();
  }

  // Producer, one thread: before block b's Q loads, and before tile k's K loads and V loads
  // (each waits until the consumers freed its slot).
  __device__ __forceinline__ static void begin_q(unsigned char* pool, int b) {
    mbarrier_wait_parity(q_free(pool, b), ((b >> 1) & 1) ^ 1);
    mbarrier_arrive_expect_tx(q_bar(pool, b), kQBytes);
  }
  __device__ __forceinline__ static void begin_k(unsigned char* pool, int k) {
    mbarrier_wait_parity(k_free(pool, k), ((k / STAGES) & 1) ^ 1);
    mbarrier_arrive_expect_tx(k_bar(pool, k), kTileBytes);
  }
  __device__ __forceinline__ static void begin_v(unsigned char* pool, int k) {
    mbarrier_wait_parity(v_free(pool, k), ((k / STAGES) & 1) ^ 1);
    mbarrier_arrive_expect_tx(v_bar(pool, k), kTileBytes);
  }

  // Consumers: block b's Q has landed; block b is done with its Q.
  __device__ __forceinline__ static void wait_q(unsigned char* pool, int b) {
    mbarrier_wait_parity(q_bar(pool, b), (b >> 1) & 1);
  }
  __device__ __forceinline__ static void release_q(unsigned char* pool, int b) {
    if ((threadIdx.x & 31) == 0) mbarrier_arrive(q_free(pool, b));
  }
  // Ping-pong between the two consumer warpgroups: each issues its wgmma groups only in its
  // turn (named barriers 2 and 3, 256 threads: one warpgroup syncs, the other arrives), so
  // one warpgroup's softmax runs while the other's matrix products fill the tensor cores.
  // Warpgroup 1 gives warpgroup 0 the first turn. No-ops with one consumer warpgroup.
  __device__ __forceinline__ static void sched_init() {
    if (NWG == 2 && threadIdx.x / 128 == 1)
      asm volatile("bar.arrive 2, 256;" ::: "memory");
  }
  __device__ __forceinline__ static void sched_wait() {
    if (NWG == 2) asm volatile("bar.sync %0, 256;" ::"r"(2 + threadIdx.x / 128) : "memory");
  }
  __device__ __forceinline__ static void sched_pass() {
    if (NWG == 2)
      asm volatile("bar.arrive %0, 256;" ::"r"(2 + (threadIdx.x / 128 ^ 1)) : "memory");
  }

  // Issues S (+)= Q K(k)^T (the warpgroup's 64 rows of block b's Q against the BN rows of
  // K, over D) as one wgmma group; with `zero`, S's old values are ignored (S = Q K^T).
  __device__ __forceinline__ static void qk_issue(unsigned char* pool, int b, int k, float* s,
                                                  bool zero) {
    mbarrier_wait_parity(k_bar(pool, k), (k / STAGES) & 1);
    const int wg = threadIdx.x / 128;
    const uint64_t qd = desc_kmajor_sw128(q_tile(pool, b, 0) + wg * 64 * 128);
    const uint64_t kd = desc_kmajor_sw128(k_tile(pool, k, 0));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {  // slice kk: panel kk / 4, 32 bytes per slice
      const uint64_t da = desc_at(qd, (kk / 4) * BM * 128 + 32 * (kk % 4));
      const uint64_t db = desc_at(kd, (kk / 4) * BN * 128 + 32 * (kk % 4));
      wgmma_ss<T, BN, 0, 0>(*reinterpret_cast<float(*)[BN / 2]>(s), da, db,
                            (zero && kk == 0) ? 0u : 1u);
    }
    wgmma_commit_group();
  }
  // Waits for the QK group of iteration k, then frees its K. PV_PENDING: a PV group was
  // issued after it and stays in flight (groups retire in order). The count is static:
  // ptxas serializes every wgmma of a kernel whose waits it cannot follow.
  template <bool PV_PENDING>
  __device__ __forceinline__ static void qk_wait(unsigned char* pool, int k, float* s) {
    wgmma_wait_group<PV_PENDING ? 1 : 0>();
    fence_registers<BN / 2>(s);
    if ((threadIdx.x & 31) == 0) mbarrier_arrive(k_free(pool, k));
  }
  // The probabilities (S's layout, float) as 16-bit A-operand words: word i / 2 packs
  // elements i and i + 1, which is A's register layout for each 16-column slice.
  __device__ __forceinline__ static void to_a_regs(const float* s, uint32_t* a) {
    using P = ::tiled::detail::pair_of<T>;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) a[i / 2] = ::tiled::detail::as_u32(P::make(s[i], s[i + 1]));
  }
  // Issues O += P V(k) as one wgmma group. `a` and `o` must stay untouched until pv_wait.
  __device__ __forceinline__ static void pv_issue(unsigned char* pool, int k, const uint32_t* a,
                                                  float* o) {
    mbarrier_wait_parity(v_bar(pool, k), (k / STAGES) & 1);
    const uint64_t vd = make_smem_desc(v_tile(pool, k, 0), BN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t db = desc_at(vd, 2048 * kk);
      WgmmaRS<T, D, 1>::run(*reinterpret_cast<float(*)[D / 2]>(o), a + 4 * kk, db, 1u);
    }
    wgmma_commit_group();
  }
  // The output fragment (O's rows of this warpgroup, D columns) converted to TC, to
  // C[row0 + r][col0 + c] (row-major, leading dimension ldc), rows < m, columns < n.
  template <typename TC>
  __device__ __forceinline__ static void store(const float* o, TC* C, int64_t ldc, int row0,
                                               int col0, int m, int n) {
    store_acc_global<TC, D>(*reinterpret_cast<const float(*)[D / 2]>(o), C, ldc,
                            row0 + (threadIdx.x / 128) * 64, col0, m, n);
  }
  // Waits for every group (the PV of iteration k last), then frees its V.
  __device__ __forceinline__ static void pv_wait(unsigned char* pool, int k, float* o) {
    wgmma_wait_group<0>();
    fence_registers<D / 2>(o);
    if ((threadIdx.x & 31) == 0) mbarrier_arrive(v_free(pool, k));
  }
};

}  // namespace attn
}  // namespace sm90
}  // namespace tiled
#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_ATTN_H_
