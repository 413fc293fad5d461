// tiled_msl_cpu.h -- a CPU implementation of the part of Metal's standard library tiled's
// kernels use, for two builds of the shipped MSL text on Linux (no Metal compiler exists
// there): a type check (clang++ -fsyntax-only) and the emulation (linked with
// tiled_msl_runtime.cc: threads as fibers). Metal's address spaces are clang address spaces
// (device 1, constant 2, threadgroup 3; thread is the default one), so a pointer into one
// space assigned to another is a compile error, as in MSL; `double` is refused; vector types
// are clang extended vectors with MSL's constructors; simd functions, barriers and
// simdgroup matrices call the runtime, where they are the points at which threads meet.
// Every collective takes the line of its call (the MSL source's line) for error reports.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel extern "C"
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define MAXFLOAT 3.402823466e+38f

typedef _Float16 half;
typedef long double tiled_cpu_wide;  // the emulation's own sums (before `double` is refused)
constexpr half operator""h(long double v) { return (half)v; }
constexpr half operator""h(unsigned long long v) { return (half)v; }
#define double tiled_msl_has_no_double  // MSL has no double: any use is an error here

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __bf16 bfloat;

#define TILED_VEC(T, name)                                  \
  typedef T name##2 __attribute__((ext_vector_type(2)));    \
  typedef T name##3 __attribute__((ext_vector_type(3)));    \
  typedef T name##4 __attribute__((ext_vector_type(4)));    \
  typedef T packed_##name##2 __attribute__((ext_vector_type(2))); \
  typedef T packed_##name##3 __attribute__((ext_vector_type(3))); \
  typedef T packed_##name##4 __attribute__((ext_vector_type(4)));
TILED_VEC(float, float)
TILED_VEC(half, half)
TILED_VEC(bfloat, bfloat)
TILED_VEC(int, int)
TILED_VEC(uint, uint)
TILED_VEC(short, short)
TILED_VEC(ushort, ushort)
TILED_VEC(char, char)
TILED_VEC(uchar, uchar)
TILED_VEC(long, long)
TILED_VEC(ulong, ulong)
TILED_VEC(bool, bool)
#undef TILED_VEC

// The runtime (tiled_msl_runtime.cc); `line`: the caller's line in the MSL source.
extern "C" {
void* tiled_emu_threadgroup_alloc(size_t bytes, size_t align);
void tiled_emu_barrier(int line, int simdgroup);
int tiled_emu_simd_exchange(const void* mine, int bytes, void* all, int line, const char* what);
[[noreturn]] void tiled_emu_fail(const char* what, int line);
void tiled_emu_position(int which, unsigned* xyz);
int tiled_emu_lane(void);
}

namespace tiled_cpu {

template <typename T>
struct vec_traits {
  static constexpr int n = 1;
  using elem = T;
};
template <typename E, int N>
struct vec_traits<E __attribute__((ext_vector_type(N)))> {
  static constexpr int n = N;
  using elem = E;
};

template <typename V, typename A>
V convert_one(A a) {
  using E = typename vec_traits<V>::elem;
  if constexpr (vec_traits<A>::n == 1) {
    return V(E(a));  // a scalar: every lane
  } else {
    static_assert(vec_traits<A>::n == vec_traits<V>::n, "vector conversion between sizes");
    return __builtin_convertvector(a, V);
  }
}

// MSL's vector constructors: V(scalar), V(vector of another type), V(scalars and vectors
// whose lanes add up to V's).
template <typename V, typename... A>
V make(A... a) {
  if constexpr (sizeof...(A) == 1) {
    return convert_one<V>(a...);
  } else {
    using E = typename vec_traits<V>::elem;
    constexpr int N = vec_traits<V>::n;
    static_assert(((vec_traits<A>::n) + ...) == N, "vector constructor: wrong lane count");
    V v;
    int i = 0;
    auto put = [&](auto x) {
      using X = decltype(x);
      if constexpr (vec_traits<X>::n == 1) {
        v[i++] = E(x);
      } else {
        for (int j = 0; j < vec_traits<X>::n; ++j) v[i++] = E(x[j]);
      }
    };
    (put(a), ...);
    return v;
  }
}

template <typename F, typename V>
V map(F f, V x) {
  if constexpr (vec_traits<V>::n == 1) {
    return f(x);
  } else {
    V out;
    for (int i = 0; i < vec_traits<V>::n; ++i) out[i] = f(x[i]);
    return out;
  }
}

template <typename F, typename V>
V map2(F f, V x, V y) {
  if constexpr (vec_traits<V>::n == 1) {
    return f(x, y);
  } else {
    V out;
    for (int i = 0; i < vec_traits<V>::n; ++i) out[i] = f(x[i], y[i]);
    return out;
  }
}

template <typename T>
constexpr bool is_fp = std::is_same<typename vec_traits<T>::elem, float>::value ||
                       std::is_same<typename vec_traits<T>::elem, half>::value ||
                       std::is_same<typename vec_traits<T>::elem, bfloat>::value;

}  // namespace tiled_cpu

