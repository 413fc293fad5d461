// tiled_sm90.h -- sm_90a (Hopper) device primitives for the tiled CUDA backend.
//
// Companion of tiled_cuda.h (the sm_80 path).  Everything lives in namespace
// `tiled::sm90` and is written from the PTX ISA (8.0+):
//   1. mbarrier: init / arrive / arrive.expect_tx / try_wait.parity loop, fences
//   2. TMA (cp.async.bulk.tensor) 2-D tile load completing on an mbarrier,
//      tensormap prefetch, 2-D tile store with bulk commit / wait groups
//   3. wgmma: fence / commit_group / wait_group, shared-memory matrix
//      descriptors for the 128-byte swizzle, mma_async m64nNk16 f16/bf16 -> f32
//      with both operands in shared memory
//   4. setmaxnreg inc / dec (warp specialisation)
//   5. epilogue: m64nN f32 accumulator fragment -> f16/bf16 global, bounds-checked
//      (each warp's 16 rows by tiled_cuda.h's store_acc_warp)
//
// The whole body is compiled only for sm_90a device passes (the `a` features:
// wgmma and setmaxnreg do not exist on plain sm_90), so including this header
// in an sm_80 build, or in the host pass, declares nothing and costs nothing.
// Guard uses of it the same way (`#if TILED_SM90A_ENABLED`).
//
// Conventions the compiler relies on (see the descriptor section for details):
//   * Shared-memory tiles fed to wgmma are written by TMA with
//     CU_TENSOR_MAP_SWIZZLE_128B, box inner extent exactly 128 bytes
//     (64 f16/bf16 elements), and start 1024-byte aligned.
//   * A is K-major (row-major MxK in global); B may be K-major (NxK in
//     global, "col-major B") or MN-major (row-major KxN in global).
//   * Accumulator fragment layout of one warpgroup for m64nN is fixed by PTX;
//     acc_coord() below spells it out.
#ifndef TILED_SM90_H_
#define TILED_SM90_H_

// The sm_80 header: its types and its accumulator stores (store_acc_warp), which the
// epilogue below writes each warp's rows with.
#include "tiled_cuda.h"

// nvcc defines __CUDA_ARCH_FEAT_SM90_ALL only for compute_90a device passes.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TILED_SM90A_ENABLED 1
#else
#define TILED_SM90A_ENABLED 0
#endif

namespace tiled {
namespace sm90 {
// Opaque 128-byte CUtensorMap image (cuTensorMapEncodeTiled output).  Declared
// for every pass so kernel signatures that take one compile everywhere.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};
}  // namespace sm90
}  // namespace tiled

#if TILED_SM90A_ENABLED

namespace tiled {
namespace sm90 {

// 32-bit shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------
// 1. mbarrier (64-bit shared-memory barrier objects with transaction counts)
// ---------------------------------------------------------------------------
// Phase protocol used throughout: a barrier completes a phase when `count`
// arrivals AND all expected transaction bytes have landed.  Waiters track the
// phase parity they wait for: 0 for the first use, flipped every time a ring
// of stages wraps.  A fresh barrier counts as having just completed phase
// parity 1, so waiting for parity 1 on it returns at once (producers use this
// to skip the wait on the first pass over an "empty" ring).

// Initialise one barrier for `count` arrivals.  One thread only; follow with
// fence_barrier_init() and a block-wide barrier before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes mbarrier.init visible to the async proxy (TMA complete_tx) and to the
// other threads of the cluster.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory accesses before later
// async-proxy accesses (wgmma operand reads, TMA stores from shared memory).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Plain arrival (release semantics at CTA scope).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrival that also raises the phase's expected transaction count by
// `tx_bytes`; the phase completes only once that many bytes were reported by
// complete_tx (TMA).  Issue it before or after the matching copies: the count
// may go transiently negative within a phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(tx_bytes)
               : "memory");
}

