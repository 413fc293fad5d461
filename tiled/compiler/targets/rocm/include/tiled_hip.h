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
// vector structs, threadIdx, __syncthreads, __shfl_xor_sync, atomicAdd, expf ...), math
// functions the GPU has no instruction for (written once, for both builds), and the tile ops
// of the lowering: cp_async (an LDS fill), the MFMA gemm, the SIMT gemm, fp8 tile converts.
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

// --- math: what the kernel body calls (TVM prints the CUDA names) ---------------------------
//
// The kernel is compiled inside namespace tiled_kernel, so these hide the C library's
// functions of the same names in the CPU build: both builds run the same formulas, on the
// hardware's primitives (exp, exp2, log, log2, sqrt) where it has them. Functions beyond
// these (tan, atan, log1p ...) are not declared: a kernel needing one fails to compile
// instead of linking a device library tiled does not ship.
namespace tiled {
namespace math {

TILED_FN float tanh_f32(float x) {
  const float a = __builtin_fabsf(x);
  float r;
  if (a < 0.0625f) {  // odd series: no cancellation near 0
    const float x2 = a * a;
    r = a * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
  } else if (a < 9.0f) {
    const float e = isa::exp_f32(-2.0f * a);
    r = (1.0f - e) / (1.0f + e);
  } else {
    r = 1.0f;
  }
  return __builtin_copysignf(r, x);
}

// erf: a Taylor series below 0.5, else 1 - erfc(x) with W. J. Cody's rational form
// erfc(x) = exp(-x^2) P(x) / Q(x) (in float: AMDGPU has no double exp without ROCm's
// device library; erf's absolute error stays below 2e-7).
TILED_FN float erf_f32(float x) {
  const float a = __builtin_fabsf(x);
  float r;
  if (a < 0.5f) {
    const float x2 = a * a;  // 2/sqrt(pi) * (x - x^3/3 + x^5/10 - x^7/42 + x^9/216)
    r = 1.1283791671f * a *
        (1.0f + x2 * (-1.0f / 3 + x2 * (1.0f / 10 + x2 * (-1.0f / 42 + x2 * (1.0f / 216)))));
  } else if (a < 4.0f) {
    const float p = (((((((-2.72614225801306e-10f * a + 0.564187164528653f) * a +
                          7.21175825088309f) * a + 43.1622272220567f) * a +
                        152.989285046940f) * a + 339.320816734344f) * a +
                      451.918953711873f) * a + 300.459261020162f);
    const float q = ((((((a + 12.7827273196294f) * a + 77.0001529352295f) * a +
                        277.585444743988f) * a + 638.980264465631f) * a +
                      931.354094850610f) * a + 790.950925327898f) * a + 300.459260956983f;
    r = 1.0f - isa::exp_f32(-a * a) * p / q;
  } else {
    r = 1.0f;
  }
  return __builtin_copysignf(r, x);
}

// sin / cos: Cody-Waite reduction by pi/2 (three parts), then minimax polynomials on
// [-pi/4, pi/4]. Accurate to a few ulp for |x| < 2^17; larger arguments lose precision.
TILED_FN void sincos_f32(float x, float* s, float* c) {
  const float q = __builtin_rintf(x * 0.636619772f);
  float r = __builtin_fmaf(q, -1.5707962513f, x);
  r = __builtin_fmaf(q, -7.5497894159e-08f, r);
  r = __builtin_fmaf(q, -5.3903029534e-15f, r);
  const float r2 = r * r;
  const float sp = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f +
                                                           r2 * -1.9515295891e-4f));
  const float cp = 1.0f + r2 * (-0.5f + r2 * (4.166664568298827e-2f +
                                               r2 * (-1.388731625493765e-3f +
                                                     r2 * 2.443315711809948e-5f)));
  const int n = (int)q & 3;
  const float sv = (n & 1) ? cp : sp, cv = (n & 1) ? sp : cp;
  *s = (n & 2) ? -sv : sv;
  *c = ((n + 1) & 2) ? -cv : cv;
}

TILED_FN float pow_f32(float x, float y) {
  if (y == 0.0f) return 1.0f;
  const float ay = __builtin_fabsf(y);
  const bool int_y = __builtin_floorf(y) == y && ay < 16777216.0f;
  const bool odd_y = int_y && __builtin_fmodf(ay, 2.0f) == 1.0f;
  if (x == 0.0f) return y < 0 ? (odd_y ? __builtin_copysignf(__builtin_inff(), x)
                                        : __builtin_inff())
                              : (odd_y ? x : 0.0f);
  if (x < 0.0f && !int_y) return __builtin_nanf("");
  const float r = isa::exp2_f32(isa::log2_f32(__builtin_fabsf(x)) * y);
  return (x < 0.0f && odd_y) ? -r : r;
}

}  // namespace math
}  // namespace tiled