#define TILED_MAKE(name) ::tiled_cpu::make<::name>
#define float2(...) TILED_MAKE(float2)(__VA_ARGS__)
#define float3(...) TILED_MAKE(float3)(__VA_ARGS__)
#define float4(...) TILED_MAKE(float4)(__VA_ARGS__)
#define half2(...) TILED_MAKE(half2)(__VA_ARGS__)
#define half3(...) TILED_MAKE(half3)(__VA_ARGS__)
#define half4(...) TILED_MAKE(half4)(__VA_ARGS__)
#define bfloat2(...) TILED_MAKE(bfloat2)(__VA_ARGS__)
#define bfloat4(...) TILED_MAKE(bfloat4)(__VA_ARGS__)
#define int2(...) TILED_MAKE(int2)(__VA_ARGS__)
#define int3(...) TILED_MAKE(int3)(__VA_ARGS__)
#define int4(...) TILED_MAKE(int4)(__VA_ARGS__)
#define uint2(...) TILED_MAKE(uint2)(__VA_ARGS__)
#define uint3(...) TILED_MAKE(uint3)(__VA_ARGS__)
#define uint4(...) TILED_MAKE(uint4)(__VA_ARGS__)
#define short2(...) TILED_MAKE(short2)(__VA_ARGS__)
#define short4(...) TILED_MAKE(short4)(__VA_ARGS__)
#define ushort2(...) TILED_MAKE(ushort2)(__VA_ARGS__)
#define ushort4(...) TILED_MAKE(ushort4)(__VA_ARGS__)
#define char2(...) TILED_MAKE(char2)(__VA_ARGS__)
#define char4(...) TILED_MAKE(char4)(__VA_ARGS__)
#define uchar2(...) TILED_MAKE(uchar2)(__VA_ARGS__)
#define uchar4(...) TILED_MAKE(uchar4)(__VA_ARGS__)
#define long2(...) TILED_MAKE(long2)(__VA_ARGS__)
#define ulong2(...) TILED_MAKE(ulong2)(__VA_ARGS__)
#define bool2(...) TILED_MAKE(bool2)(__VA_ARGS__)
#define bool4(...) TILED_MAKE(bool4)(__VA_ARGS__)

