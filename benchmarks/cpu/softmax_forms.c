/* Softmax over X [4096, 4096] float32 on 2 threads, AVX2 + FMA intrinsics, no tiled code:
 * where the time of a three-pass row softmax goes on this machine (softmax_forms.py runs it).
 * Each row: its max; exp2((x - max) log2 e) into a buffer, summed; the buffer times 1 / sum
 * into Y. Variants differ in the buffer, Y's stores and the exponential:
 *   y_*:    the exponentials go to Y itself, normalized in place (Y's lines are fetched for
 *           ownership while the exponentials are computed);
 *   tile_*: into a per-thread row buffer, then the normalized row to Y with plain stores
 *           (tiled.ops' softmax on the cpu backend has this form);
 *   nt_*:   the same with non-temporal stores of the normalized row (no read for ownership).
 *   block4: nt_ftz's work in blocks of 4 rows, as tiled.ops' kernel on cpu runs it (its
 *           blk_m): the 4 maxes, the 4 rows' exponentials into a 64 KiB buffer prefetching the
 *           next block, then the 4 normalized rows stored non-temporally;
 *   pipe4:  block4 skewed across blocks: one loop computes block b's exponentials (into one of
 *           two buffers, prefetching block b + 1) and stores block b - 1's normalized rows, so
 *           the reads of the next block and the writes of the last one overlap, as in a copy.
 *   *_exact: exp2 clamped to [-151, 129], 2^n as two factors (subnormal results kept);
 *   *_ftz:   exp2 clamped above at 128, 2^n added to the exponent field, results below 2^-126
 *            flushed to 0 (the cpu backend's exp2 on AVX2 since 2026-12-06).
 * Every exponential pass prefetches the next row of X, one line per 16 elements, as tiled's
 * kernel prefetches its next block. Plus a copy with plain and with non-temporal stores.
 * Rounds interleave the variants; per variant the best and the median time, and the median
 * over rounds of (the round's plain copy time / the variant's). One JSON line per variant. */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROWS = 4096, COLS = 4096, THREADS = 2, ROUNDS = 21 };
enum { COPY, COPY_NT, Y_EXACT, Y_FTZ, TILE_EXACT, TILE_FTZ, NT_EXACT, NT_FTZ, BLOCK4, PIPE4,
       N_VARIANTS };
static const char *NAMES[N_VARIANTS] = {"copy",     "copy_nt", "y_exact", "y_ftz",
                                        "tile_exact", "tile_ftz", "nt_exact", "nt_ftz",
                                        "block4",   "pipe4"};
static float *X, *Y;
static int current;

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __m256 k(float v) { return _mm256_set1_ps(v); }

static inline __m256 poly2(__m256 f) { /* 2^f on [-1/2, 1/2], the cpu backend's coefficients */
  __m256 p = k(1.5353361959569156e-04f);
  p = _mm256_fmadd_ps(p, f, k(1.3398875016719103e-03f));
  p = _mm256_fmadd_ps(p, f, k(9.61843691766262e-03f));
  p = _mm256_fmadd_ps(p, f, k(5.5503323674201965e-02f));
  p = _mm256_fmadd_ps(p, f, k(0.24022647738456726f));
  p = _mm256_fmadd_ps(p, f, k(0.6931471824645996f));
  return _mm256_fmadd_ps(p, f, k(1.0f));
}

static inline __m256 pow2i(__m256i e) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

static inline __m256 exp2_exact(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, k(-151.f)), k(129.f));
  __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 p = poly2(_mm256_sub_ps(x, n));
  __m256i e = _mm256_cvttps_epi32(n), half = _mm256_srai_epi32(e, 1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(half)), pow2i(_mm256_sub_epi32(e, half)));
}

static inline __m256 exp2_ftz(__m256 x) {
  __m256 c = _mm256_min_ps(x, k(128.f));
  __m256 n = _mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 p = poly2(_mm256_sub_ps(c, n));
  __m256i shifted = _mm256_slli_epi32(_mm256_cvttps_epi32(n), 23);
  __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), shifted));
  return _mm256_and_ps(_mm256_cmp_ps(x, k(-126.f), _CMP_NLT_UQ), r);
}

static float hmax(__m256 v) {
  float t[8], m;
  _mm256_storeu_ps(t, v);
  m = t[0];
  for (int i = 1; i < 8; i++) m = t[i] > m ? t[i] : m;
  return m;
}

