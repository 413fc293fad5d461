// tiled_hip.h -- the device header of tiled's ROCm backend.
//
// The ROCm lowering builds TIR with calls into this header and prints it with TVM's CUDA C++
// codegen (the CUDA lowering's statement walk, targets/rocm/lower.py); tiled then wraps the
// kernel in `namespace tiled_kernel` after this header. The same source is built twice:
//   - for the GPU: clang -x hip --offload-arch=gfx942|gfx90a -nogpuinc -nogpulib, where the
//     ISA layer is tiled_hip_amdgcn.h (AMDGPU builtins: no ROCm headers, no device library);
//   - for the CPU emulation: clang++ -x c++ with tiled_hip_cpu.h (fibers, an LDS arena,
//     reference MFMA), so the emulated code is the shipped code apart from that layer.
// What lives here: the types and CUDA names TVM's codegen prints (half, nv_bfloat16, the
// vector structs, threadIdx, __syncthreads, __shfl_xor_sync, atomicAdd ...); with
// tiled_hip_math.h (expf, tanhf ...: math the GPU has no instruction for, written once for
// both builds) and tiled_hip_tileops.h (the lowering's tile ops: cp_async, an LDS fill; the
// MFMA gemm; the SIMT gemm; float8 tile converts).
#pragma once

#include <stdint.h>

typedef unsigned int uint;
typedef unsigned char uchar;
typedef unsigned short ushort;

#if defined(__AMDGCN__)
#include "tiled_hip_amdgcn.h"
#else
#include "tiled_hip_cpu.h"
#endif

#define TILED_FN __host__ __device__ __forceinline__
#define __align__(n) __attribute__((aligned(n)))
#define threadIdx (::tiled::isa::thread_idx())
#define blockIdx (::tiled::isa::block_idx())
#define __syncthreads() ::tiled::isa::barrier()
#define __threadfence() ::tiled::isa::fence_device()

// math_constants.h's names TVM prints for infinities and NaNs.
#define CUDART_INF_F __builtin_huge_valf()
#define CUDART_NAN_F __builtin_nanf("")
#define CUDART_INF __builtin_huge_val()
#define CUDART_NAN __builtin_nan("")

// --- element types -------------------------------------------------------------------------

typedef _Float16 half;
typedef _Float16 __half;

// bfloat16 as its bits: conversions round to nearest even. No operators of its own: an
// operation on bfloat16 values runs in float (each converts) and rounds where its result is
// stored as bfloat16 (what cuda_bf16.h's operators do for one operation).
struct nv_bfloat16 {
  unsigned short __x;
  TILED_FN nv_bfloat16() = default;
  TILED_FN nv_bfloat16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    __x = (u & 0x7FFFFFFFu) > 0x7F800000u ? (unsigned short)((u >> 16) | 0x40)
                                           : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
  }
  TILED_FN explicit nv_bfloat16(double d) : nv_bfloat16((float)d) {}
  TILED_FN explicit nv_bfloat16(int i) : nv_bfloat16((float)i) {}
  TILED_FN operator float() const {
    const uint32_t u = (uint32_t)__x << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};
typedef nv_bfloat16 __nv_bfloat16;

template <typename T>
struct __align__(2 * sizeof(T)) tiled_vec2 {
  T x, y;
  TILED_FN tiled_vec2() = default;
  TILED_FN tiled_vec2(T a, T b) : x(a), y(b) {}
};
typedef tiled_vec2<half> __half2;
typedef tiled_vec2<half> half2;
typedef tiled_vec2<nv_bfloat16> nv_bfloat162;
typedef tiled_vec2<nv_bfloat16> __nv_bfloat162;