namespace tiled_kernel {

TILED_FN float expf(float x) { return ::tiled::isa::exp_f32(x); }
TILED_FN float __expf(float x) { return ::tiled::isa::exp_f32(x); }
TILED_FN float exp2f(float x) { return ::tiled::isa::exp2_f32(x); }
TILED_FN float logf(float x) { return ::tiled::isa::log_f32(x); }
TILED_FN float __logf(float x) { return ::tiled::isa::log_f32(x); }
TILED_FN float log2f(float x) { return ::tiled::isa::log2_f32(x); }
TILED_FN float sqrtf(float x) { return ::tiled::isa::sqrt_f32(x); }
TILED_FN float rsqrtf(float x) { return 1.0f / ::tiled::isa::sqrt_f32(x); }
TILED_FN float fabsf(float x) { return __builtin_fabsf(x); }
TILED_FN float floorf(float x) { return __builtin_floorf(x); }
TILED_FN float ceilf(float x) { return __builtin_ceilf(x); }
TILED_FN float truncf(float x) { return __builtin_truncf(x); }
TILED_FN float roundf(float x) { return __builtin_roundf(x); }
TILED_FN float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
TILED_FN float fminf(float a, float b) { return __builtin_fminf(a, b); }
TILED_FN float tanhf(float x) { return ::tiled::math::tanh_f32(x); }
TILED_FN float erff(float x) { return ::tiled::math::erf_f32(x); }
TILED_FN float powf(float x, float y) { return ::tiled::math::pow_f32(x, y); }
TILED_FN float sinf(float x) {
  float s, c;
  ::tiled::math::sincos_f32(x, &s, &c);
  return s;
}
TILED_FN float cosf(float x) {
  float s, c;
  ::tiled::math::sincos_f32(x, &s, &c);
  return c;
}
TILED_FN double sqrt(double x) { return ::tiled::isa::sqrt_f64(x); }
TILED_FN double rsqrt(double x) { return 1.0 / ::tiled::isa::sqrt_f64(x); }
TILED_FN double fabs(double x) { return __builtin_fabs(x); }
TILED_FN double floor(double x) { return __builtin_floor(x); }
TILED_FN double ceil(double x) { return __builtin_ceil(x); }
TILED_FN double fmax(double a, double b) { return __builtin_fmax(a, b); }
TILED_FN double fmin(double a, double b) { return __builtin_fmin(a, b); }

// CUDA's overloaded max / min (TVM prints them for every type).
TILED_FN int max(int a, int b) { return a < b ? b : a; }
TILED_FN int min(int a, int b) { return b < a ? b : a; }
TILED_FN unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
TILED_FN unsigned min(unsigned a, unsigned b) { return b < a ? b : a; }
TILED_FN long long max(long long a, long long b) { return a < b ? b : a; }
TILED_FN long long min(long long a, long long b) { return b < a ? b : a; }
TILED_FN unsigned long long max(unsigned long long a, unsigned long long b) {
  return a < b ? b : a;
}
TILED_FN unsigned long long min(unsigned long long a, unsigned long long b) {
  return b < a ? b : a;
}
TILED_FN float max(float a, float b) { return __builtin_fmaxf(a, b); }
TILED_FN float min(float a, float b) { return __builtin_fminf(a, b); }
TILED_FN double max(double a, double b) { return __builtin_fmax(a, b); }
TILED_FN double min(double a, double b) { return __builtin_fmin(a, b); }
// cuda_fp16.h / cuda_bf16.h math TVM prints for 16-bit values (bfloat16 too takes the h*
// names): computed in float, rounded once.
#define TILED_HALF_MATH(T)                                                                  \
  TILED_FN T hexp(T x) { return T(::tiled::isa::exp_f32((float)x)); }                      \
  TILED_FN T hexp2(T x) { return T(::tiled::isa::exp2_f32((float)x)); }                    \
  TILED_FN T hlog(T x) { return T(::tiled::isa::log_f32((float)x)); }                       \
  TILED_FN T hlog2(T x) { return T(::tiled::isa::log2_f32((float)x)); }                     \
  TILED_FN T hsqrt(T x) { return T(::tiled::isa::sqrt_f32((float)x)); }                     \
  TILED_FN T hrsqrt(T x) { return T(1.0f / ::tiled::isa::sqrt_f32((float)x)); }             \
  TILED_FN T htanh(T x) { return T(::tiled::math::tanh_f32((float)x)); }                    \
  TILED_FN T herf(T x) { return T(::tiled::math::erf_f32((float)x)); }                      \
  TILED_FN T hsin(T x) { return T(sinf((float)x)); }                                        \
  TILED_FN T hcos(T x) { return T(cosf((float)x)); }                                        \
  TILED_FN T hpow(T x, T y) { return T(::tiled::math::pow_f32((float)x, (float)y)); }       \
  TILED_FN T hfloor(T x) { return T(__builtin_floorf((float)x)); }                          \
  TILED_FN T hceil(T x) { return T(__builtin_ceilf((float)x)); }                            \
  TILED_FN T htrunc(T x) { return T(__builtin_truncf((float)x)); }                          \
  TILED_FN T hrint(T x) { return T(__builtin_rintf((float)x)); }                            \
  TILED_FN T __habs(T x) { return T(__builtin_fabsf((float)x)); }                           \
  TILED_FN T __hmax(T a, T b) { return (float)a < (float)b ? b : a; }                       \
  TILED_FN T __hmin(T a, T b) { return (float)b < (float)a ? b : a; }                       \
  TILED_FN T max(T a, T b) { return (float)a < (float)b ? b : a; }                          \
  TILED_FN T min(T a, T b) { return (float)b < (float)a ? b : a; }
TILED_HALF_MATH(half)
TILED_HALF_MATH(nv_bfloat16)
#undef TILED_HALF_MATH

}  // namespace tiled_kernel

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