// One probe: true once the phase with parity `parity` has completed.  The
// hardware may suspend the thread for a bounded time inside the instruction.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Block until the phase with parity `parity` has completed (acquire at CTA
// scope: data written by TMA for that phase is visible afterwards).
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// ---------------------------------------------------------------------------
// 2. TMA: bulk tensor copies described by a CUtensorMap
// ---------------------------------------------------------------------------
// The tensor map (128 bytes, built on the host by cuTensorMapEncodeTiled) must
// live in param / const / global memory; pass it as a
// `const __grid_constant__ TensorMap` kernel parameter and hand its address
// here.  Coordinates are in elements, innermost (contiguous) dimension first.
// Out-of-bounds box elements are zero-filled on load (OOB_FILL_NONE) and
// still count toward the transaction bytes; on store they are skipped.
// TensorMap itself is declared above the sm_90a guard.
__device__ __forceinline__ void tma_prefetch_desc(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Load the box at (c0, c1) into shared `dst` (1024-byte aligned for the
// 128-byte swizzle) and report its bytes to `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// The same for a tensor map of any rank (2 to 5), with the untyped pointers the compiler's
// calls pass: the box at coordinates (innermost first) into shared `dst`, completing on
// `bar`; one overload per rank.
__device__ __forceinline__ void tma_load(void* dst, const void* map, void* bar, int32_t c0,
                                         int32_t c1) {
  tma_load_2d(dst, static_cast<const TensorMap*>(map), static_cast<uint64_t*>(bar), c0, c1);
}
__device__ __forceinline__ void tma_load(void* dst, const void* map, void* bar, int32_t c0,
                                         int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const void* map, void* bar, int32_t c0,
                                         int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const void* map, void* bar, int32_t c0,
                                         int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "r"(c4)
      : "memory");
}

// Store the shared box `src` to (c0, c1).  Writers of `src` must have run
// fence_proxy_async_shared() and synchronised before one thread issues this.
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, const void* src, int32_t c0,
                                             int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until at most N committed store groups are still reading shared memory
// (after which their source buffers may be overwritten).
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Wait until at most N committed store groups are incomplete (writes done).
template <int N>
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------
// 3. wgmma
// ---------------------------------------------------------------------------
// Shared-memory matrix descriptor (64 bits), PTX ISA "Matrix Descriptor Format":
//   bits  0-13  start address >> 4        (shared-state-space byte address)
//   bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 32-45  stride-dimension byte offset (SBO) >> 4
//   bits 49-51  matrix base offset (0: tiles start 1024-byte aligned)
//   bits 62-63  swizzle: 0 none, 1 128B, 2 64B, 3 32B
//
// The 128-byte swizzle (TMA CU_TENSOR_MAP_SWIZZLE_128B) stores a tile as rows
// of 128 bytes (64 16-bit elements); within each 1024-byte group of 8 rows the
// 16-byte chunk j of row r sits at chunk j ^ (r % 8).  The hardware applies
// the XOR on address bits [4:6] ^ [7:9], which is why tiles must start
// 1024-byte aligned and why stepping the start address by a multiple of 32
// bytes inside a row selects the next k16 slice without touching LBO/SBO.
//
// K-major operand (A: MxK row-major; B: NxK row-major), tile [rows][64] with
// a 128-byte row per M/N index, 8-row groups 1024 bytes apart:
//   SBO = 1024 (next 8 rows of M/N), LBO unused (one k16 slice lies inside
//   the 128-byte row; encoded as 1 by convention).  k16 slice kk starts at
//   base + 32*kk bytes.
// MN-major operand (B: KxN row-major), tile = N/64 sub-tiles, each
// [64 K rows][64 N] with a 128-byte row per K index (one TMA box each):
//   LBO = byte distance between 64-wide N sub-tiles (64*128 = 8192 for a
//   64-deep K box), SBO = 1024 (next 8 K rows).  k16 slice kk starts at
//   base + 16*128*kk = 2048*kk bytes.
enum class Swizzle : uint32_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

__device__ __forceinline__ uint64_t make_smem_desc(const void* tile, uint32_t lbo_bytes,
                                                   uint32_t sbo_bytes,
                                                   Swizzle swizzle = Swizzle::k128B) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3FFFFull) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) |
         (static_cast<uint64_t>(swizzle) << 62);
}

