// tiled_cuda.h -- device-side tile primitives for the tiled CUDA backend.
//
// The CUDA backend emits CUDA C++ through TVM; tile operations (async copies,
// tensor-core GEMM, SIMT GEMM, warp reductions) are emitted as calls into the
// templates below.  Everything lives in namespace `tiled`.  Requirements:
//   * sm_80 or newer (cp.async, ldmatrix, mma.sync m16n8k16 with bf16).
//   * 1-D thread blocks: the functions read threadIdx.x only.
// The accumulator layout of gemm_ss (see acc_coord) is part of the contract
// with the compiler: it must not change without changing the compiler.
//
// Only cuda_fp16.h, cuda_bf16.h and stdint.h are included on purpose: the
// header is pasted into / included by generated code compiled by nvcc or
// NVRTC-like flows, so it avoids the C++ standard library.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#ifdef __CUDACC_RTC__
// NVRTC has no C library headers; libcu++ ships the fixed-width integer types.
#include <cuda/std/cstdint>
using cuda::std::int8_t;
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint8_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
#else
#include <stdint.h>
#endif

namespace tiled {

// Programmatic dependent launch (T.pdl_sync / T.pdl_trigger): griddepcontrol on sm_90 and
// newer; before that kernels start in stream order and there is nothing to do.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Orders this thread's memory accesses at device scope as an acquire-release fence: the
// fences around an ordered T.atomic_add (its memory_order; seq_cst takes __threadfence).
__device__ __forceinline__ void fence_acq_rel() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

namespace detail {

template <typename A, typename B>
struct is_same {
  static constexpr bool value = false;
};
template <typename A>
struct is_same<A, A> {
  static constexpr bool value = true;
};

// 32-bit shared-state-space address of a generic pointer into shared memory
// (what ldmatrix / cp.async take as their .shared operand).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace detail

// ---------------------------------------------------------------------------
// 1. Asynchronous global -> shared copies (cp.async, sm_80+)
// ---------------------------------------------------------------------------

// Copy BYTES (4, 8 or 16) from global `gmem_src` to shared `smem_dst`
// asynchronously.  Both addresses must be BYTES-aligned.
//
// Predication: when !pred the instruction is still issued, but with its
// src-size operand set to 0.  PTX defines cp.async as "copy src-size bytes,
// then fill the remaining cp-size - src-size bytes of the destination with
// zeros", so with src-size 0 no global memory is read and the destination is
// zero-filled.  This gives branch-free boundary handling (out-of-bounds parts
// of a tile become 0, which is what GEMM padding needs) and keeps the copy in
// the same commit group as its neighbours.  We pass `gmem_src` unchanged in
// that case (no clamping): callers may pass an out-of-range address when
// !pred; it is never dereferenced.  It must still be BYTES-aligned.
//
// 16-byte copies use .cg (cache in L2 only: tile data is streamed into shared
// memory once per block, L1 would only be polluted); 4/8-byte copies must use
// .ca (PTX allows .cg only for cp-size 16).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem_dst, const void* gmem_src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp_async: BYTES must be 4, 8 or 16");
  const uint32_t dst = detail::smem_u32(smem_dst);
  const int src_size = pred ? BYTES : 0;
  // cvta.to.global is pure address arithmetic: it does not touch memory, so it
  // is safe for out-of-range addresses too.
  const size_t src = __cvta_generic_to_global(gmem_src);
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                 "r"(src_size)
                 : "memory");
  }
}

// Close the current group of cp.async operations issued by this thread.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still pending
// (N = number of stages still allowed in flight in a multi-stage pipeline).
// Only this thread's copies are covered: a __syncthreads() is still needed
// before other threads read the data.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait: N must be >= 0");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Wait for all of this thread's cp.async operations (committed or not).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// ---------------------------------------------------------------------------
// 2. Tensor-core GEMM from shared memory (ldmatrix + mma.sync m16n8k16)
// ---------------------------------------------------------------------------
//
// PTX ISA fragment layouts for mma.m16n8k16 with 16-bit inputs (g = lane/4,
// t = lane%4; every A/B register holds 2 consecutive-k elements, low half =
// smaller k):
//   A (16x16, row):  a0 = A[g   ][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                    a2 = A[g   ][2t+8..+9]    a3 = A[g+8][2t+8..+9]
//   B (16x8, col):   b0 = B[2t..2t+1  ][g]     b1 = B[2t+8..2t+9][g]
//   C/D (16x8 f32):  c0,c1 = C[g][2t], C[g][2t+1]; c2,c3 = C[g+8][2t], C[g+8][2t+1]
// ldmatrix.m8n8.x{2,4}.b16: lanes 8j..8j+7 give the addresses of rows 0..7 of
// matrix j (each row = 8 contiguous 16-bit elements, 16-byte aligned).  Result
// register j of lane l holds, for that matrix Mj:
//   without .trans: Mj[l/4][2(l%4) .. 2(l%4)+1]
//   with .trans:    Mj[2(l%4)][l/4], Mj[2(l%4)+1][l/4]
// i.e. exactly an A/B fragment register when Mj is chosen as below.