// --- tile ops ------------------------------------------------------------------------------

namespace tiled {

namespace detail {
// Vector registers (not aggregates: a conditionally assigned struct goes through scratch).
template <int BYTES>
struct word_vec {
  typedef unsigned type __attribute__((ext_vector_type(BYTES / 4)));
};
template <>
struct word_vec<4> {
  using type = unsigned;
};
}  // namespace detail

// The lowering's global -> LDS vector copy (CUDA's cp.async). AMDGPU has no asynchronous
// copy of a lane's own address into LDS, so this is a load and an LDS store: a vector of
// BYTES (4, 8 or 16), zeros when !pred (a tile's tail past the tensor's end), `src` then
// never read. A T.Pipelined loop still issues it num_stages - 1 iterations ahead of use.
template <int BYTES>
TILED_FN void cp_async(void* dst, const void* src, bool pred) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp_async: 4, 8 or 16 bytes");
  using V = typename detail::word_vec<BYTES>::type;
  *static_cast<V*>(dst) = pred ? *static_cast<const V*>(src) : V(0);
}

TILED_FN void cp_async_commit() {}
template <int N>
TILED_FN void cp_async_wait() {}
TILED_FN void cp_async_wait_all() {}

// T.exp2 of a float32: v_exp_f32 alone (about 1 ulp; results below 2^-126 flushed).
TILED_FN float exp2_approx(float x) { return isa::exp2_approx_f32(x); }

// dst = src converted: a ROWS x COLS tile of OCP float8 bytes (FP8 names the format; row
// stride LDS) into T (half or nv_bfloat16, row stride LDD) over THREADS threads from
// TID_BASE. Exact. No barrier inside.
template <typename FP8, typename T, int ROWS, int COLS, int LDS, int LDD, int THREADS,
          int TID_BASE = 0>
TILED_FN void fp8_tile_convert(const void* src, T* dst) {
  const FP8* s = static_cast<const FP8*>(src);
  const int t = (int)threadIdx.x - TID_BASE;
  for (int e = t; e < ROWS * COLS; e += THREADS) {
    const int r = e / COLS, c = e % COLS;
    dst[r * LDD + c] = T((float)s[r * LDS + c]);
  }
}

template <typename FP8, int ROWS, int COLS, int LDS, int LDD, int THREADS, int TID_BASE = 0>
TILED_FN void fp8_tile_to_half(const void* src, half* dst) {
  fp8_tile_convert<FP8, half, ROWS, COLS, LDS, LDD, THREADS, TID_BASE>(src, dst);
}

// acc += op(A) @ op(B) on the vector ALUs, for what no MFMA takes: thread t (< THREADS)
// owns elements e = t + i * THREADS of the M x N tile (row e / N, column e % N) in acc[i]
// (the cyclic layout). Products in TC, added in k order. No barrier inside.
template <typename TA, typename TB, typename TC, int M, int N, int K, int THREADS, bool TRANS_A,
          bool TRANS_B, int LDA, int LDB, int TID_BASE = 0>
