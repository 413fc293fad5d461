// tiled_hip_amdgcn.h -- the ISA layer of tiled_hip.h for AMDGPU (gfx90a, gfx942), built
// with clang's HIP language mode and AMDGPU builtins only (no ROCm headers or device
// libraries: clang -x hip -nogpuinc -nogpulib). tiled_hip_cpu.h is the same interface for
// the CPU emulation; tiled_hip.h builds every tile op on it.
//
// The interface (namespace tiled::isa):
//   thread_idx(), block_idx()          workitem / workgroup ids (threadIdx / blockIdx)
//   barrier()                          __syncthreads: workgroup fences around s_barrier
//   lane_id(), bpermute(lane, v32)     wave64 lane exchange (ds_bpermute_b32)
//   mfma_*(a, b, c)                    one 16x16 MFMA for the whole wave: each lane passes
//                                      its A / B operand registers and its 4 accumulators
//   exp_f32 ... sqrt_f32               math primitives the hardware has (LLVM intrinsics)
#pragma once

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
// The kernel's shared pool, a static LDS array: the code object's group segment size is then
// the pool's size, which tiled checks against the manifest.
#define TILED_LDS_POOL(name, bytes) __shared__ __attribute__((aligned(64))) uchar name[bytes]

namespace tiled {
namespace isa {

struct dim3v {
  unsigned x, y, z;
};

__device__ __forceinline__ dim3v thread_idx() {
  return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
          __builtin_amdgcn_workitem_id_z()};
}

__device__ __forceinline__ dim3v block_idx() {
  return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
          __builtin_amdgcn_workgroup_id_z()};
}

// LDS writes before the barrier are visible to every thread of the workgroup after it.
__device__ __forceinline__ void barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Device-scope ordering of this thread's global memory accesses (T.atomic_add's memory_order).
__device__ __forceinline__ void fence_device() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

__device__ __forceinline__ int lane_id() {
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

// The 32-bit value `v` of lane `src` (0..63) of this wave.
__device__ __forceinline__ int bpermute(int src, int v) {
  return __builtin_amdgcn_ds_bpermute(src << 2, v);
}

__device__ __forceinline__ float exp_f32(float x) { return __builtin_expf(x); }
__device__ __forceinline__ float exp2_f32(float x) { return __builtin_exp2f(x); }
// v_exp_f32 alone: about 1 ulp, results below 2^-126 flushed (T.exp2 in softmax loops).
__device__ __forceinline__ float exp2_approx_f32(float x) { return __builtin_amdgcn_exp2f(x); }
__device__ __forceinline__ float log_f32(float x) { return __builtin_logf(x); }
__device__ __forceinline__ float log2_f32(float x) { return __builtin_log2f(x); }
__device__ __forceinline__ float sqrt_f32(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ double sqrt_f64(double x) { return __builtin_sqrt(x); }

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef int i32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ f32x4 load4(const float* c) { return f32x4{c[0], c[1], c[2], c[3]}; }
__device__ __forceinline__ void store4(float* c, f32x4 d) {
  c[0] = d.x; c[1] = d.y; c[2] = d.z; c[3] = d.w;
}
__device__ __forceinline__ i32x4 load4(const int* c) { return i32x4{c[0], c[1], c[2], c[3]}; }
__device__ __forceinline__ void store4(int* c, i32x4 d) {
  c[0] = d.x; c[1] = d.y; c[2] = d.z; c[3] = d.w;
}

// v_mfma_f32_16x16x16_f16 (gfx942) / v_mfma_f32_16x16x16f16 (gfx90a): a, b 4 halves each.
__device__ __forceinline__ void mfma_f32_16x16x16_f16(const _Float16* a, const _Float16* b,
                                                      float* c) {
  f16x4 va = {a[0], a[1], a[2], a[3]}, vb = {b[0], b[1], b[2], b[3]};
  store4(c, __builtin_amdgcn_mfma_f32_16x16x16f16(va, vb, load4(c), 0, 0, 0));
}

// v_mfma_f32_16x16x16_bf16 (gfx942) / v_mfma_f32_16x16x16bf16_1k (gfx90a): bfloat16 bits.
__device__ __forceinline__ void mfma_f32_16x16x16_bf16(const unsigned short* a,
                                                       const unsigned short* b, float* c) {
  i16x4 va = {(short)a[0], (short)a[1], (short)a[2], (short)a[3]};
  i16x4 vb = {(short)b[0], (short)b[1], (short)b[2], (short)b[3]};
  store4(c, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(va, vb, load4(c), 0, 0, 0));
}

// v_mfma_f32_16x16x4_f32 (gfx942) / v_mfma_f32_16x16x4f32 (gfx90a): one float each.
__device__ __forceinline__ void mfma_f32_16x16x4_f32(const float* a, const float* b, float* c) {
  store4(c, __builtin_amdgcn_mfma_f32_16x16x4f32(a[0], b[0], load4(c), 0, 0, 0));
}

#if defined(__gfx942__)
// v_mfma_i32_16x16x32_i8: 8 int8 per lane.
__device__ __forceinline__ void mfma_i32_16x16x32_i8(const signed char* a, const signed char* b,
                                                     int* c) {
  long va, vb;
  __builtin_memcpy(&va, a, 8);
  __builtin_memcpy(&vb, b, 8);
  store4(c, __builtin_amdgcn_mfma_i32_16x16x32_i8(va, vb, load4(c), 0, 0, 0));
}

// v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8}: 8 bytes per lane, read as gfx942's FNUZ formats
// (E4M3FNUZ, E5M2FNUZ). BF8_A / BF8_B pick the E5M2 reading of A / B.
template <bool BF8_A, bool BF8_B>
__device__ __forceinline__ void mfma_f32_16x16x32_f8(const unsigned char* a,
                                                     const unsigned char* b, float* c) {
  long va, vb;
  __builtin_memcpy(&va, a, 8);
  __builtin_memcpy(&vb, b, 8);
  f32x4 acc = load4(c);
  if constexpr (!BF8_A && !BF8_B) {
    acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(va, vb, acc, 0, 0, 0);
  } else if constexpr (!BF8_A && BF8_B) {
    acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_bf8(va, vb, acc, 0, 0, 0);
  } else if constexpr (BF8_A && !BF8_B) {
    acc = __builtin_amdgcn_mfma_f32_16x16x32_bf8_fp8(va, vb, acc, 0, 0, 0);
  } else {
    acc = __builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8(va, vb, acc, 0, 0, 0);
  }
  store4(c, acc);
}
#else
// v_mfma_i32_16x16x16i8 (gfx90a): 4 int8 per lane.
__device__ __forceinline__ void mfma_i32_16x16x16_i8(const signed char* a, const signed char* b,
                                                     int* c) {
  int va, vb;
  __builtin_memcpy(&va, a, 4);
  __builtin_memcpy(&vb, b, 4);
  store4(c, __builtin_amdgcn_mfma_i32_16x16x16i8(va, vb, load4(c), 0, 0, 0));
}
#endif

// Atomic compare-and-swap of a 32- or 64-bit word (global or LDS, agent scope).
template <typename W>
__device__ __forceinline__ bool cas(W* addr, W& expected, W desired) {
  return __hip_atomic_compare_exchange_strong(addr, &expected, desired, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

template <typename T>
__device__ __forceinline__ T fetch_add(T* addr, T v) {
  return __hip_atomic_fetch_add(addr, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

}  // namespace isa
}  // namespace tiled

