/*
 * gemm.c: T.gemm on a CPU, C += A @ B over one block's tiles, accumulated in float32.
 *
 * The lowering (lower.py, stmt_gemm) calls tiled_gemm_f32 once per T.gemm. Operands are a
 * block's own tiles (shared / fragment buffers: small, hot in L1 / L2), so the work is a
 * register-blocked microkernel rather than a full GotoBLAS: an MR x NR block of C lives in
 * vector registers (MR rows, NR = two vectors of columns) while k walks a panel: each step
 * loads one row of B (two vectors) and broadcasts MR elements of A, MR x 2 fused multiply-adds.
 *
 *   - A is read in place through its strides (a broadcast from memory costs what a load
 *     costs, whatever the stride), B in place when its rows are contiguous float32. A 16-bit
 *     operand is first converted to float32 scratch (float16: F16C / AVX-512 conversions
 *     where the target has them, else integer arithmetic that vectorizes; bfloat16: a
 *     shift), a transposed B is packed row-major; both cost O(MK + KN) against the O(MNK)
 *     products.
 *   - k is split into KC-long panels, and each KC x NR panel of B is packed (its rows
 *     contiguous, the last N % NR columns zero-padded) into a buffer of 16 KB, half an L1:
 *     every MR-row block of C walks it. In place, B's rows are a tile's row stride apart
 *     (512 bytes to 1 KB for 128 or 256 float32 columns), so a panel's 64 rows fell into
 *     4 to 8 of L1's 64 sets and evicted each other.
 *   - The last M % MR rows run a microkernel compiled for that row count; the last N % NR
 *     columns compute into a zeroed scratch block and add only the valid part.
 *   - Fewer than MR rows against a transposed B (attention's q @ k^T at decode) skip the
 *     microkernel: each column of B is converted once and dotted with A's rows.
 *
 * The vector width and MR follow the compiler flags the shim is built with (the target's
 * level, tiled.runtime.cpu_levels): 64-byte vectors with AVX-512 (8 x 32 block: 16 of 32
 * zmm registers accumulate), 32 with AVX (6 x 16: 12 of 16 ymm), 16 otherwise (6 x 8 on SSE,
 * 8 x 8 on NEON's 32 registers). Scratch is per thread and grows as needed; if it cannot be
 * allocated, a plain loop that needs none runs instead. Thread-safe.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define HIDDEN __attribute__((visibility("hidden")))

#if defined(__AVX512F__)
#define VB 64
#define MR 8
#elif defined(__AVX__)
#define VB 32
#define MR 6
#elif defined(__aarch64__)
#define VB 16
#define MR 8
#else
#define VB 16
#define MR 6
#endif
#define VL (VB / 4)
#define NR (2 * VL)
#define KC (4096 / NR) /* a packed B panel: KC x NR float32, 16 KB */

typedef float vf __attribute__((vector_size(VB)));
typedef int32_t vi __attribute__((vector_size(VB)));
typedef float vf_unaligned __attribute__((vector_size(VB), aligned(4)));

enum { kF32 = 0, kF16 = 1, kBF16 = 2 };

/* ---- 16-bit floats to float32 -------------------------------------------------------------- */

static inline float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* IEEE half to float in integer arithmetic (selects, no branches, so loops of it vectorize):
   a normal's exponent is rebiased by 127 - 15; a subnormal m * 2^-24 is 2^-14 * (1 + m / 1024)
   less 2^-14; Inf / NaN keep an all-ones exponent and their payload. */
static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t rest = h & 0x7fffu;
  float normal = bits_to_float((rest << 13) + 0x38000000u);       /* exponent + 112 */
  float sub = bits_to_float((rest << 13) | 0x38800000u) - 6.103515625e-05f;
  float inf_nan = bits_to_float((rest << 13) | 0x7f800000u);
  float mag = rest >= 0x7c00u ? inf_nan : rest >= 0x0400u ? normal : sub;
  uint32_t u;
  memcpy(&u, &mag, sizeof u);
  return bits_to_float(u | sign);
}

