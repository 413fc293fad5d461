// Where a two-pass row op's time goes on this CPU, in C with AVX-512 intrinsics (no tiled
// code): a copy and RMSNorm over X [4096, 4096] float32 -> Y, on 2 threads (each a contiguous
// half of the rows), stores plain or non-temporal (streaming, no read for ownership), beside
// reading X alone and writing Y alone. Built and run by store_kinds.py; prints one JSON
// object per variant: the best and the median over interleaved rounds, in ms.
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROWS = 4096, COLS = 4096, THREADS = 2, ROUNDS = 31 };
static float *X, *Y, *Wt;
static volatile float sink;
static pthread_barrier_t start_bar, end_bar;
static volatile int variant;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void store(float* p, __m512 v, int nt) {
  if (nt) _mm512_stream_ps(p, v); else _mm512_storeu_ps(p, v);
}

static void copy_rows(int r0, int r1, int nt) {
  for (int r = r0; r < r1; ++r)
    for (int j = 0; j < COLS; j += 16)
      store(Y + (size_t)r * COLS + j, _mm512_loadu_ps(X + (size_t)r * COLS + j), nt);
}

static void read_rows(int r0, int r1) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (int r = r0; r < r1; ++r)
    for (int j = 0; j < COLS; j += 32) {
      a = _mm512_add_ps(a, _mm512_loadu_ps(X + (size_t)r * COLS + j));
      b = _mm512_add_ps(b, _mm512_loadu_ps(X + (size_t)r * COLS + j + 16));
    }
  sink = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

static void write_rows(int r0, int r1) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int r = r0; r < r1; ++r)
    for (int j = 0; j < COLS; j += 16) _mm512_stream_ps(Y + (size_t)r * COLS + j, one);
}

// Row by row: the sum of squares (the row from memory), then the output pass (the row from
// the cache), times the weight row when `weight`.
static void rms_rows(int r0, int r1, int nt, int weight) {
  for (int r = r0; r < r1; ++r) {
    const float* x = X + (size_t)r * COLS;
    float* y = Y + (size_t)r * COLS;
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    for (int j = 0; j < COLS; j += 32) {
      __m512 u = _mm512_loadu_ps(x + j), v = _mm512_loadu_ps(x + j + 16);
      a = _mm512_fmadd_ps(u, u, a);
      b = _mm512_fmadd_ps(v, v, b);
    }
    const __m512 s =
        _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(_mm512_add_ps(a, b)) / COLS + 1e-6f));
    for (int j = 0; j < COLS; j += 16) {
      __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), s);
      if (weight) v = _mm512_mul_ps(v, _mm512_loadu_ps(Wt + j));
      store(y + j, v, nt);
    }
  }
}

static const char* NAMES[] = {"copy", "copy_nt", "read_only", "write_only_nt", "rms_norm",
                              "rms_norm_nt", "rms_norm_nt_no_weight"};
enum { VARIANTS = sizeof(NAMES) / sizeof(NAMES[0]) };

static void work(int id, int v) {
  const int r0 = id * (ROWS / THREADS), r1 = r0 + ROWS / THREADS;
  switch (v) {
    case 0: copy_rows(r0, r1, 0); break;
    case 1: copy_rows(r0, r1, 1); break;
    case 2: read_rows(r0, r1); break;
    case 3: write_rows(r0, r1); break;
    case 4: rms_rows(r0, r1, 0, 1); break;
    case 5: rms_rows(r0, r1, 1, 1); break;
    default: rms_rows(r0, r1, 1, 0); break;
  }
}

static void* helper(void* arg) {
  const int id = *(int*)arg;
  for (;;) {
    pthread_barrier_wait(&start_bar);
    if (variant < 0) return NULL;
    work(id, variant);
    pthread_barrier_wait(&end_bar);
  }
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(void) {
  X = aligned_alloc(1 << 21, (size_t)ROWS * COLS * 4);
  Y = aligned_alloc(1 << 21, (size_t)ROWS * COLS * 4);
  Wt = aligned_alloc(64, COLS * 4);
  for (size_t i = 0; i < (size_t)ROWS * COLS; ++i) X[i] = (float)(i % 977) * 1e-3f, Y[i] = 0;
  for (int j = 0; j < COLS; ++j) Wt[j] = 1.0f + (float)(j % 7) * 1e-3f;
  pthread_barrier_init(&start_bar, NULL, THREADS);
  pthread_barrier_init(&end_bar, NULL, THREADS);
  pthread_t t[THREADS];
  int ids[THREADS];
  for (int i = 1; i < THREADS; ++i) ids[i] = i, pthread_create(&t[i], NULL, helper, &ids[i]);
  static double ms[VARIANTS][ROUNDS];
  for (int r = 0; r < ROUNDS; ++r)
    for (int v = 0; v < VARIANTS; ++v) {
      variant = v;
      const double t0 = now();
      pthread_barrier_wait(&start_bar);
      work(0, v);
      pthread_barrier_wait(&end_bar);
      ms[v][r] = (now() - t0) * 1e3;
    }
  variant = -1;
  pthread_barrier_wait(&start_bar);
  for (int v = 0; v < VARIANTS; ++v) {
    qsort(ms[v], ROUNDS, sizeof(double), cmp);
    printf("{\"variant\": \"%s\", \"best_ms\": %.4f, \"median_ms\": %.4f}\n", NAMES[v], ms[v][0],
           ms[v][ROUNDS / 2]);
  }
  return 0;
}