TILED_FN void gemm_ss_simt(const TA* A, const TB* B, TC* acc) {
  constexpr int ITERS = (M * N + THREADS - 1) / THREADS;
  const int t = (int)threadIdx.x - TID_BASE;
  for (int i = 0; i < ITERS; ++i) {
    const int e = t + i * THREADS;
    if (e < M * N) {
      const int row = e / N, col = e % N;
      TC c = acc[i];
      for (int k = 0; k < K; ++k) {
        const TA a = TRANS_A ? A[k * LDA + row] : A[row * LDA + k];
        const TB b = TRANS_B ? B[col * LDB + k] : B[k * LDB + col];
        c = TC(c + TC(a) * TC(b));
      }
      acc[i] = c;
    }
  }
}

template <typename TA, typename TB, typename TC, int M, int N, int K, int THREADS, bool TRANS_A,
          bool TRANS_B, int LDA, int LDB, int TID_BASE = 0>
TILED_FN void gemm_ss_simt_bytes(const void* A, const void* B, TC* acc) {
  gemm_ss_simt<TA, TB, TC, M, N, K, THREADS, TRANS_A, TRANS_B, LDA, LDB, TID_BASE>(
      static_cast<const TA*>(A), static_cast<const TB*>(B), acc);
}

namespace detail {

// One MFMA flavour: K (the instruction's K), EA / EB (how an operand element is passed),
// issue (one instruction over the wave), enter / leave (around a whole gemm call).
template <typename TA, typename TB, typename TC>
struct Mfma;

struct MfmaPlain {
  template <typename E>
  TILED_FN static void fix(E*) {}
  template <typename C>
  TILED_FN static void enter(C*, int) {}
  template <typename C>
  TILED_FN static void leave(C*, int) {}
};

template <>
struct Mfma<half, half, float> : MfmaPlain {
  static constexpr int K = 16;
  using EA = _Float16;
  using EB = _Float16;
  TILED_FN static void issue(const EA* a, const EB* b, float* c) {
    isa::mfma_f32_16x16x16_f16(a, b, c);
  }
};

template <>
struct Mfma<nv_bfloat16, nv_bfloat16, float> : MfmaPlain {
  static constexpr int K = 16;
  using EA = unsigned short;
  using EB = unsigned short;
  TILED_FN static void issue(const EA* a, const EB* b, float* c) {
    isa::mfma_f32_16x16x16_bf16(a, b, c);
  }
};

template <>
struct Mfma<float, float, float> : MfmaPlain {
  static constexpr int K = 4;
  using EA = float;
  using EB = float;
  TILED_FN static void issue(const EA* a, const EB* b, float* c) {
    isa::mfma_f32_16x16x4_f32(a, b, c);
  }
};

#if defined(__gfx942__)
template <>
struct Mfma<int8_t, int8_t, int> : MfmaPlain {
  static constexpr int K = 32;
  using EA = signed char;
  using EB = signed char;
  TILED_FN static void issue(const EA* a, const EB* b, int* c) {
    isa::mfma_i32_16x16x32_i8(a, b, c);
  }
};

// gfx942's fp8 MFMA reads its operands as E4M3FNUZ / E5M2FNUZ, whose exponent bias is one
// more than OCP E4M3 / E5M2's (tiled's float8 types): every finite OCP value reads as half
// itself, so a product reads as a quarter. The accumulator is scaled by 1/4 for the call
// and by 4 after (exact, powers of two). OCP's negative zero (0x80) is FNUZ's NaN: it is
// passed as +0. OCP NaN / infinity bytes read as large finite values (not propagated).
template <bool BF8_A, bool BF8_B>
struct MfmaF8 {
  static constexpr int K = 32;
  using EA = unsigned char;
  using EB = unsigned char;
  template <typename E>
  TILED_FN static void fix(E* v) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] == 0x80 ? 0 : v[j];
  }
  TILED_FN static void enter(float* acc, int n) {
#pragma unroll
    for (int i = 0; i < n; ++i) acc[i] *= 0.25f;
  }
  TILED_FN static void leave(float* acc, int n) {
#pragma unroll
    for (int i = 0; i < n; ++i) acc[i] *= 4.0f;
  }
  TILED_FN static void issue(const EA* a, const EB* b, float* c) {
    isa::mfma_f32_16x16x32_f8<BF8_A, BF8_B>(a, b, c);
  }
};
template <>
struct Mfma<__nv_fp8_e4m3, __nv_fp8_e4m3, float> : MfmaF8<false, false> {};
template <>
struct Mfma<__nv_fp8_e4m3, __nv_fp8_e5m2, float> : MfmaF8<false, true> {};
template <>
struct Mfma<__nv_fp8_e5m2, __nv_fp8_e4m3, float> : MfmaF8<true, false> {};
template <>
struct Mfma<__nv_fp8_e5m2, __nv_fp8_e5m2, float> : MfmaF8<true, true> {};
#else
template <>
struct Mfma<int8_t, int8_t, int> : MfmaPlain {
  static constexpr int K = 16;
  using EA = signed char;
  using EB = signed char;
  TILED_FN static void issue(const EA* a, const EB* b, int* c) {
    isa::mfma_i32_16x16x16_i8(a, b, c);
  }
};
#endif