static void convert_f16(float* dst, const uint16_t* src, long n) {
  long i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + i))));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
#endif
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

/* bfloat16 is the upper half of a float32: a widening and a shift, VL lanes at a time (written
   as vectors: at -O2 GCC leaves a loop that needs a scalar tail unvectorized). */
typedef uint16_t vu16 __attribute__((vector_size(VB / 2)));
typedef uint32_t vu32 __attribute__((vector_size(VB)));

static void convert_bf16(float* dst, const uint16_t* src, long n) {
  long i = 0;
  for (; i + VL <= n; i += VL) {
    vu16 h;
    memcpy(&h, src + i, sizeof h);
    vu32 w = __builtin_convertvector(h, vu32) << 16;
    memcpy(dst + i, &w, sizeof w);
  }
  for (; i < n; ++i) dst[i] = bits_to_float((uint32_t)src[i] << 16);
}

static void convert(float* dst, const void* src, int dtype, long n) {
  if (dtype == kF16)
    convert_f16(dst, (const uint16_t*)src, n);
  else if (dtype == kBF16)
    convert_bf16(dst, (const uint16_t*)src, n);
  else
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static inline float element(const void* p, int dtype, long i) {
  if (dtype == kF16) return half_to_float(((const uint16_t*)p)[i]);
  if (dtype == kBF16) return bits_to_float((uint32_t)((const uint16_t*)p)[i] << 16);
  return ((const float*)p)[i];
}

/* ---- per-thread scratch -------------------------------------------------------------------- */

static __thread float* scratch;
static __thread size_t scratch_floats;

/* Scratch of at least `n` floats, 64-byte aligned, or NULL when it cannot be allocated. */
static float* scratch_of(size_t n) {
  if (n <= scratch_floats) return scratch;
  void* p = NULL;
  size_t want = n + n / 2;
  if (posix_memalign(&p, 64, want * sizeof(float)) != 0) return NULL;
  free(scratch);
  scratch = (float*)p;
  scratch_floats = want;
  return scratch;
}

/* ---- the microkernel ----------------------------------------------------------------------- */

/* x in every lane: a shuffle of lane 0 is one broadcast from memory (`x + (vf){0}` would add,
   since x may be -0.0). */
static inline __attribute__((always_inline)) vf splat(float x) {
  return __builtin_shuffle((vf){x}, (vi){0});
}

/* c[r * ldc + j] += sum_p a_r[p * a_cs] * b[p * NR + j] for r < rows, j < NR (b: a packed
   panel); `rows` (at most MR) is a constant where this is inlined, so each row count gets its
   own code. */
static inline __attribute__((always_inline)) void micro(long kc, const float* const* a_rows,
                                                        long a_cs, const float* b, float* c,
                                                        long ldc, const int rows) {
  vf acc[MR][2];
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = (vf){0};
  for (long p = 0; p < kc; ++p) {
    vf b0 = *(const vf*)(b + p * NR);
    vf b1 = *(const vf*)(b + p * NR + VL);
#pragma GCC unroll 16
    for (int r = 0; r < rows; ++r) {
      vf a = splat(a_rows[r][p * a_cs]);
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < rows; ++r) {
    *(vf_unaligned*)(c + r * ldc) += acc[r][0];
    *(vf_unaligned*)(c + r * ldc + VL) += acc[r][1];
  }
}

#if MR > 6
#define MICRO_ROWS_7_8(A_CS) \
  case 7: micro(kc, a_rows, A_CS, b, c, ldc, 7); return; \
  case 8: micro(kc, a_rows, A_CS, b, c, ldc, 8); return;
#else
#define MICRO_ROWS_7_8(A_CS)
#endif
/* One switch over the row count, A's column stride A_CS (1: a constant, so the
   broadcasts address contiguously). */
#define MICRO_ROWS(A_CS)                                       \
  switch (rows) {                                              \
    case 1: micro(kc, a_rows, A_CS, b, c, ldc, 1); return; \
    case 2: micro(kc, a_rows, A_CS, b, c, ldc, 2); return; \
    case 3: micro(kc, a_rows, A_CS, b, c, ldc, 3); return; \
    case 4: micro(kc, a_rows, A_CS, b, c, ldc, 4); return; \
    case 5: micro(kc, a_rows, A_CS, b, c, ldc, 5); return; \
    case 6: micro(kc, a_rows, A_CS, b, c, ldc, 6); return; \
    MICRO_ROWS_7_8(A_CS)                                       \
  }

/* micro over `rows` rows (1 .. MR), A's columns contiguous or not. */
static void micro_any(long kc, const float* const* a_rows, long a_cs, const float* b,
                      float* c, long ldc, int rows) {
  if (a_cs == 1)
    MICRO_ROWS(1)
  else
    MICRO_ROWS(a_cs)
}

/* One KC panel: c (m x n, row stride ldc) += a (m x kc, strides a_rs / a_cs) @ b (kc x n, row
   stride ldb, contiguous rows). */
static void panel(float* c, long ldc, const float* a, long a_rs, long a_cs, const float* b,
                  long ldb, long m, long n, long kc) {
  float edge_c[MR * NR] __attribute__((aligned(64)));
  float packed_b[KC * NR] __attribute__((aligned(64)));
  const float* rows[MR];
  for (long j0 = 0; j0 < n; j0 += NR) {
    long nr = n - j0 < NR ? n - j0 : NR;
    if (nr == NR) { /* a constant size: vector moves, not a call per row */
      for (long p = 0; p < kc; ++p)
        memcpy(packed_b + p * NR, b + p * ldb + j0, NR * sizeof(float));
    } else {
      for (long p = 0; p < kc; ++p) {
        memcpy(packed_b + p * NR, b + p * ldb + j0, (size_t)nr * sizeof(float));
        memset(packed_b + p * NR + nr, 0, (size_t)(NR - nr) * sizeof(float));
      }
    }
    for (long i0 = 0; i0 < m; i0 += MR) {
      long mr = m - i0 < MR ? m - i0 : MR;
      for (int r = 0; r < mr; ++r) rows[r] = a + (i0 + r) * a_rs;
      if (nr == NR) {
        micro_any(kc, rows, a_cs, packed_b, c + i0 * ldc + j0, ldc, (int)mr);
        continue;
      }
      memset(edge_c, 0, sizeof edge_c);
      micro_any(kc, rows, a_cs, packed_b, edge_c, NR, (int)mr);
      for (long r = 0; r < mr; ++r)
        for (long j = 0; j < nr; ++j) c[(i0 + r) * ldc + j0 + j] += edge_c[r * NR + j];
    }
  }
}

/* Few rows of C and a transposed B (attention's q @ k^T at decode: a handful of query rows
   against many keys): each of B's columns (a contiguous row of B^T) is converted once and
   dotted with every row of A, VL products at a time, instead of packing B for the
   microkernel, whose MR rows the few rows would leave mostly empty. `a` float32 with
   contiguous rows (a_cs == 1); `col` scratch for k floats. */
static void gemm_dots(float* c, long ldc, const float* a, long a_rs, const void* b, long b_cs,
                      int b_dtype, long m, long n, long k, float* col) {
  long esz = b_dtype == kF32 ? 4 : 2;
  for (long j = 0; j < n; ++j) {
    convert(col, (const char*)b + (size_t)j * b_cs * esz, b_dtype, k);
    for (long i = 0; i < m; ++i) {
      const float* ar = a + i * a_rs;
      vf acc0 = (vf){0}, acc1 = (vf){0};
      long p = 0;
      for (; p + 2 * VL <= k; p += 2 * VL) {
        acc0 += *(const vf_unaligned*)(ar + p) * *(const vf_unaligned*)(col + p);
        acc1 += *(const vf_unaligned*)(ar + p + VL) * *(const vf_unaligned*)(col + p + VL);
      }
      acc0 += acc1;
      float sum = 0;
      for (int l = 0; l < VL; ++l) sum += acc0[l];
      for (; p < k; ++p) sum += ar[p] * col[p];
      c[i * ldc + j] += sum;
    }
  }
}

/* Without scratch: one product at a time. */
static void gemm_plain(float* c, long ldc, const void* a, long a_rs, long a_cs, int a_dtype,
                       const void* b, long b_rs, long b_cs, int b_dtype, long m, long n,
                       long k) {
  for (long i = 0; i < m; ++i)
    for (long p = 0; p < k; ++p) {
      float av = element(a, a_dtype, i * a_rs + p * a_cs);
      for (long j = 0; j < n; ++j) c[i * ldc + j] += av * element(b, b_dtype, p * b_rs + j * b_cs);
    }
}

/* C (m x n float32, row stride ldc) += A @ B, where A's element (i, p) is a[i * a_rs + p * a_cs]
   and B's element (p, j) is b[p * b_rs + j * b_cs], each of dtype kF32, kF16 or kBF16. Strides
   are positive element counts (the tiles a T.gemm takes are whole, row-major buffers). */
HIDDEN void tiled_gemm_f32(float* c, int32_t ldc, const void* a, int32_t a_rs, int32_t a_cs,
                           int32_t a_dtype, const void* b, int32_t b_rs, int32_t b_cs,
                           int32_t b_dtype, int32_t m, int32_t n, int32_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  long a_span = (long)(m - 1) * a_rs + (long)(k - 1) * a_cs + 1;
  if (m < MR && a_cs == 1 && b_rs == 1 && b_cs >= k) { /* few rows, B transposed */
    float* buf = scratch_of((a_dtype == kF32 ? 0 : (size_t)a_span) + (size_t)k);
    if (buf != NULL) {
      const float* af = (const float*)a;
      if (a_dtype != kF32) {
        convert(buf, a, a_dtype, a_span);
        af = buf;
        buf += a_span;
      }
      gemm_dots(c, ldc, af, a_rs, b, b_cs, b_dtype, m, n, k, buf);
      return;
    }
  }
  int b_direct = b_dtype == kF32 && b_cs == 1;
  long ldb = b_direct ? b_rs : ((long)n + VL - 1) / VL * VL;
  size_t need = (a_dtype == kF32 ? 0 : (size_t)a_span) + (b_direct ? 0 : (size_t)k * ldb + k);
  float* buf = need ? scratch_of(need) : NULL;
  if (need && buf == NULL) {
    gemm_plain(c, ldc, a, a_rs, a_cs, a_dtype, b, b_rs, b_cs, b_dtype, m, n, k);
    return;
  }
  const float* af = (const float*)a;
  if (a_dtype != kF32) {
    convert(buf, a, a_dtype, a_span);
    af = buf;
    buf += a_span;
  }
  const float* bf = (const float*)b;
  if (!b_direct) {
    if (b_cs == 1) {
      for (long p = 0; p < k; ++p)
        convert(buf + p * ldb, (const char*)b + (size_t)p * b_rs * (b_dtype == kF32 ? 4 : 2),
                b_dtype, n);
    } else if (b_rs == 1 && b_cs >= k) { /* transposed, columns contiguous: each converted
                                              into row k of the scratch, then spread */
      float* col = buf + k * ldb;
      for (long j = 0; j < n; ++j) {
        convert(col, (const char*)b + (size_t)j * b_cs * (b_dtype == kF32 ? 4 : 2), b_dtype, k);
        for (long p = 0; p < k; ++p) buf[p * ldb + j] = col[p];
      }
    } else {
      for (long j = 0; j < n; ++j)
        for (long p = 0; p < k; ++p) buf[p * ldb + j] = element(b, b_dtype, j * b_cs + p * b_rs);
    }
    bf = buf;
  }
  for (long p0 = 0; p0 < k; p0 += KC) {
    long kc = k - p0 < KC ? k - p0 : KC;
    panel(c, ldc, af + p0 * a_cs, a_rs, a_cs, bf + p0 * ldb, ldb, m, n, kc);
  }
}