namespace detail {

template <typename T>
struct mma_dtype_ok {
  static constexpr bool value = is_same<T, half>::value || is_same<T, __nv_bfloat16>::value;
};

// Element offset (from the tile origin, i.e. from A(m0, k0)) of the row
// address lane `l` feeds to ldmatrix.x4 for one 16x16 A fragment.
//  !TRANS_A (A[m*LDA + k]): no .trans.  Matrix j must be the 8x8 block
//    (rows 8*(j%2).., k 8*(j/2)..) so that register j is a_j; its row r is
//    row m = 8*(j%2)+r, starting at k = 8*(j/2).  With j = l/8, r = l%8:
//    m = l%16, k = 8*(l/16).
//  TRANS_A (stored K x M, A[k*LDA + m]): .trans.  A block's memory rows are
//    k-rows; if Mj's row r is A(k = 8*(j/2)+r, m = 8*(j%2) .. +7) then the
//    .trans result Mj[2t+i][g] = op(A)[8*(j%2)+g][8*(j/2)+2t+i] = a_j.
//    So k = 8*(l/16) + l%8, m = 8*((l/8)%2).
template <bool TRANS_A, int LDA>
__host__ __device__ __forceinline__ int ldsm_a_lane_off(int l) {
  if (TRANS_A) return (8 * (l >> 4) + (l & 7)) * LDA + 8 * ((l >> 3) & 1);
  return (l & 15) * LDA + 8 * (l >> 4);
}

// Element offset (from B(k0, n0)) of the row address lane `l` feeds to
// ldmatrix.x4 loading the B fragments of TWO adjacent n8 tiles (n0, n0+8).
// Matrix j covers k block 8*(j%2) and n block 8*(j/2): registers
// {r0, r1, r2, r3} = {b0, b1 of tile n0, b0, b1 of tile n0+8}.
//  !TRANS_B (B[k*LDB + n]): memory rows are k-rows -> .trans.  Mj row r =
//    B(k = 8*(j%2)+r, n = 8*(j/2) .. +7); .trans gives Mj[2t+i][g] =
//    B[8*(j%2)+2t+i][8*(j/2)+g] = b_{j%2} of tile j/2.
//    So k = 8*((l/8)%2) + l%8, n = 8*(l/16).
//  TRANS_B (stored N x K, B[n*LDB + k]): memory rows are n-rows -> no .trans.
//    Mj row r = B(n = 8*(j/2)+r, k = 8*(j%2) .. +7); result Mj[g][2t+i] =
//    op(B)[8*(j%2)+2t+i][8*(j/2)+g] = b_{j%2} of tile j/2.
//    So n = 8*(l/16) + l%8, k = 8*((l/8)%2).
// For a single n8 tile (.x2) only lanes 0..15 are used; callers pass l & 15,
// which drops the n-block term and keeps every address inside the tile.
template <bool TRANS_B, int LDB>
__host__ __device__ __forceinline__ int ldsm_b_lane_off(int l) {
  if (TRANS_B) return (8 * (l >> 4) + (l & 7)) * LDB + 8 * ((l >> 3) & 1);
  return (8 * ((l >> 3) & 1) + (l & 7)) * LDB + 8 * (l >> 4);
}

// Element offset of the ldmatrix row address for the A fragment (mt, k-step ks)
// of warp row wm, lane l.  Shared by the device code and host-side tests.
template <int M, int K, int WARP_M, bool TRANS_A, int LDA>
__host__ __device__ __forceinline__ int gemm_a_addr(int wm, int l, int ks, int mt) {
  const int m0 = wm * (M / WARP_M) + mt * 16;
  const int k0 = ks * 16;
  const int origin = TRANS_A ? k0 * LDA + m0 : m0 * LDA + k0;
  return origin + ldsm_a_lane_off<TRANS_A, LDA>(l);
}

// Element offset of the ldmatrix row address for the B fragments of the n8
// tiles starting at tile index nt (nt and nt+1 when X4, nt alone otherwise).
template <int N, int K, int WARP_N, bool TRANS_B, int LDB, bool X4>
__host__ __device__ __forceinline__ int gemm_b_addr(int wn, int l, int ks, int nt) {
  const int n0 = wn * (N / WARP_N) + nt * 8;
  const int k0 = ks * 16;
  const int origin = TRANS_B ? n0 * LDB + k0 : k0 * LDB + n0;
  return origin + ldsm_b_lane_off<TRANS_B, LDB>(X4 ? l : (l & 15));
}

// (row, col) of acc[idx] of thread `tid` -- the C/D fragment layout above,
// tiled over warps (wm, wn) and fragments (mt, nt).
template <int M, int N, int WARP_M, int WARP_N>
__host__ __device__ __forceinline__ void acc_coord_of(int tid, int idx, int& row, int& col) {
  constexpr int WM = M / WARP_M, WN = N / WARP_N, NT = WN / 8;
  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WARP_N, wn = warp % WARP_N;
  const int frag = idx >> 2, r = idx & 3;
  const int mt = frag / NT, nt = frag % NT;
  row = wm * WM + mt * 16 + (lane >> 2) + 8 * (r >> 1);
  col = wn * WN + nt * 8 + (lane & 3) * 2 + (r & 1);
}

template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                        const void* p) {
  const uint32_t a = smem_u32(p);
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
  }
}