static float hsum(__m256 v) {
  float t[8], s = 0;
  _mm256_storeu_ps(t, v);
  for (int i = 0; i < 8; i++) s += t[i];
  return s;
}

static void softmax_row(const float *x, float *y, float *buf, int variant) {
  int ftz = variant == Y_FTZ || variant == TILE_FTZ || variant == NT_FTZ;
  float *e = variant == Y_EXACT || variant == Y_FTZ ? y : buf;
  __m256 m0 = k(-INFINITY), m1 = m0;
  for (int j = 0; j < COLS; j += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
  }
  const float log2e = 1.4426950408889634f;
  __m256 shift = k(hmax(_mm256_max_ps(m0, m1)) * log2e), scale = k(log2e);
  __m256 s0 = k(0), s1 = k(0);
  for (int j = 0; j < COLS; j += 16) {
    _mm_prefetch((const char *)(x + COLS + j), _MM_HINT_T1);
    __m256 a = _mm256_fmsub_ps(_mm256_loadu_ps(x + j), scale, shift);
    __m256 b = _mm256_fmsub_ps(_mm256_loadu_ps(x + j + 8), scale, shift);
    a = ftz ? exp2_ftz(a) : exp2_exact(a);
    b = ftz ? exp2_ftz(b) : exp2_exact(b);
    _mm256_storeu_ps(e + j, a);
    _mm256_storeu_ps(e + j + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  __m256 r = k(1.f / hsum(_mm256_add_ps(s0, s1)));
  if (variant == NT_EXACT || variant == NT_FTZ)
    for (int j = 0; j < COLS; j += 8) _mm256_stream_ps(y + j, _mm256_mul_ps(_mm256_load_ps(e + j), r));
  else
    for (int j = 0; j < COLS; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(e + j), r));
}

static const float LOG2E = 1.4426950408889634f;

static void block_max(const float *x, float *mx) {
  for (int r = 0; r < 4; r++) {
    __m256 m0 = k(-INFINITY), m1 = m0;
    for (int j = 0; j < COLS; j += 16) {
      m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + r * COLS + j));
      m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + r * COLS + j + 8));
    }
    mx[r] = hmax(_mm256_max_ps(m0, m1)) * LOG2E;
  }
}

/* 16 exponentials of the block's row at x into e, prefetching the next block's row, summed
   into s0 and s1. */
static inline void exp16(const float *x, float *e, __m256 sh, __m256 *s0, __m256 *s1) {
  _mm_prefetch((const char *)(x + 4 * COLS), _MM_HINT_T1);
  __m256 a = exp2_ftz(_mm256_fmsub_ps(_mm256_loadu_ps(x), k(LOG2E), sh));
  __m256 b = exp2_ftz(_mm256_fmsub_ps(_mm256_loadu_ps(x + 8), k(LOG2E), sh));
  _mm256_store_ps(e, a);
  _mm256_store_ps(e + 8, b);
  *s0 = _mm256_add_ps(*s0, a);
  *s1 = _mm256_add_ps(*s1, b);
}

/* Row r of the block at x: its exponentials into e, and 1 / their sum. */
static float row_exp(const float *x, float *e, float shift) {
  __m256 s0 = k(0), s1 = k(0);
  for (int j = 0; j < COLS; j += 16) exp16(x + j, e + j, k(shift), &s0, &s1);
  return 1.f / hsum(_mm256_add_ps(s0, s1));
}

static void block4(const float *x, float *y, float *buf) {
  float mx[4], inv[4];
  block_max(x, mx);
  for (int r = 0; r < 4; r++) inv[r] = row_exp(x + r * COLS, buf + r * COLS, mx[r]);
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < COLS; j += 8)
      _mm256_stream_ps(y + r * COLS + j, _mm256_mul_ps(_mm256_load_ps(buf + r * COLS + j),
                                                       k(inv[r])));
}