namespace metal {

using std::conditional;
using std::is_floating_point;
using std::is_same;

// --- math ------------------------------------------------------------------------------------
// Half (and bfloat) math is computed in float and rounded once.
#define TILED_MATH1(name, expr)                                                        \
  template <typename T, typename = std::enable_if_t<tiled_cpu::is_fp<T>>>              \
  inline T name(T v) {                                                                 \
    return tiled_cpu::map(                                                             \
        [](auto x) {                                                                   \
          const float f = (float)x;                                                    \
          return (decltype(x))(expr);                                                  \
        },                                                                             \
        v);                                                                            \
  }
TILED_MATH1(exp, __builtin_expf(f))
TILED_MATH1(exp2, __builtin_exp2f(f))
TILED_MATH1(exp10, __builtin_powf(10.0f, f))
TILED_MATH1(log, __builtin_logf(f))
TILED_MATH1(log2, __builtin_log2f(f))
TILED_MATH1(log10, __builtin_log10f(f))
TILED_MATH1(sqrt, __builtin_sqrtf(f))
TILED_MATH1(rsqrt, 1.0f / __builtin_sqrtf(f))
TILED_MATH1(tanh, __builtin_tanhf(f))
TILED_MATH1(sin, __builtin_sinf(f))
TILED_MATH1(cos, __builtin_cosf(f))
TILED_MATH1(tan, __builtin_tanf(f))
TILED_MATH1(floor, __builtin_floorf(f))
TILED_MATH1(ceil, __builtin_ceilf(f))
TILED_MATH1(round, __builtin_roundf(f))
TILED_MATH1(rint, __builtin_rintf(f))
TILED_MATH1(trunc, __builtin_truncf(f))
TILED_MATH1(fabs, __builtin_fabsf(f))
#undef TILED_MATH1

template <typename T>
inline T abs(T v) {
  return tiled_cpu::map([](auto x) { return x < 0 ? decltype(x)(-x) : x; }, v);
}

#define TILED_MATH2(name, expr)                                                        \
  template <typename T, typename = std::enable_if_t<tiled_cpu::is_fp<T>>>              \
  inline T name(T a, T b) {                                                            \
    return tiled_cpu::map2(                                                            \
        [](auto x, auto y) {                                                           \
          const float f = (float)x, g = (float)y;                                      \
          return (decltype(x))(expr);                                                  \
        },                                                                             \
        a, b);                                                                         \
  }
TILED_MATH2(pow, __builtin_powf(f, g))
TILED_MATH2(powr, __builtin_powf(f, g))
TILED_MATH2(fmod, __builtin_fmodf(f, g))
TILED_MATH2(atan2, __builtin_atan2f(f, g))
TILED_MATH2(fmax, __builtin_fmaxf(f, g))
TILED_MATH2(fmin, __builtin_fminf(f, g))
TILED_MATH2(copysign, __builtin_copysignf(f, g))
#undef TILED_MATH2

// max / min of floating-point values are fmax / fmin (a NaN operand gives the other), as MSL
// specifies; of integers, the larger / smaller.
template <typename T>
inline T max(T a, T b) {
  return tiled_cpu::map2(
      [](auto x, auto y) {
        if constexpr (tiled_cpu::is_fp<decltype(x)>) {
          return (decltype(x))__builtin_fmaxf((float)x, (float)y);
        } else {
          return x > y ? x : y;
        }
      },
      a, b);
}
template <typename T>
inline T min(T a, T b) {
  return tiled_cpu::map2(
      [](auto x, auto y) {
        if constexpr (tiled_cpu::is_fp<decltype(x)>) {
          return (decltype(x))__builtin_fminf((float)x, (float)y);
        } else {
          return x < y ? x : y;
        }
      },
      a, b);
}
template <typename T>
inline T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}
template <typename T>
inline T fma(T a, T b, T c) {
  return a * b + c;
}
template <typename T>
inline bool isnan(T v) {
  return __builtin_isnan((float)v);
}
template <typename T>
inline bool isinf(T v) {
  return __builtin_isinf((float)v);
}
template <typename T>
inline bool isfinite(T v) {
  return __builtin_isfinite((float)v);
}
template <typename T>
inline bool signbit(T v) {
  return __builtin_signbit((float)v);
}
// select(a, b, c): c ? b : a, lane by lane for a vector c (a vector comparison here gives
// clang's int vector, -1 for true, where MSL gives a bool vector).
template <typename T, typename C>
inline T select(T a, T b, C c) {
  if constexpr (tiled_cpu::vec_traits<C>::n == 1) {
    return c ? b : a;
  } else {
    static_assert(tiled_cpu::vec_traits<C>::n == tiled_cpu::vec_traits<T>::n,
                  "select: condition and values of different lane counts");
    T out;
    for (int i = 0; i < tiled_cpu::vec_traits<T>::n; ++i) out[i] = c[i] ? b[i] : a[i];
    return out;
  }
}

template <typename T, typename U>
inline T as_type(U v) {
  static_assert(sizeof(T) == sizeof(U), "as_type between types of different sizes");
  T out;
  __builtin_memcpy(&out, &v, sizeof(T));
  return out;
}

// --- synchronization -------------------------------------------------------------------------

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

inline void threadgroup_barrier(mem_flags, int line = __builtin_LINE()) {
  tiled_emu_barrier(line, 0);
}
inline void simdgroup_barrier(mem_flags, int line = __builtin_LINE()) {
  tiled_emu_barrier(line, 1);
}

// --- simd functions ----------------------------------------------------------------------------