template <bool TRANS>
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  const uint32_t a = smem_u32(p);
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(a));
  }
}

// d = a * b + d for one m16n8k16 tile, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
  if constexpr (is_same<T, half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

}  // namespace detail

// Number of fp32 accumulators each thread holds for gemm_ss (MT * NT * 4).
template <int M, int N, int WARP_M, int WARP_N>
__host__ __device__ constexpr int acc_size() {
  return (M / WARP_M / 16) * (N / WARP_N / 8) * 4;
}

// (row, col) of C held by acc[idx] of the calling thread (tid = threadIdx.x):
//   warp = tid/32, lane = tid%32, wm = warp / WARP_N, wn = warp % WARP_N,
//   WM = M/WARP_M, WN = N/WARP_N, NT = WN/8, idx = (mt*NT + nt)*4 + r,
//   row = wm*WM + mt*16 + lane/4 + 8*(r/2), col = wn*WN + nt*8 + (lane%4)*2 + r%2.
// This is the mma.m16n8 C fragment layout, so gemm_ss never shuffles results.
template <int M, int N, int WARP_M, int WARP_N>
__device__ __forceinline__ void acc_coord(int idx, int& row, int& col) {
  detail::acc_coord_of<M, N, WARP_M, WARP_N>(static_cast<int>(threadIdx.x), idx, row, col);
}

// acc += op(A) @ op(B) for an M x N x K tile held in shared memory.
//   T: half or __nv_bfloat16; accumulation in fp32.
//   Threads 0 .. 32*WARP_M*WARP_N-1 (threadIdx.x) must all call this together
//   (ldmatrix/mma are warp-collective); threads beyond that (e.g. extra
//   producer warps) must not call it.  No barrier inside: the caller
//   synchronizes before (smem written) and after (smem reused).
//   A: !TRANS_A -> A[m*LDA + k] (M x K); TRANS_A -> A[k*LDA + m] (K x M stored).
//   B: !TRANS_B -> B[k*LDB + n] (K x N); TRANS_B -> B[n*LDB + k] (N x K stored).
//   A and B must be 16-byte aligned; LDA/LDB multiples of 8 elements so every
//   ldmatrix row address is 16-byte aligned.  Pad rows (LD = inner + 8) to
//   avoid shared-memory bank conflicts; no swizzled layouts are supported.
//   Warp (wm, wn) computes the WM x WN sub-tile at (wm*WM, wn*WN); see
//   acc_coord for where each acc element lives.  TID_BASE: the first calling
//   thread (threads TID_BASE .. call it, counted from there): a warpgroup
//   region of the explicit sm_90a path runs its gemm on threads 128*g ...
template <typename T, int M, int N, int K, int WARP_M, int WARP_N, bool TRANS_A, bool TRANS_B,
          int LDA, int LDB, int TID_BASE = 0>
