// tiled_hip_math.h -- math for ROCm kernels without ROCm's device library (part of
// tiled_hip.h, which includes it after the element types). exp, exp2, log, log2 and sqrt use
// the hardware's instructions (the ISA layer's primitives); tanh, erf, sin / cos and pow are
// written here once, so the CPU emulation runs the same formulas as the GPU.
#pragma once

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