// Descriptor of a K-major, 128B-swizzled operand tile (see above).
__device__ __forceinline__ uint64_t desc_kmajor_sw128(const void* tile) {
  return make_smem_desc(tile, 16, 1024);
}

// Descriptor of an MN-major, 128B-swizzled operand tile whose 64-wide MN
// sub-tiles lie `mn_stride_bytes` apart (= 128 * K rows per box).
__device__ __forceinline__ uint64_t desc_mnmajor_sw128(const void* tile,
                                                       uint32_t mn_stride_bytes) {
  return make_smem_desc(tile, mn_stride_bytes, 1024);
}

// The descriptor of `bytes` (a multiple of 16) past the tile `desc` describes: the start
// field is the address / 16 in the low word, (a + bytes) / 16 = a / 16 + bytes / 16 for any
// a, and it cannot carry out of its 14 bits below 256 KiB, so one 32-bit add gives the
// value make_smem_desc would (the high word, the stride byte offset and the swizzle, is
// the tile's). A loop of wgmmas written this way takes one add per descriptor, where
// make_smem_desc of each address takes a mask, a shift and two ors: the compiler cannot
// fold a constant through `(addr + c) >> 4` without knowing addr's low bits.
__device__ __forceinline__ uint64_t desc_at(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Make prior register / shared accesses of the warpgroup visible to the next
// wgmma (required before the first wgmma and whenever the accumulator
// registers were touched by ordinary instructions).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Wait until at most N committed wgmma groups are pending.  Accumulators
// (and the shared tiles they read) of the completed groups may be used after.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator reads/writes across wgmma
// boundaries: ties each register to an empty asm.
template <int NREG>
__device__ __forceinline__ void fence_operands(float (&d)[NREG]) {
#pragma unroll
  for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N] for one warpgroup, both operands in
// shared memory.  T: half or __nv_bfloat16.  SCALE_A / SCALE_B: 1 or -1
// (negate an operand).  TRANS_A / TRANS_B: 0 = K-major, 1 = MN-major
// (transposed).  scale_d: 0 -> D = A*B (accumulator ignored), else D += A*B.
// d holds N/2 f32 per thread in the layout of acc_coord().
template <typename T, int N, int SCALE_A, int SCALE_B, int TRANS_A, int TRANS_B>
struct WgmmaSS;

// The operands every m64nN wgmma shares, kept defined for tiled_sm90_attn.h's register-A
// form: the N/2 accumulator registers d[0..N/2) as "+f" operands (TILED_WGMMA_D_<N/2>), and
// their placeholders %0..%(N/2-1) in the instruction text (TILED_WGMMA_REGS_<N/2>).
// Accumulator operands, constraint `c`: "+f" for float accumulators, "+r" for int32.
#define TILED_WGMMA_OPS8(c, d, i)                                                               \
  c(d[(i) + 0]), c(d[(i) + 1]), c(d[(i) + 2]), c(d[(i) + 3]), c(d[(i) + 4]), c(d[(i) + 5]),     \
  c(d[(i) + 6]), c(d[(i) + 7])
#define TILED_WGMMA_OPS32(c, d, i)                                                              \
  TILED_WGMMA_OPS8(c, d, (i) + 0), TILED_WGMMA_OPS8(c, d, (i) + 8),                             \
  TILED_WGMMA_OPS8(c, d, (i) + 16), TILED_WGMMA_OPS8(c, d, (i) + 24)
#define TILED_WGMMA_D32(d, i) TILED_WGMMA_OPS32("+f", d, i)
#define TILED_WGMMA_D_8(d) TILED_WGMMA_OPS8("+f", d, 0)
#define TILED_WGMMA_D_16(d) TILED_WGMMA_OPS8("+f", d, 0), TILED_WGMMA_OPS8("+f", d, 8)
#define TILED_WGMMA_D_32(d) TILED_WGMMA_D32(d, 0)
#define TILED_WGMMA_D16(d, i) TILED_WGMMA_OPS8("+f", d, i), TILED_WGMMA_OPS8("+f", d, (i) + 8)
#define TILED_WGMMA_D_48(d) TILED_WGMMA_D32(d, 0), TILED_WGMMA_D16(d, 32)
#define TILED_WGMMA_D_64(d) TILED_WGMMA_D32(d, 0), TILED_WGMMA_D32(d, 32)
#define TILED_WGMMA_D_80(d) TILED_WGMMA_D_64(d), TILED_WGMMA_D16(d, 64)
#define TILED_WGMMA_D_96(d) TILED_WGMMA_D_64(d), TILED_WGMMA_D32(d, 64)
#define TILED_WGMMA_D_112(d) TILED_WGMMA_D_96(d), TILED_WGMMA_D16(d, 96)
#define TILED_WGMMA_D_128(d) TILED_WGMMA_D_64(d), TILED_WGMMA_D32(d, 64), TILED_WGMMA_D32(d, 96)
#define TILED_WGMMA_REGS_8 "%0,%1,%2,%3,%4,%5,%6,%7"
#define TILED_WGMMA_REGS_16 TILED_WGMMA_REGS_8 ",%8,%9,%10,%11,%12,%13,%14,%15"
#define TILED_WGMMA_REGS_32                                                                     \
  TILED_WGMMA_REGS_16                                                                           \
  ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define TILED_WGMMA_REGS_48 TILED_WGMMA_REGS_32                                                 \
  ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define TILED_WGMMA_REGS_64 TILED_WGMMA_REGS_48                                                 \
  ",%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define TILED_WGMMA_REGS_80 TILED_WGMMA_REGS_64                                                 \
  ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
#define TILED_WGMMA_REGS_96 TILED_WGMMA_REGS_80                                                 \
  ",%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define TILED_WGMMA_REGS_112 TILED_WGMMA_REGS_96                                                \
  ",%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111"
#define TILED_WGMMA_REGS_128 TILED_WGMMA_REGS_112                                               \
  ",%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

// The instruction text of an m64nNk16 wgmma with a predicate from operand PRED (scale-d)
// and the operands after the accumulators spelled by TAIL.
#define TILED_WGMMA_TEXT(TY, N, NREG, PRED, TAIL)                                               \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                             \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {"                              \
  TILED_WGMMA_REGS_##NREG "}, " TAIL ";\n}\n"

// One WgmmaSS specialization: NREG = N / 2 accumulator registers, then the operands
// desc_a (%NREG), desc_b, scale_d, SCALE_A, SCALE_B, TRANS_A, TRANS_B, whose placeholders
// the instantiation spells (PRED: scale_d's; TAIL: the rest).
#define TILED_WGMMA_SS(T, TY, N, NREG, PRED, TAIL)                                              \
template <int SCALE_A, int SCALE_B, int TRANS_A, int TRANS_B>                                   \
struct WgmmaSS<T, N, SCALE_A, SCALE_B, TRANS_A, TRANS_B> {                                      \
  __device__ __forceinline__ static void run(float (&d)[NREG], uint64_t desc_a,                 \
                                             uint64_t desc_b, uint32_t scale_d) {               \
    asm volatile(                                                                               \
        TILED_WGMMA_TEXT(TY, N, NREG, PRED, TAIL)                                               \
        : TILED_WGMMA_D_##NREG(d)                                                               \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(SCALE_A), "n"(SCALE_B), "n"(TRANS_A),     \
          "n"(TRANS_B));                                                                        \
  }                                                                                             \
};
TILED_WGMMA_SS(half, "f16", 16, 8, "%10", "%8, %9, p, %11, %12, %13, %14")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 16, 8, "%10", "%8, %9, p, %11, %12, %13, %14")
TILED_WGMMA_SS(half, "f16", 32, 16, "%18", "%16, %17, p, %19, %20, %21, %22")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 32, 16, "%18", "%16, %17, p, %19, %20, %21, %22")
TILED_WGMMA_SS(half, "f16", 64, 32, "%34", "%32, %33, p, %35, %36, %37, %38")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 64, 32, "%34", "%32, %33, p, %35, %36, %37, %38")
TILED_WGMMA_SS(half, "f16", 128, 64, "%66", "%64, %65, p, %67, %68, %69, %70")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 128, 64, "%66", "%64, %65, p, %67, %68, %69, %70")
TILED_WGMMA_SS(half, "f16", 256, 128, "%130", "%128, %129, p, %131, %132, %133, %134")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 256, 128, "%130", "%128, %129, p, %131, %132, %133, %134")
TILED_WGMMA_SS(half, "f16", 96, 48, "%50", "%48, %49, p, %51, %52, %53, %54")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 96, 48, "%50", "%48, %49, p, %51, %52, %53, %54")
TILED_WGMMA_SS(half, "f16", 160, 80, "%82", "%80, %81, p, %83, %84, %85, %86")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 160, 80, "%82", "%80, %81, p, %83, %84, %85, %86")
TILED_WGMMA_SS(half, "f16", 192, 96, "%98", "%96, %97, p, %99, %100, %101, %102")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 192, 96, "%98", "%96, %97, p, %99, %100, %101, %102")
TILED_WGMMA_SS(half, "f16", 224, 112, "%114", "%112, %113, p, %115, %116, %117, %118")
TILED_WGMMA_SS(__nv_bfloat16, "bf16", 224, 112, "%114", "%112, %113, p, %115, %116, %117, %118")
#undef TILED_WGMMA_SS