// KPL consecutive elements from p (aligned to their size when VEC).
template <bool VEC, int KPL, typename E>
TILED_FN void load_run(E* out, const E* p) {
  if constexpr (VEC) {
    __builtin_memcpy(out, __builtin_assume_aligned(p, KPL * sizeof(E)), KPL * sizeof(E));
  } else {
#pragma unroll
    for (int j = 0; j < KPL; ++j) out[j] = p[j];
  }
}

}  // namespace detail

// acc += op(A) @ op(B) on MFMA (layouts.MfmaLayout of targets/rocm): A is M x K (K x M when
// TRANS_A) with row stride LDA, B is K x N (N x K when TRANS_B) with row stride LDB, both in
// LDS. Wave w = threadIdx.x / 64 computes rows [wm * M / WARP_M, ...) and columns
// [wn * N / WARP_N, ...) (wm = w / WARP_N, wn = w % WARP_N) as 16 x 16 tiles, acc holding
// tile (mt, nt)'s registers at acc[(mt * NT + nt) * 4 ..]. For each K step, lane l reads
// A[row l % 16][k (l / 16) * KPL + j] and B[k][col l % 16] (AMD's operand layouts) and the
// wave issues one MFMA per tile. No barrier inside; every thread of the block must call.
template <typename TA, typename TB, typename TC, int M, int N, int K, int WARP_M, int WARP_N,
          bool TRANS_A, bool TRANS_B, int LDA, int LDB>
TILED_FN void gemm_mfma(const void* A_, const void* B_, TC* acc) {
  using Op = detail::Mfma<TA, TB, TC>;
  using EA = typename Op::EA;
  using EB = typename Op::EB;
  constexpr int KS = Op::K, KPL = KS / 4;
  constexpr int WM = M / WARP_M, WN = N / WARP_N, MT = WM / 16, NT = WN / 16;
  static_assert(M % (16 * WARP_M) == 0 && N % (16 * WARP_N) == 0 && K % KS == 0,
                "gemm_mfma: M, N must split into 16 x 16 tiles per wave, K into MFMA steps");
  constexpr bool VEC_A = !TRANS_A && LDA % KPL == 0 && KPL * sizeof(EA) % 4 == 0;
  constexpr bool VEC_B = TRANS_B && LDB % KPL == 0 && KPL * sizeof(EB) % 4 == 0;
  const EA* A = static_cast<const EA*>(A_);
  const EB* B = static_cast<const EB*>(B_);
  const int tid = (int)threadIdx.x, wave = tid / 64, lane = tid % 64;
  const int wm = wave / WARP_N, wn = wave % WARP_N;
  const int r16 = lane % 16, kq = (lane / 16) * KPL;
  Op::enter(acc, MT * NT * 4);
#pragma unroll
  for (int ks = 0; ks < K; ks += KS) {
    EA a[MT][KPL];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = wm * WM + mt * 16 + r16;
      if constexpr (TRANS_A) {
#pragma unroll
        for (int j = 0; j < KPL; ++j) a[mt][j] = A[(ks + kq + j) * LDA + row];
      } else {
        detail::load_run<VEC_A, KPL>(a[mt], A + row * LDA + ks + kq);
      }
      Op::fix(a[mt]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = wn * WN + nt * 16 + r16;
      EB b[KPL];
      if constexpr (TRANS_B) {
        detail::load_run<VEC_B, KPL>(b, B + col * LDB + ks + kq);
      } else {
#pragma unroll
        for (int j = 0; j < KPL; ++j) b[j] = B[(ks + kq + j) * LDB + col];
      }
      Op::fix(b);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) Op::issue(a[mt], b, acc + (mt * NT + nt) * 4);
    }
  }
  Op::leave(acc, MT * NT * 4);
}

}  // namespace tiled