__device__ __forceinline__ void gemm_ss(const T* A, const T* B, float* acc) {
  static_assert(detail::mma_dtype_ok<T>::value, "gemm_ss: T must be half or __nv_bfloat16");
  static_assert(WARP_M > 0 && WARP_N > 0, "gemm_ss: WARP_M/WARP_N must be positive");
  static_assert(M % (16 * WARP_M) == 0, "gemm_ss: M must be a multiple of 16*WARP_M");
  static_assert(N % (8 * WARP_N) == 0, "gemm_ss: N must be a multiple of 8*WARP_N");
  static_assert(K % 16 == 0, "gemm_ss: K must be a multiple of 16");
  static_assert(LDA % 8 == 0 && LDB % 8 == 0, "gemm_ss: LDA/LDB must be multiples of 8 elements");
  static_assert(LDA >= (TRANS_A ? M : K), "gemm_ss: LDA smaller than the row length of A");
  static_assert(LDB >= (TRANS_B ? K : N), "gemm_ss: LDB smaller than the row length of B");
  constexpr int WM = M / WARP_M, WN = N / WARP_N;
  constexpr int MT = WM / 16, NT = WN / 8;
  const int tid = static_cast<int>(threadIdx.x) - TID_BASE;
  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WARP_N, wn = warp % WARP_N;

#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t af[MT][4];
    uint32_t bf[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // .trans exactly when A's memory rows run along k (TRANS_A), see above.
      detail::ldsm_x4<TRANS_A>(af[mt][0], af[mt][1], af[mt][2], af[mt][3],
                               A + detail::gemm_a_addr<M, K, WARP_M, TRANS_A, LDA>(wm, lane, ks, mt));
    }
#pragma unroll
    for (int nt = 0; nt + 1 < NT; nt += 2) {
      // .trans exactly when B's memory rows run along k (!TRANS_B).
      detail::ldsm_x4<!TRANS_B>(
          bf[nt][0], bf[nt][1], bf[nt + 1][0], bf[nt + 1][1],
          B + detail::gemm_b_addr<N, K, WARP_N, TRANS_B, LDB, true>(wn, lane, ks, nt));
    }
    if constexpr (NT % 2 == 1) {
      detail::ldsm_x2<!TRANS_B>(
          bf[NT - 1][0], bf[NT - 1][1],
          B + detail::gemm_b_addr<N, K, WARP_N, TRANS_B, LDB, false>(wn, lane, ks, NT - 1));
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        detail::mma_16816<T>(acc + (mt * NT + nt) * 4, af[mt], bf[nt]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// 2b. Tensor-core GEMM with A in registers (mma.sync m16n8k16, B via ldmatrix)
// ---------------------------------------------------------------------------
//
// A is a fragment in the accumulator layout of acc_coord<M, K, WARPS, 1> (one
// warp column: warp w holds rows w*M/WARPS .. of all K columns), 16-bit.  In
// that layout the 4 values of two adjacent n8 tiles (2ks, 2ks+1) of one m16
// tile are exactly the m16k16 A operand of k step ks:
//   a0 = A[g][2t..2t+1]     = tile 2ks,   r 0,1      a1 = A[g+8][2t..]   = tile 2ks,   r 2,3
//   a2 = A[g][2t+8..2t+9]   = tile 2ks+1, r 0,1      a3 = A[g+8][2t+8..] = tile 2ks+1, r 2,3
// so the cast copy of an accumulator (FlashAttention's P = softmax(S)) feeds
// the next mma without a trip through shared memory.

namespace detail {

// Index into the A fragment of the low element of register j (0..3) of the
// A operand for m tile mt, k step ks; the high element follows it.
template <int K>
__host__ __device__ __forceinline__ int gemm_rs_a_index(int mt, int ks, int j) {
  return ((mt * (K / 8) + 2 * ks + (j >> 1)) * 4) + 2 * (j & 1);
}

__device__ __forceinline__ uint32_t pack2(half lo, half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) |
         (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}
__device__ __forceinline__ uint32_t pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

}  // namespace detail

// acc += A @ op(B), A (M x K) in registers as described above, B in shared
// memory as for gemm_ss (!TRANS_B: B[k*LDB + n]; TRANS_B: B[n*LDB + k]);
// acc in the layout acc_coord<M, N, WARPS, 1>.  Threads TID_BASE ..
// TID_BASE + 32*WARPS - 1 call it together; no barrier inside.
template <typename T, int M, int N, int K, int WARPS, bool TRANS_B, int LDB, int TID_BASE = 0>
__device__ __forceinline__ void gemm_rs(const T* a, const T* B, float* acc) {
  static_assert(detail::mma_dtype_ok<T>::value, "gemm_rs: T must be half or __nv_bfloat16");
  static_assert(M % (16 * WARPS) == 0, "gemm_rs: M must be a multiple of 16*WARPS");
  static_assert(N % 8 == 0 && K % 16 == 0, "gemm_rs: N must be a multiple of 8, K of 16");
  static_assert(LDB % 8 == 0 && LDB >= (TRANS_B ? K : N), "gemm_rs: bad LDB");
  constexpr int MT = M / WARPS / 16, NT = N / 8;
  const int lane = (static_cast<int>(threadIdx.x) - TID_BASE) & 31;

#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t bf[NT][2];
#pragma unroll
    for (int nt = 0; nt + 1 < NT; nt += 2) {
      detail::ldsm_x4<!TRANS_B>(bf[nt][0], bf[nt][1], bf[nt + 1][0], bf[nt + 1][1],
                                B + detail::gemm_b_addr<N, K, 1, TRANS_B, LDB, true>(0, lane, ks, nt));
    }
    if constexpr (NT % 2 == 1) {
      detail::ldsm_x2<!TRANS_B>(
          bf[NT - 1][0], bf[NT - 1][1],
          B + detail::gemm_b_addr<N, K, 1, TRANS_B, LDB, false>(0, lane, ks, NT - 1));
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t af[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = detail::gemm_rs_a_index<K>(mt, ks, j);
        af[j] = detail::pack2(a[i], a[i + 1]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        detail::mma_16816<T>(acc + (mt * NT + nt) * 4, af, bf[nt]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// 3. SIMT GEMM fallback (any dtypes, any shape)
// ---------------------------------------------------------------------------

namespace detail {

template <typename To, typename From>
struct cvt {
  __device__ __forceinline__ static To f(From x) { return static_cast<To>(x); }
};
template <>
struct cvt<float, half> {
  __device__ __forceinline__ static float f(half x) { return __half2float(x); }
};
template <>
struct cvt<float, __nv_bfloat16> {
  __device__ __forceinline__ static float f(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <>
struct cvt<half, half> {
  __device__ __forceinline__ static half f(half x) { return x; }
};
template <>
struct cvt<__nv_bfloat16, __nv_bfloat16> {
  __device__ __forceinline__ static __nv_bfloat16 f(__nv_bfloat16 x) { return x; }
};

__device__ __forceinline__ float op_add(float a, float b) { return a + b; }
__device__ __forceinline__ double op_add(double a, double b) { return a + b; }
__device__ __forceinline__ int op_add(int a, int b) { return a + b; }
__device__ __forceinline__ unsigned op_add(unsigned a, unsigned b) { return a + b; }
__device__ __forceinline__ half op_add(half a, half b) { return __hadd(a, b); }
__device__ __forceinline__ __nv_bfloat16 op_add(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
template <typename T>
__device__ __forceinline__ T op_add(T a, T b) { return a + b; }

__device__ __forceinline__ float op_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double op_mul(double a, double b) { return a * b; }
__device__ __forceinline__ half op_mul(half a, half b) { return __hmul(a, b); }
__device__ __forceinline__ __nv_bfloat16 op_mul(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
template <typename T>
__device__ __forceinline__ T op_mul(T a, T b) { return a * b; }

__device__ __forceinline__ float op_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double op_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ int op_max(int a, int b) { return max(a, b); }
__device__ __forceinline__ unsigned op_max(unsigned a, unsigned b) { return max(a, b); }
__device__ __forceinline__ half op_max(half a, half b) { return __hmax(a, b); }
__device__ __forceinline__ __nv_bfloat16 op_max(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmax(a, b); }
template <typename T>
__device__ __forceinline__ T op_max(T a, T b) { return a < b ? b : a; }

__device__ __forceinline__ float op_min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double op_min(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ int op_min(int a, int b) { return min(a, b); }
__device__ __forceinline__ unsigned op_min(unsigned a, unsigned b) { return min(a, b); }
__device__ __forceinline__ half op_min(half a, half b) { return __hmin(a, b); }
__device__ __forceinline__ __nv_bfloat16 op_min(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmin(a, b); }
template <typename T>
__device__ __forceinline__ T op_min(T a, T b) { return b < a ? b : a; }

}  // namespace detail

// dst = src as half: a ROWS x COLS tile of 8-bit floats (FP8: __nv_fp8_e4m3 or
// __nv_fp8_e5m2, passed as its bytes; row stride LDS) into half (row stride LDD), spread over
// THREADS threads counted from TID_BASE. Exact: every e4m3 and e5m2 value is a half. How the
// generic path feeds float8 tiles to gemm_ss (mma.sync has no float8 form before sm_89, and
// wgmma's is issue 12's). No barrier inside.
template <typename FP8, int ROWS, int COLS, int LDS, int LDD, int THREADS, int TID_BASE = 0>
__device__ __forceinline__ void fp8_tile_to_half(const void* src, half* dst) {
  static_assert(sizeof(FP8) == 1, "fp8_tile_to_half: FP8 must be an 8-bit float");
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const int t = static_cast<int>(threadIdx.x) - TID_BASE;
#pragma unroll 4
  for (int e = t; e < ROWS * COLS; e += THREADS) {
    const int r = e / COLS, c = e % COLS;
    FP8 v;
    v.__x = s[r * LDS + c];
    dst[r * LDD + c] = __float2half(static_cast<float>(v));
  }
}

// dst = src converted: a ROWS x COLS tile of 8-bit floats (FP8: __nv_fp8_e4m3 or
// __nv_fp8_e5m2, passed as its bytes; row stride LDS) into T (half or __nv_bfloat16; row
// stride LDD), four elements per step of a thread (one 32-bit load, two paired conversions,
// two 32-bit stores), over THREADS threads counted from TID_BASE. Exact: every e4m3 and e5m2
// value is a half and a bfloat16. No barrier inside.
template <typename FP8, typename T, int ROWS, int COLS, int LDS, int LDD, int THREADS,
          int TID_BASE = 0>
__device__ __forceinline__ void fp8_tile_convert(const void* src, T* dst) {
  static_assert(sizeof(FP8) == 1 && sizeof(T) == 2, "fp8_tile_convert: 8-bit to 16-bit");
  static_assert(COLS % 4 == 0 && LDS % 4 == 0 && LDD % 2 == 0,
                "fp8_tile_convert: rows of whole 4-element groups");
  constexpr __nv_fp8_interpretation_t kind =
      detail::is_same<FP8, __nv_fp8_e5m2>::value ? __NV_E5M2 : __NV_E4M3;
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const int t = static_cast<int>(threadIdx.x) - TID_BASE;
  constexpr int kGroups = COLS / 4;
#pragma unroll 4
  for (int e = t; e < ROWS * kGroups; e += THREADS) {
    const int r = e / kGroups, c = (e % kGroups) * 4;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(s + r * LDS + c);
    const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), kind));
    const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(w >> 16), kind));
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + r * LDD + c);
    if constexpr (!detail::is_same<T, __nv_bfloat16>::value) {
      d[0] = *reinterpret_cast<const uint32_t*>(&lo);
      d[1] = *reinterpret_cast<const uint32_t*>(&hi);
    } else {
      const __nv_bfloat162 blo = __float22bfloat162_rn(__half22float2(lo));
      const __nv_bfloat162 bhi = __float22bfloat162_rn(__half22float2(hi));
      d[0] = *reinterpret_cast<const uint32_t*>(&blo);
      d[1] = *reinterpret_cast<const uint32_t*>(&bhi);
    }
  }
}

// Number of accumulators per thread for gemm_ss_simt: ceil(M*N / THREADS).
template <int M, int N, int THREADS>
__host__ __device__ constexpr int simt_acc_size() {
  return (M * N + THREADS - 1) / THREADS;
}

// acc += op(A) @ op(B) on CUDA cores, for dtypes / shapes mma cannot take
// (float, int8 -> int32, odd shapes, ...).  Same A/B layouts as gemm_ss (any
// LDA/LDB >= the row length; no alignment needs beyond the element type).
// Layout is "cyclic": thread t = threadIdx.x (< THREADS) owns elements
// e = t + i*THREADS, i in [0, ceil(M*N/THREADS)), e < M*N, at
// row = e / N, col = e % N, in acc[i].  Consecutive threads take consecutive
// columns, so B reads are contiguous across a warp and A reads broadcast.
// Each product is computed in TC (operands converted to TC first), then
// added into acc[i] in k order.  No barrier inside.  TID_BASE as for gemm_ss.
template <typename TA, typename TB, typename TC, int M, int N, int K, int THREADS, bool TRANS_A,
          bool TRANS_B, int LDA, int LDB, int TID_BASE = 0>
__device__ __forceinline__ void gemm_ss_simt(const TA* A, const TB* B, TC* acc) {
  static_assert(M > 0 && N > 0 && K > 0 && THREADS > 0, "gemm_ss_simt: bad shape");
  static_assert(LDA >= (TRANS_A ? M : K), "gemm_ss_simt: LDA smaller than the row length of A");
  static_assert(LDB >= (TRANS_B ? K : N), "gemm_ss_simt: LDB smaller than the row length of B");
  constexpr int ITERS = (M * N + THREADS - 1) / THREADS;
  const int t = static_cast<int>(threadIdx.x) - TID_BASE;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = t + i * THREADS;
    if (e < M * N) {
      const int row = e / N, col = e % N;
      TC c = acc[i];
#pragma unroll 8
      for (int k = 0; k < K; ++k) {
        const TA a = TRANS_A ? A[k * LDA + row] : A[row * LDA + k];
        const TB b = TRANS_B ? B[col * LDB + k] : B[k * LDB + col];
        c = detail::op_add(c, detail::op_mul(detail::cvt<TC, TA>::f(a), detail::cvt<TC, TB>::f(b)));
      }
      acc[i] = c;
    }
  }
}

// gemm_ss_simt over operands TVM passes as bytes: float8 tiles are `unsigned char` in the
// code TVM writes for archs without float8 instructions (below sm_89), while TA / TB name the
// float8 type the bytes hold (__nv_fp8_e4m3 / __nv_fp8_e5m2, whose conversions cuda_fp8.h
// emulates there).
template <typename TA, typename TB, typename TC, int M, int N, int K, int THREADS, bool TRANS_A,
          bool TRANS_B, int LDA, int LDB, int TID_BASE = 0>
__device__ __forceinline__ void gemm_ss_simt_bytes(const void* A, const void* B, TC* acc) {
  static_assert(sizeof(TA) == 1 && sizeof(TB) == 1, "gemm_ss_simt_bytes: 8-bit operands only");
  gemm_ss_simt<TA, TB, TC, M, N, K, THREADS, TRANS_A, TRANS_B, LDA, LDB, TID_BASE>(
      static_cast<const TA*>(A), static_cast<const TB*>(B), acc);
}

// ---------------------------------------------------------------------------
// 4. Warp helpers
// ---------------------------------------------------------------------------

// v of lane (lane ^ mask) within groups of `width` lanes (width a power of two
// <= 32).  Full-warp mask: all 32 lanes must execute the call.  Works for
// every type __shfl_xor_sync has an overload for (int, unsigned, float,
// double, long long, half, half2, __nv_bfloat16, ...).
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int mask, int width = 32) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}

// Butterfly (xor) reductions over aligned groups of `width` lanes (power of
// two, 1..32): afterwards every lane of the group holds the group's result,
// so no broadcast is needed.  All 32 lanes must call.  With xor butterflies
// every lane of a group adds the same pairs of partial results (only the
// operand order of each commutative add differs), so all lanes get
// bit-identical results even for floating-point sums.
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v, int width = 32) {
#pragma unroll
  for (int off = width >> 1; off > 0; off >>= 1) v = detail::op_add(v, shfl_xor(v, off));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_reduce_max(T v, int width = 32) {
#pragma unroll
  for (int off = width >> 1; off > 0; off >>= 1) v = detail::op_max(v, shfl_xor(v, off));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_reduce_min(T v, int width = 32) {
#pragma unroll
  for (int off = width >> 1; off > 0; off >>= 1) v = detail::op_min(v, shfl_xor(v, off));
  return v;
}

// -- accumulator fragments (the mma.m16n8 C layout) to memory ---------------------------

namespace detail {
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ half from_f32<half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <typename T>
struct pair_of;
template <>
struct pair_of<float> {
  using type = float2;
  __device__ __forceinline__ static float2 make(float a, float b) { return make_float2(a, b); }
};
template <>
struct pair_of<half> {
  using type = half2;
  __device__ __forceinline__ static half2 make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct pair_of<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ __forceinline__ static __nv_bfloat162 make(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};

// Reinterpret two packed 16-bit values as one 32-bit word (shuffles move words).
template <typename P>
__device__ __forceinline__ uint32_t as_u32(P v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (lane % 4 = q):
// on entry v[c] is the word of column c, on exit v[p] is lane p's former v[q].
// Two butterfly steps; step b swaps index bit b between lane and slot for the
// words whose bit b differs, so no register is indexed at run time.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // bit 0: slots (2k, 2k + 1)
    const bool odd = q & 1;
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * k] : v[2 * k + 1], 1);
    if (odd) v[2 * k] = got; else v[2 * k + 1] = got;
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // bit 1: slots (k, k + 2)
    const bool hi = q & 2;
    const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? v[k] : v[k + 2], 2);
    if (hi) v[k] = got; else v[k + 2] = got;
  }
}
}  // namespace detail


// A warp's 16 x N slab of an accumulator fragment in the mma.m16n8 C layout (the layout of
// one m16 row of gemm_ss's tiles, and of each warp's 16 rows of a wgmma m64nN accumulator):
// lane l holds d[i], i in [0, N/2), at row (l / 4) + 8 * ((i / 2) % 2), column 8 * (i / 4) +
// 2 * (l % 4) + i % 2. Writes it, converted to T, to C[row0 + r, col0 + c] (row-major,
// leading dimension ldc, in elements), skipping rows >= m and columns >= n. Every lane of the
// warp must call it (it shuffles within quads).
//
// T: half, bfloat16 or float. For 16-bit T with C, ldc and col0 16-byte aligned (multiples of
// 8 elements) and N a multiple of 32, a quad transposes its 4 x 4 words so that each lane
// owns 8 consecutive columns and writes them with one 16-byte store (a warp's store covers 8
// rows x 64 contiguous bytes instead of 8 rows x 16 bytes). Otherwise pairs of columns go out
// as one store (4 bytes, or 8 for float) where so aligned, else element by element. S: the
// fragment's element type, float (an accumulator) or a 16-bit type (a fragment cast from one
// in the same layout), converted through float.
template <typename T, int N, typename S = float>
__device__ __forceinline__ void store_acc_warp(const S* d, T* C, int64_t ldc, int row0,
                                               int col0, int m, int n) {
  using P = detail::pair_of<T>;
  const int lane = threadIdx.x & 31;
  const int q = lane & 3;
  const int row_base = row0 + (lane >> 2);
  const bool vec16 = sizeof(T) == 2 && N % 32 == 0 && ((ldc | col0) & 7) == 0 &&
                     (reinterpret_cast<uint64_t>(C) & 15) == 0;  // whole groups of 32 columns
  if constexpr (sizeof(T) == 2) if (vec16) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int gr = row_base + 8 * half;
      T* crow = C + static_cast<int64_t>(gr) * ldc;
#pragma unroll
      for (int g = 0; g < N / 32; ++g) {  // 4 blocks of 8 columns per group
        uint32_t v[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = 4 * (4 * g + c) + 2 * half;
          v[c] = detail::as_u32(
              P::make(static_cast<float>(d[i]), static_cast<float>(d[i + 1])));
        }
        detail::quad_transpose(v, q);
        const int gc = col0 + 8 * (4 * g + q);
        if (gr >= m) continue;
        if (gc + 8 <= n) {
          *reinterpret_cast<uint4*>(crow + gc) = make_uint4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (gc + e < n) {
              const uint32_t w = v[e >> 1];
              const unsigned short bits = static_cast<unsigned short>(e & 1 ? w >> 16 : w);
              crow[gc + e] = *reinterpret_cast<const T*>(&bits);
            }
          }
        }
      }
    }
    return;
  }
  const bool paired = ((ldc | col0) & 1) == 0 &&
                      (reinterpret_cast<uint64_t>(C) & (2 * sizeof(T) - 1)) == 0;
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int gr = row_base + 8 * ((i >> 1) & 1), gc = col0 + 8 * (i >> 2) + 2 * q;
    if (gr >= m) continue;
    T* p = C + static_cast<int64_t>(gr) * ldc + gc;
    if (paired && gc + 1 < n) {
      *reinterpret_cast<typename P::type*>(p) =
          P::make(static_cast<float>(d[i]), static_cast<float>(d[i + 1]));
    } else {
      if (gc < n) p[0] = detail::from_f32<T>(static_cast<float>(d[i]));
      if (gc + 1 < n) p[1] = detail::from_f32<T>(static_cast<float>(d[i + 1]));
    }
  }
}