// float8 (e4m3, e5m2) and tf32 wgmma: both operands K-major (the only form PTX has for them);
// scale_d as WgmmaSS's.
template <typename T, int N>
struct WgmmaSSK;

#define TILED_WGMMA_SSK(T, TY, N, K, NREG, PRED, TAIL)                                          \
template <>                                                                                     \
struct WgmmaSSK<T, N> {                                                                         \
  __device__ __forceinline__ static void run(float (&d)[NREG], uint64_t desc_a,                 \
                                             uint64_t desc_b, uint32_t scale_d) {               \
    asm volatile(                                                                               \
        "{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                       \
        "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." TY "." TY " {"                    \
        TILED_WGMMA_REGS_##NREG "}, " TAIL ";\n}\n"                                             \
        : TILED_WGMMA_D_##NREG(d)                                                               \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                              \
  }                                                                                             \
};
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 64, 32, 32, "%34", "%32, %33, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 128, 32, 64, "%66", "%64, %65, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 256, 32, 128, "%130", "%128, %129, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 64, 32, 32, "%34", "%32, %33, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 128, 32, 64, "%66", "%64, %65, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 256, 32, 128, "%130", "%128, %129, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 64, 8, 32, "%34", "%32, %33, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 128, 8, 64, "%66", "%64, %65, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 256, 8, 128, "%130", "%128, %129, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 96, 32, 48, "%50", "%48, %49, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 96, 32, 48, "%50", "%48, %49, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 96, 8, 48, "%50", "%48, %49, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 160, 32, 80, "%82", "%80, %81, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 160, 32, 80, "%82", "%80, %81, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 160, 8, 80, "%82", "%80, %81, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 192, 32, 96, "%98", "%96, %97, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 192, 32, 96, "%98", "%96, %97, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 192, 8, 96, "%98", "%96, %97, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e4m3, "e4m3", 224, 32, 112, "%114", "%112, %113, p, 1, 1")
TILED_WGMMA_SSK(__nv_fp8_e5m2, "e5m2", 224, 32, 112, "%114", "%112, %113, p, 1, 1")
TILED_WGMMA_SSK(float, "tf32", 224, 8, 112, "%114", "%112, %113, p, 1, 1")
#undef TILED_WGMMA_SSK

// D[64 x N] (+)= A[64 x 16] * B[16 x N] for one warpgroup, A from registers: a[0..3]
// hold the thread's 8 16-bit elements of A in the accumulator layout of an m64n16 tile
// (acc_coord), two per word, B in shared memory (TRANS_B: 1 = MN-major).
template <typename T, int N, int TRANS_B>
struct WgmmaRS;

// One WgmmaRS specialization: NREG = N / 2 accumulator registers (the shared
// operand lists), then a[0..3] (%NREG..), desc_b, scale_d, TRANS_B; PRED: scale_d's
// placeholder, TAIL: the rest of the operand text.
#define TILED_WGMMA_RS(T, TY, N, NREG, PRED, TAIL)                                              \
template <int TRANS_B>                                                                          \
struct WgmmaRS<T, N, TRANS_B> {                                                                 \
  __device__ __forceinline__ static void run(float (&d)[NREG], const uint32_t* a,               \
                                             uint64_t desc_b, uint32_t scale_d) {               \
    asm volatile(                                                                               \
        TILED_WGMMA_TEXT(TY, N, NREG, PRED, TAIL)                                               \
        : TILED_WGMMA_D_##NREG(d)                                                               \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),                \
          "n"(TRANS_B));                                                                        \
  }                                                                                             \
};
TILED_WGMMA_RS(half, "f16", 16, 8, "%13", "{%8,%9,%10,%11}, %12, p, 1, 1, %14")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 16, 8, "%13", "{%8,%9,%10,%11}, %12, p, 1, 1, %14")
TILED_WGMMA_RS(half, "f16", 32, 16, "%21", "{%16,%17,%18,%19}, %20, p, 1, 1, %22")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 32, 16, "%21", "{%16,%17,%18,%19}, %20, p, 1, 1, %22")
TILED_WGMMA_RS(half, "f16", 64, 32, "%37", "{%32,%33,%34,%35}, %36, p, 1, 1, %38")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 64, 32, "%37", "{%32,%33,%34,%35}, %36, p, 1, 1, %38")
TILED_WGMMA_RS(half, "f16", 128, 64, "%69", "{%64,%65,%66,%67}, %68, p, 1, 1, %70")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 128, 64, "%69", "{%64,%65,%66,%67}, %68, p, 1, 1, %70")
TILED_WGMMA_RS(half, "f16", 256, 128, "%133", "{%128,%129,%130,%131}, %132, p, 1, 1, %134")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 256, 128, "%133",
               "{%128,%129,%130,%131}, %132, p, 1, 1, %134")