template <typename T, typename TVec2>
struct __align__(8) half4_bfloat164 {
  T x, y, z, w;
  TILED_FN half4_bfloat164() = default;
  TILED_FN half4_bfloat164(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
};
typedef half4_bfloat164<half, half2> half4;
typedef half4_bfloat164<nv_bfloat16, nv_bfloat162> nv_bfloat164;

// OCP float8 (tiled's float8_e4m3 / float8_e5m2), decoded in software where no instruction
// reads them (the SIMT gemm, conversions). Every value is exact in float.
template <int MBITS, int BIAS, bool E4M3>
struct tiled_fp8 {
  unsigned char __x;
  TILED_FN operator float() const {
    const int e = (__x & 0x7F) >> MBITS, m = __x & ((1 << MBITS) - 1);
    const bool neg = __x & 0x80;
    float mag;
    if (E4M3 && e == 15 && m == 7) {
      mag = __builtin_nanf("");
    } else if (!E4M3 && e == 31) {
      mag = m ? __builtin_nanf("") : __builtin_inff();
    } else if (e == 0) {
      mag = __builtin_ldexpf((float)m, 1 - BIAS - MBITS);
    } else {
      mag = __builtin_ldexpf((float)(m | (1 << MBITS)), e - BIAS - MBITS);
    }
    return neg ? -mag : mag;
  }
};
typedef tiled_fp8<3, 7, true> __nv_fp8_e4m3;
typedef tiled_fp8<2, 15, false> __nv_fp8_e5m2;

#define TILED_VEC4(T, name)                                                 \
  struct __align__(4 * sizeof(T)) name {                                    \
    T x, y, z, w;                                                           \
  };                                                                        \
  TILED_FN name make_##name(T a, T b, T c, T d) { return name{a, b, c, d}; }
#define TILED_VEC2(T, name)                                 \
  struct __align__(2 * sizeof(T)) name {                    \
    T x, y;                                                 \
  };                                                        \
  TILED_FN name make_##name(T a, T b) { return name{a, b}; }
#define TILED_VEC3(T, name)                                            \
  struct name {                                                        \
    T x, y, z;                                                         \
  };                                                                   \
  TILED_FN name make_##name(T a, T b, T c) { return name{a, b, c}; }

TILED_VEC4(float, float4)
TILED_VEC2(float, float2)
TILED_VEC3(float, float3)
TILED_VEC4(double, double4)
TILED_VEC2(double, double2)
TILED_VEC4(int, int4)
TILED_VEC2(int, int2)
TILED_VEC3(int, int3)
TILED_VEC4(unsigned, uint4)
TILED_VEC2(unsigned, uint2)
TILED_VEC3(unsigned, uint3)
TILED_VEC4(short, short4)
TILED_VEC2(short, short2)
TILED_VEC4(unsigned short, ushort4)
TILED_VEC2(unsigned short, ushort2)
TILED_VEC4(signed char, char4)
TILED_VEC2(signed char, char2)
TILED_VEC4(unsigned char, uchar4)
TILED_VEC2(unsigned char, uchar2)
TILED_VEC4(long long, longlong4)
TILED_VEC2(long long, longlong2)
TILED_VEC4(unsigned long long, ulonglong4)
TILED_VEC2(unsigned long long, ulonglong2)

TILED_FN half4 make_half4(half a, half b, half c, half d) { return half4(a, b, c, d); }
TILED_FN half2 make_half2(half a, half b) { return half2(a, b); }
TILED_FN nv_bfloat164 make_nv_bfloat164(nv_bfloat16 a, nv_bfloat16 b, nv_bfloat16 c,
                                        nv_bfloat16 d) {
  return nv_bfloat164(a, b, c, d);
}
TILED_FN nv_bfloat162 make_nv_bfloat162(nv_bfloat16 a, nv_bfloat16 b) {
  return nv_bfloat162(a, b);
}

TILED_FN float __half2float(half h) { return (float)h; }
TILED_FN half __float2half(float f) { return (half)f; }
TILED_FN half __float2half_rn(float f) { return (half)f; }
TILED_FN float __bfloat162float(nv_bfloat16 b) { return (float)b; }
TILED_FN nv_bfloat16 __float2bfloat16(float f) { return nv_bfloat16(f); }
TILED_FN nv_bfloat16 __float2bfloat16_rn(float f) { return nv_bfloat16(f); }
TILED_FN bool __hgt(half a, half b) { return a > b; }
TILED_FN bool __hlt(half a, half b) { return a < b; }
TILED_FN bool __hge(half a, half b) { return a >= b; }
TILED_FN bool __hle(half a, half b) { return a <= b; }
TILED_FN bool __heq(half a, half b) { return a == b; }
TILED_FN half __hadd(half a, half b) { return a + b; }
TILED_FN half __hsub(half a, half b) { return a - b; }
TILED_FN half __hmul(half a, half b) { return a * b; }
TILED_FN unsigned __pack_half2(half x, half y) {
  unsigned short a, b;
  __builtin_memcpy(&a, &x, 2);
  __builtin_memcpy(&b, &y, 2);
  return ((unsigned)b << 16) | a;
}
TILED_FN unsigned __pack_nv_bfloat162(nv_bfloat16 x, nv_bfloat16 y) {
  return ((unsigned)y.__x << 16) | x.__x;
}

#include "tiled_hip_math.h"

// --- wave64 lane exchange -----------------------------------------------------------------

namespace tiled {
namespace detail {

template <typename T>
TILED_FN T bpermute_any(int src, T v) {
  static_assert(sizeof(T) % 2 == 0 || sizeof(T) == 1, "bpermute_any: odd-sized type");
  constexpr int WORDS = (sizeof(T) + 3) / 4;
  int w[WORDS] = {};
  __builtin_memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < WORDS; ++i) w[i] = isa::bpermute(src, w[i]);
  T out;
  __builtin_memcpy(&out, w, sizeof(T));
  return out;
}

}  // namespace detail

// T.atomic_add's acquire / release fences (tiled_cuda.h's name): device scope.
TILED_FN void fence_acq_rel() { isa::fence_device(); }
}  // namespace tiled