/* Blocks [0, n) of 4 rows from x: block b's exponentials and block b - 1's stores in one loop. */
static void pipe4(const float *x, float *y, long n, float *buf) {
  float inv_prev[4] = {0}, mx[4], inv[4];
  for (long b = 0; b <= n; b++) {
    float *cur = buf + (b & 1) * 4 * COLS, *prev = buf + ((b + 1) & 1) * 4 * COLS;
    const float *xb = x + b * 4 * COLS;
    float *yp = y + (b - 1) * 4 * COLS;
    if (b < n) block_max(xb, mx);
    for (int r = 0; r < 4; r++) {
      __m256 sh = k(b < n ? mx[r] : 0), v = k(inv_prev[r]), s0 = k(0), s1 = k(0);
      const float *xr = xb + r * COLS;
      float *e = cur + r * COLS, *pe = prev + r * COLS;
      for (int j = 0; j < COLS; j += 16) {
        if (b < n) exp16(xr + j, e + j, sh, &s0, &s1);
        if (b > 0) {
          _mm256_stream_ps(yp + r * COLS + j, _mm256_mul_ps(_mm256_load_ps(pe + j), v));
          _mm256_stream_ps(yp + r * COLS + j + 8, _mm256_mul_ps(_mm256_load_ps(pe + j + 8), v));
        }
      }
      inv[r] = b < n ? 1.f / hsum(_mm256_add_ps(s0, s1)) : 0;
    }
    memcpy(inv_prev, inv, sizeof inv);
  }
}

static void *work(void *arg) {
  long id = (long)arg;
  float *buf = aligned_alloc(64, 8 * COLS * sizeof(float));
  long first = id * (ROWS / THREADS);
  if (current == PIPE4) {
    pipe4(X + first * COLS, Y + first * COLS, ROWS / THREADS / 4, buf);
    _mm_sfence();
    free(buf);
    return NULL;
  }
  for (long i = first; i < first + ROWS / THREADS; i++) {
    const float *x = X + i * COLS;
    float *y = Y + i * COLS;
    if (current == BLOCK4) {
      if (i % 4 == 0) block4(x, y, buf);
    } else if (current == COPY)
      for (int j = 0; j < COLS; j += 8) _mm256_storeu_ps(y + j, _mm256_loadu_ps(x + j));
    else if (current == COPY_NT)
      for (int j = 0; j < COLS; j += 8) _mm256_stream_ps(y + j, _mm256_loadu_ps(x + j));
    else
      softmax_row(x, y, buf, current);
  }
  _mm_sfence();
  free(buf);
  return NULL;
}

static double run(int variant) {
  pthread_t t[THREADS];
  current = variant;
  double t0 = seconds();
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  return seconds() - t0;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(void) {
  static double ms[N_VARIANTS][ROUNDS], of_copy[N_VARIANTS][ROUNDS];
  X = aligned_alloc(64, (size_t)ROWS * COLS * sizeof(float));
  Y = aligned_alloc(64, (size_t)ROWS * COLS * sizeof(float));
  srand(1);
  for (size_t i = 0; i < (size_t)ROWS * COLS; i++) X[i] = (rand() / (float)RAND_MAX - 0.5f) * 8;
  memset(Y, 0, (size_t)ROWS * COLS * sizeof(float));
  float *want = aligned_alloc(64, (size_t)ROWS * COLS * sizeof(float));
  run(NT_FTZ);
  memcpy(want, Y, (size_t)ROWS * COLS * sizeof(float));
  for (int v = BLOCK4; v <= PIPE4; v++) { /* the blocked forms compute nt_ftz's values */
    memset(Y, 0, (size_t)ROWS * COLS * sizeof(float));
    run(v);
    if (memcmp(want, Y, (size_t)ROWS * COLS * sizeof(float)) != 0) {
      fprintf(stderr, "%s differs from nt_ftz\n", NAMES[v]);
      return 1;
    }
  }
  free(want);
  for (int v = 0; v < N_VARIANTS; v++) run(v); /* warm up: pages, caches */
  for (int r = 0; r < ROUNDS; r++) {
    double copy = 0;
    for (int v = 0; v < N_VARIANTS; v++) {
      double t = run(v);
      if (v == COPY) copy = t;
      ms[v][r] = t * 1e3;
      of_copy[v][r] = copy / t;
    }
  }
  for (int v = 0; v < N_VARIANTS; v++) {
    qsort(ms[v], ROUNDS, sizeof(double), by_value);
    qsort(of_copy[v], ROUNDS, sizeof(double), by_value);
    printf("{\"variant\": \"%s\", \"best_ms\": %.4f, \"median_ms\": %.4f, "
           "\"of_copy_median_of_rounds\": %.3f}\n",
           NAMES[v], ms[v][0], ms[v][ROUNDS / 2], of_copy[v][ROUNDS / 2]);
  }
  return 0;
}