TILED_WGMMA_RS(half, "f16", 96, 48, "%53",
               "{%48,%49,%50,%51}, %52, p, 1, 1, %54")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 96, 48, "%53",
               "{%48,%49,%50,%51}, %52, p, 1, 1, %54")
TILED_WGMMA_RS(half, "f16", 160, 80, "%85",
               "{%80,%81,%82,%83}, %84, p, 1, 1, %86")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 160, 80, "%85",
               "{%80,%81,%82,%83}, %84, p, 1, 1, %86")
TILED_WGMMA_RS(half, "f16", 192, 96, "%101",
               "{%96,%97,%98,%99}, %100, p, 1, 1, %102")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 192, 96, "%101",
               "{%96,%97,%98,%99}, %100, p, 1, 1, %102")
TILED_WGMMA_RS(half, "f16", 224, 112, "%117",
               "{%112,%113,%114,%115}, %116, p, 1, 1, %118")
TILED_WGMMA_RS(__nv_bfloat16, "bf16", 224, 112, "%117",
               "{%112,%113,%114,%115}, %116, p, 1, 1, %118")
#undef TILED_WGMMA_RS

template <typename T, int N, int TRANS_A = 0, int TRANS_B = 0, int SCALE_A = 1, int SCALE_B = 1>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         uint32_t scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 96 || N == 128 || N == 160 || N == 192 ||
                    N == 224 || N == 256,
                "wgmma_ss: N must be 16, 32, 64, 96, 128, 160, 192, 224 or 256");
  WgmmaSS<T, N, SCALE_A, SCALE_B, TRANS_A, TRANS_B>::run(d, desc_a, desc_b, scale_d);
}