// v of lane (lane ^ lane_mask) of the 64-lane wave (the 32-bit mask argument is CUDA's and
// is ignored: every lane of the wave must call). `width` segments as in CUDA.
template <typename T>
TILED_FN T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 64) {
  const int lane = ::tiled::isa::lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return ::tiled::detail::bpermute_any(src, v);
}

template <typename T>
TILED_FN T __shfl_sync(unsigned, T v, int src_lane, int width = 64) {
  const int lane = ::tiled::isa::lane_id();
  return ::tiled::detail::bpermute_any((lane & ~(width - 1)) + (src_lane & (width - 1)), v);
}

// --- atomics ------------------------------------------------------------------------------

namespace tiled {
namespace detail {

template <typename T>
TILED_FN float as_comparable(T v) { return (float)v; }
TILED_FN double as_comparable(double v) { return v; }
TILED_FN long long as_comparable(long long v) { return v; }
TILED_FN unsigned long long as_comparable(unsigned long long v) { return v; }
TILED_FN long long as_comparable(int v) { return v; }
TILED_FN long long as_comparable(unsigned v) { return v; }
TILED_FN long long as_comparable(short v) { return v; }
TILED_FN long long as_comparable(unsigned short v) { return v; }
TILED_FN long long as_comparable(signed char v) { return v; }
TILED_FN long long as_comparable(unsigned char v) { return v; }

// OP 0: add, 1: max, 2: min. A compare-and-swap loop on the aligned word that holds the
// element (4 bytes for elements up to 4 bytes wide, 8 for wider): neighbours in the word are
// written back as they were read. Returns the element's old value. Max / min: a NaN `v`
// never replaces a number (and stop without writing once the element already wins); integer
// adds wrap.
template <int OP, typename T>
TILED_FN bool rmw_next(T cur, T v, T& next) {
  if constexpr (OP == 0) {
    next = T(cur + v);
    return true;
  } else {
    const bool wins = OP == 1 ? as_comparable(v) > as_comparable(cur)
                              : as_comparable(v) < as_comparable(cur);
    next = v;
    return wins;
  }
}

template <int OP, typename T>
TILED_FN T atomic_rmw(T* addr, T v) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "atomic_rmw: 1-, 2-, 4- or 8-byte elements");
  if constexpr (sizeof(T) == 8) {
    unsigned long long* w = reinterpret_cast<unsigned long long*>(addr);
    unsigned long long old = *reinterpret_cast<volatile unsigned long long*>(w);
    for (;;) {
      T cur, next;
      __builtin_memcpy(&cur, &old, 8);
      if (!rmw_next<OP>(cur, v, next)) return cur;
      unsigned long long word;
      __builtin_memcpy(&word, &next, 8);
      if (isa::cas(w, old, word)) return cur;
    }
  } else {
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    uint32_t* w = reinterpret_cast<uint32_t*>(a & ~uintptr_t(3));
    const int shift = (int)(a & 3) * 8;
    const uint32_t mask = sizeof(T) == 4 ? 0xFFFFFFFFu
                                         : ((1u << (8 * sizeof(T))) - 1u) << shift;
    uint32_t old = *reinterpret_cast<volatile uint32_t*>(w);
    for (;;) {
      const uint32_t bits = (old & mask) >> shift;
      T cur, next;
      __builtin_memcpy(&cur, &bits, sizeof(T));
      if (!rmw_next<OP>(cur, v, next)) return cur;
      uint32_t nb = 0;
      __builtin_memcpy(&nb, &next, sizeof(T));
      if (isa::cas(w, old, (old & ~mask) | ((nb << shift) & mask))) return cur;
    }
  }
}

}  // namespace detail

template <typename T>
TILED_FN T atomic_add(T* addr, T v) { return detail::atomic_rmw<0>(addr, v); }
template <typename T>
TILED_FN T atomic_max(T* addr, T v) { return detail::atomic_rmw<1>(addr, v); }
template <typename T>
TILED_FN T atomic_min(T* addr, T v) { return detail::atomic_rmw<2>(addr, v); }

}  // namespace tiled

TILED_FN int atomicAdd(int* a, int v) { return ::tiled::isa::fetch_add(a, v); }
TILED_FN unsigned atomicAdd(unsigned* a, unsigned v) { return ::tiled::isa::fetch_add(a, v); }
TILED_FN float atomicAdd(float* a, float v) { return ::tiled::isa::fetch_add(a, v); }
TILED_FN double atomicAdd(double* a, double v) { return ::tiled::isa::fetch_add(a, v); }
TILED_FN half atomicAdd(half* a, half v) { return ::tiled::detail::atomic_rmw<0>(a, v); }
TILED_FN nv_bfloat16 atomicAdd(nv_bfloat16* a, nv_bfloat16 v) {
  return ::tiled::detail::atomic_rmw<0>(a, v);
}

#include "tiled_hip_tileops.h"