template <typename T>
inline int simd_all(T v, T* all, int line, const char* what) {
  static_assert(sizeof(T) <= 32, "simd function of a value wider than 32 bytes");
  return tiled_emu_simd_exchange(&v, sizeof(T), all, line, what);
}
// The simdgroup's values folded with `combine`, lane 0 first.
template <typename T, typename F>
inline T simd_fold(T v, int line, const char* what, F combine) {
  T all[32];
  const int n = simd_all(v, all, line, what);
  T s = all[0];
  for (int i = 1; i < n; ++i) s = combine(s, all[i]);
  return s;
}
template <typename T>
inline T simd_sum(T v, int line = __builtin_LINE()) {
  return simd_fold(v, line, "simd_sum", [](T a, T b) { return T(a + b); });
}
template <typename T>
inline T simd_max(T v, int line = __builtin_LINE()) {
  return simd_fold(v, line, "simd_max", [](T a, T b) { return max(a, b); });
}
template <typename T>
inline T simd_min(T v, int line = __builtin_LINE()) {
  return simd_fold(v, line, "simd_min", [](T a, T b) { return min(a, b); });
}
// The value of lane (lane ^ mask); a lane outside the simdgroup gives the caller's own.
template <typename T>
inline T simd_shuffle_xor(T v, ushort mask, int line = __builtin_LINE()) {
  T all[32];
  const int n = simd_all(v, all, line, "simd_shuffle_xor");
  const int src = tiled_emu_lane() ^ mask;
  return src < n ? all[src] : v;
}
template <typename T>
inline T simd_shuffle(T v, ushort lane, int line = __builtin_LINE()) {
  T all[32];
  const int n = simd_all(v, all, line, "simd_shuffle");
  return lane < n ? all[lane] : v;
}
template <typename T>
inline T simd_broadcast(T v, ushort lane, int line = __builtin_LINE()) {
  return simd_shuffle(v, lane, line);
}
template <typename T>
inline T simd_shuffle_down(T v, ushort delta, int line = __builtin_LINE()) {
  T all[32];
  const int n = simd_all(v, all, line, "simd_shuffle_down");
  const int src = tiled_emu_lane() + delta;
  return src < n ? all[src] : v;
}
template <typename T>
inline T simd_shuffle_up(T v, ushort delta, int line = __builtin_LINE()) {
  T all[32];
  simd_all(v, all, line, "simd_shuffle_up");
  const int src = tiled_emu_lane() - delta;
  return src >= 0 ? all[src] : v;
}

// --- simdgroup matrices -------------------------------------------------------------------------
// Each thread holds the whole matrix; load, store and multiply-accumulate are collective (all
// lanes meet there, with the same arguments, or it is an error). Which lane holds which element
// on a GPU is not modeled: tiled never depends on it (thread_elements() is not provided).

template <typename T, int Cols, int Rows>
struct simdgroup_matrix {
  T e[Rows][Cols];
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <typename T, int Cols, int Rows>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) m.e[r][c] = v;
  return m;
}

struct simdgroup_access {
  const void* ptr;
  ulong stride, ox, oy;
  int transpose;
};

inline void simdgroup_uniform(const void* ptr, ulong stride, ulong2 origin, bool transpose,
                              int line, const char* what) {
  simdgroup_access mine = {ptr, stride, origin.x, origin.y, transpose}, all[32];
  const int n = tiled_emu_simd_exchange(&mine, sizeof mine, all, line, what);
  for (int i = 0; i < n; ++i) {
    const simdgroup_access& o = all[i];  // field by field: the struct's padding is not set
    if (o.ptr != mine.ptr || o.stride != mine.stride || o.ox != mine.ox || o.oy != mine.oy ||
        o.transpose != mine.transpose)
      tiled_emu_fail("the lanes of a simdgroup pass different arguments to a simdgroup "
                     "matrix load / store", line);
  }
}

template <typename T, int C, int R>
inline void simdgroup_load_at(simdgroup_matrix<T, C, R>& d, const T* src, ulong stride,
                              ulong2 origin, bool transpose, int line) {
  simdgroup_uniform(src, stride, origin, transpose, line, "simdgroup_load");
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      d.e[r][c] = transpose ? src[(origin.y + c) * stride + origin.x + r]
                            : src[(origin.y + r) * stride + origin.x + c];
  tiled_emu_barrier(line, 1);  // every lane has read before any lane goes on
}
template <typename T, int C, int R>
inline void simdgroup_store_at(const simdgroup_matrix<T, C, R>& s, T* dst, ulong stride,
                               ulong2 origin, bool transpose, int line) {
  simdgroup_uniform(dst, stride, origin, transpose, line, "simdgroup_store");
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      (transpose ? dst[(origin.y + c) * stride + origin.x + r]
                 : dst[(origin.y + r) * stride + origin.x + c]) = s.e[r][c];
  tiled_emu_barrier(line, 1);
}