// gemm_ss's accumulator (acc_coord's layout: WARP_M x WARP_N warps, each WM x WN in m16n8
// tiles; MmaLayout in targets/cuda/layouts.py), or a 16-bit fragment cast from one in that
// layout, to C[row0 + r, col0 + c], rows < m, columns < n: each warp's tiles, 16 rows at a
// time, by store_acc_warp. `warp`: the calling thread's warp among the fragment's threads;
// those past WARP_M * WARP_N warps hold none of it.
template <int M, int N, int WARP_M, int WARP_N>
struct MmaTile {
  static constexpr int WM = M / WARP_M, WN = N / WARP_N;
  static_assert(WM % 16 == 0 && WN % 8 == 0, "MmaTile: whole m16n8 tiles per warp");
  template <typename TC, typename S>
  __device__ __forceinline__ static void store(const S* acc, TC* C, int64_t ldc, int row0,
                                               int col0, int m, int n, int warp) {
    if (warp >= WARP_M * WARP_N) return;
    const int wm = warp / WARP_N, wn = warp % WARP_N;
#pragma unroll
    for (int mt = 0; mt < WM / 16; ++mt)
      store_acc_warp<TC, WN, S>(acc + mt * (WN / 2), C, ldc, row0 + wm * WM + 16 * mt,
                                col0 + wn * WN, m, n);
  }
};

// T.exp2 of a float32 on CUDA: the MUFU's 2^x (ex2.approx.ftz: about 2 ulp, results
// below 2^-126 flushed to zero), without exp2f's rescaling for subnormal results, which
// costs a compare and two multiplies per element in softmax-heavy kernels.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace tiled

#include "tiled_atomic.h"