// ---------------------------------------------------------------------------
// 4. Register reallocation between warpgroups (warp specialisation)
// ---------------------------------------------------------------------------
// Takes effect only when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)); every warp of the warpgroup must execute
// the same one.  REGS: multiple of 8 in [24, 256].
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}

// ---------------------------------------------------------------------------
// 5. Epilogue: accumulator fragment -> global memory
// ---------------------------------------------------------------------------
// Fragment layout of m64nN f32 accumulators, thread t of the warpgroup
// (t = threadIdx.x % 128), register i in [0, N/2):
//   row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2)
//   col = 8 * (i / 4) + 2 * (t % 4) + (i % 2)
__device__ __forceinline__ void acc_coord(int t, int i, int& row, int& col) {
  row = 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1);
  col = 8 * (i >> 2) + 2 * (t & 3) + (i & 1);
}

// Write the warpgroup's 64 x N accumulator tile (acc_coord's layout), converted to T, to
// C[row0 + r, col0 + c] (row-major, leading dimension ldc, in elements); elements with row
// >= m or col >= n are skipped. All 128 threads must call it. Each warp writes its 16 rows
// with tiled_cuda.h's store_acc_warp (quad-transposed 16-byte stores for 16-bit T where
// aligned). S: float (an accumulator) or a 16-bit type (a fragment cast from one).
template <typename T, int N, typename S = float>
__device__ __forceinline__ void store_acc_global(const S (&d)[N / 2], T* C, int64_t ldc,
                                                 int row0, int col0, int m, int n) {
  ::tiled::store_acc_warp<T, N, S>(d, C, ldc, row0 + 16 * ((threadIdx.x & 127) >> 5), col0, m,
                                   n);
}