#define TILED_SIMDGROUP_ACCESS(SPACE)                                                         \
  template <typename T, int C, int R>                                                         \
  inline void simdgroup_load(simdgroup_matrix<T, C, R>& d, const SPACE T* src,                \
                             ulong stride = C, ulong2 origin = ulong2(0), bool transpose = false, \
                             int line = __builtin_LINE()) {                                   \
    simdgroup_load_at(d, (const T*)src, stride, origin, transpose, line);                     \
  }                                                                                           \
  template <typename T, int C, int R>                                                         \
  inline void simdgroup_store(const simdgroup_matrix<T, C, R>& s, SPACE T* dst,               \
                              ulong stride = C, ulong2 origin = ulong2(0),                    \
                              bool transpose = false, int line = __builtin_LINE()) {          \
    simdgroup_store_at(s, (T*)dst, stride, origin, transpose, line);                          \
  }
TILED_SIMDGROUP_ACCESS(device)
TILED_SIMDGROUP_ACCESS(threadgroup)
#undef TILED_SIMDGROUP_ACCESS

// d = a * b + c, each element summed in long double and rounded once to d's type (the hardware's
// internal rounding is not modeled).
template <typename TD, typename TA, typename TB, typename TC, int N, int K, int M>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, M>& d,
                                          const simdgroup_matrix<TA, K, M>& a,
                                          const simdgroup_matrix<TB, N, K>& b,
                                          const simdgroup_matrix<TC, N, M>& c,
                                          int line = __builtin_LINE()) {
  tiled_emu_barrier(line, 1);  // collective: every lane of the simdgroup takes part
  simdgroup_matrix<TD, N, M> out;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      tiled_cpu_wide s = (tiled_cpu_wide)(float)c.e[i][j];
      for (int k = 0; k < K; ++k) s += (tiled_cpu_wide)(float)a.e[i][k] * (float)b.e[k][j];
      out.e[i][j] = (TD)s;
    }
  d = out;
}

// --- atomics -------------------------------------------------------------------------------------
// Threads run one at a time between meeting points: every read-modify-write is atomic.

enum memory_order { memory_order_relaxed = 0 };
template <typename T>
struct tiled_atomic {
  T v;
};
typedef tiled_atomic<int> atomic_int;
typedef tiled_atomic<uint> atomic_uint;
typedef tiled_atomic<float> atomic_float;

template <typename P, typename V>
inline auto atomic_fetch_add_explicit(P obj, V v, memory_order) {
  const auto old = obj->v;
  obj->v = old + v;
  return old;
}
template <typename P, typename V>
inline auto atomic_fetch_max_explicit(P obj, V v, memory_order) {
  const auto old = obj->v;
  obj->v = old > v ? old : v;
  return old;
}
template <typename P, typename V>
inline auto atomic_fetch_min_explicit(P obj, V v, memory_order) {
  const auto old = obj->v;
  obj->v = old < v ? old : v;
  return old;
}
template <typename P>
inline auto atomic_load_explicit(P obj, memory_order) {
  return obj->v;
}
template <typename P, typename V>
inline bool atomic_compare_exchange_weak_explicit(P obj, V* expected, V desired, memory_order,
                                                  memory_order) {
  if (obj->v == *expected) {
    obj->v = desired;
    return true;
  }
  *expected = obj->v;
  return false;
}

}  // namespace metal

// A threadgroup array declared in a kernel (`threadgroup T name[N];`, which C++ cannot give an
// address space) becomes a reference to the threadgroup's memory (emulate.py rewrites the
// declaration; the runtime gives every thread of the group the same storage).
#define TILED_THREADGROUP_ARRAY(T, name, n)      \
  threadgroup T(&name)[n] = *(threadgroup T(*)[n]) \
      tiled_emu_threadgroup_alloc(sizeof(T) * (n), alignof(T) < 16 ? 16 : alignof(T))