// A wgmma accumulator fragment of the per-op lowering (gemm_sm90.py: WgmmaLayout(M, N, NWG,
// WGN)) to a global tile of half, bfloat16 or float: warpgroup w holds rows [w / WGN * M /
// (NWG / WGN), ...) and columns [w % WGN * N / WGN, ...) as blocks of 64 rows by N / WGN / 2
// elements per thread (floats, or 16-bit values of a fragment cast from one), each written by
// store_acc_global. `wg`: the calling thread's warpgroup among the fragment's threads (a T.ws
// region's threads start past 0); those past the NWG warpgroups hold none of it.
template <int M, int N, int NWG, int WGN = 1>
struct WgmmaTile {
  static constexpr int kRows = M / (NWG / WGN), kCols = N / WGN;
  static_assert(kRows % 64 == 0 && N % WGN == 0, "WgmmaTile: whole m64 blocks per warpgroup");
  template <typename TC, typename S>
  __device__ __forceinline__ static void store(const S* acc, TC* C, int64_t ldc, int row0,
                                               int col0, int m, int n, int wg) {
    if (wg >= NWG) return;
#pragma unroll
    for (int h = 0; h < kRows / 64; ++h) {
      const S* part = acc + h * (kCols / 2);
      store_acc_global<TC, kCols, S>(*reinterpret_cast<const S(*)[kCols / 2]>(part), C, ldc,
                                     row0 + wg / WGN * kRows + 64 * h, col0 + wg % WGN * kCols,
                                     m, n);
    }
  }
};

__device__ __forceinline__ int grid_dim_x() { return static_cast<int>(gridDim.x); }
__device__ __forceinline__ int grid_dim_y() { return static_cast<int>(gridDim.y); }

// A barrier among the first N threads of the block only (the consumer
// warpgroups of a warp-specialized kernel; the producer never joins it).
template <int N>
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory");
}

// Two consumer warpgroups taking a walk's program blocks in turn (ws_loop.py, the option
// `alternate`): warpgroup g = threadIdx.x / 128 syncs its own N threads on named barrier
// 1 + 3g (1 is consumer_sync's, 2 and 3 the gemm turns of tiled_sm90_ops.h), and hands the
// ring to the other one through barrier 5 (to warpgroup 0) or 6 (to warpgroup 1).
template <int N>
__device__ __forceinline__ void group_sync() {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + 3 * (threadIdx.x >> 7)), "n"(N) : "memory");
}

__device__ __forceinline__ void turn_wait_group() {
  asm volatile("bar.sync %0, 256;" ::"r"(5 + (threadIdx.x >> 7)) : "memory");
}

__device__ __forceinline__ void turn_pass_group() {
  asm volatile("bar.arrive %0, 256;" ::"r"(6 - (threadIdx.x >> 7)) : "memory");
}

}  // namespace sm90
}  // namespace tiled

#endif  // TILED_SM90A_ENABLED
#endif  // TILED_SM90_H_
