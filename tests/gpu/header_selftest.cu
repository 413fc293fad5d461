// Standalone GPU self-test for tiled/compiler/backends/cuda_include/tiled_cuda.h.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
//        -I tiled/compiler/backends/cuda_include tests/gpu/header_selftest.cu -o selftest
//   ./selftest
//
// Prints "PASS <name> <max_abs_err>" or "FAIL <name> ..." per case and a final
// "<N> passed, <M> failed"; exits nonzero on any failure.  Every CUDA call is
// checked; a CUDA error fails the current case and ends the run (errors from
// kernels are sticky, so nothing after them would be meaningful).
//
// What is checked:
//  * gemm_ss (half, bf16): 6 shapes x 4 transpose combos x {unpadded, padded}
//    strides.  One block per case: A/B are copied into shared memory with
//    plain loads (padding columns filled with NaN so that reading them shows
//    up), acc starts from a known nonzero pattern, gemm_ss runs twice
//    (checks "+="), results leave through acc_coord into a NaN-poisoned C.
//    Reference in double from the same rounded inputs: C = init + 2 * A@B.
//    Tolerance per element: rtol * (|init| + 2 * sum_k |a_k b_k|), rtol =
//    2e-3 (half) / 1e-2 (bf16): a relative tolerance on a scale that grows
//    with K.  (Inputs are exact in fp32 and products are exact, so real errors
//    are ~1e-6 relative; any indexing mistake gives O(1) errors.)
//  * gemm_ss_simt: float, int8->int32 (exact) and half->float, shapes
//    (64,64,32,128) and (33,17,9,64), all transpose combos.
//  * cp_async<4/8/16> with some predicates false (zero fill, out-of-range
//    source address for those), two commit groups, wait<1>, then
//    wait_all / wait<0>.
//  * warp_reduce_sum/max/min and shfl_xor for float, int, half over widths.
#include "tiled_cuda.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static int g_pass = 0, g_fail = 0;
static std::string g_case = "setup";

[[noreturn]] static void finish_and_exit() {
  printf("%d passed, %d failed\n", g_pass, g_fail);
  fflush(stdout);
  exit(g_fail ? 1 : 0);
}

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      printf("FAIL %s cuda error '%s' at %s:%d in %s\n", g_case.c_str(), cudaGetErrorString(e_), \
             __FILE__, __LINE__, #call);                                                       \
      ++g_fail;                                                                                \
      finish_and_exit();                                                                       \
    }                                                                                          \
  } while (0)

static void report(bool ok, double max_err, const std::string& detail = "") {
  if (ok) {
    ++g_pass;
    printf("PASS %s %.3e\n", g_case.c_str(), max_err);
  } else {
    ++g_fail;
    printf("FAIL %s max_abs_err=%.3e %s\n", g_case.c_str(), max_err, detail.c_str());
  }
  fflush(stdout);
}

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<half> {
  static const char* name() { return "half"; }
  static half from_float(float f) { return __float2half(f); }
  static float to_float(half h) { return __half2float(h); }
  __device__ static half nan() { return __ushort_as_half((unsigned short)0x7e00u); }
};
template <>
struct TypeInfo<__nv_bfloat16> {
  static const char* name() { return "bf16"; }
  static __nv_bfloat16 from_float(float f) { return __float2bfloat16(f); }
  static float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
  __device__ static __nv_bfloat16 nan() { return __ushort_as_bfloat16((unsigned short)0x7fc0u); }
};
template <>
struct TypeInfo<float> {
  static const char* name() { return "float"; }
  static float from_float(float f) { return f; }
  static float to_float(float f) { return f; }
  __device__ static float nan() { return __int_as_float(0x7fc00000); }
};
template <>
struct TypeInfo<int8_t> {
  static const char* name() { return "int8"; }
  // A value no test input takes; reading padding changes results.
  __device__ static int8_t nan() { return (int8_t)-128; }
};

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t n_) : n(n_) { CK(cudaMalloc(&p, n * sizeof(T) + 16)); }
  ~DevBuf() {
    if (p) cudaFree(p);  // best effort; errors surface at the next checked call
  }
  void upload(const std::vector<T>& h) { CK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  void download(std::vector<T>& h) {
    h.resize(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  // NaN for float/half/bf16; 0x80.. (no test produces it) for integers and bytes.
  void poison() {
    const bool is_float = (T)1 / (T)2 != (T)0;
    CK(cudaMemset(p, is_float ? 0xFF : 0x80, n * sizeof(T)));
  }
};

static void launch_check() {
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------
// gemm_ss
// ---------------------------------------------------------------------------

// Copy a dense rows x cols global matrix into shared memory with row stride LD,
// padding columns set to NaN.
template <typename T, int ROWS, int COLS, int LD>
__device__ void load_tile(T* s, const T* g) {
  for (int i = threadIdx.x; i < ROWS * LD; i += blockDim.x) {
    const int r = i / LD, c = i % LD;
    s[i] = c < COLS ? g[r * COLS + c] : TypeInfo<T>::nan();
  }
}

template <typename T, int M, int N, int K, int WARP_M, int WARP_N, bool TA, bool TB, int LDA, int LDB>
__global__ void gemm_ss_kernel(const T* gA, const T* gB, const float* gInit, float* gC) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int A_ROWS = TA ? K : M, A_COLS = TA ? M : K;
  constexpr int B_ROWS = TB ? N : K, B_COLS = TB ? K : N;
  T* sA = reinterpret_cast<T*>(smem_raw);
  T* sB = sA + A_ROWS * LDA;  // LDA % 8 == 0 keeps sB 16-byte aligned
  load_tile<T, A_ROWS, A_COLS, LDA>(sA, gA);
  load_tile<T, B_ROWS, B_COLS, LDB>(sB, gB);
  __syncthreads();

  constexpr int NACC = tiled::acc_size<M, N, WARP_M, WARP_N>();
  float acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    int r, c;
    tiled::acc_coord<M, N, WARP_M, WARP_N>(i, r, c);
    acc[i] = gInit[r * N + c];
  }
  tiled::gemm_ss<T, M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB>(sA, sB, acc);
  tiled::gemm_ss<T, M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB>(sA, sB, acc);
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    int r, c;
    tiled::acc_coord<M, N, WARP_M, WARP_N>(i, r, c);
    gC[r * N + c] = acc[i];
  }
}

template <typename T, int M, int N, int K, int WARP_M, int WARP_N, bool TA, bool TB, bool PAD>
static void run_gemm_ss_case(std::mt19937& rng) {
  constexpr int A_ROWS = TA ? K : M, A_COLS = TA ? M : K;
  constexpr int B_ROWS = TB ? N : K, B_COLS = TB ? K : N;
  constexpr int LDA = A_COLS + (PAD ? 8 : 0), LDB = B_COLS + (PAD ? 8 : 0);
  constexpr int THREADS = 32 * WARP_M * WARP_N;
  char name[160];
  snprintf(name, sizeof name, "gemm_ss<%s,M=%d,N=%d,K=%d,WM=%d,WN=%d,TA=%d,TB=%d,LDA=%d,LDB=%d>",
           TypeInfo<T>::name(), M, N, K, WARP_M, WARP_N, (int)TA, (int)TB, LDA, LDB);
  g_case = name;

  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<T> hA(A_ROWS * A_COLS), hB(B_ROWS * B_COLS);
  std::vector<double> fA(hA.size()), fB(hB.size());
  for (size_t i = 0; i < hA.size(); ++i) {
    hA[i] = TypeInfo<T>::from_float(dist(rng));
    fA[i] = TypeInfo<T>::to_float(hA[i]);
  }
  for (size_t i = 0; i < hB.size(); ++i) {
    hB[i] = TypeInfo<T>::from_float(dist(rng));
    fB[i] = TypeInfo<T>::to_float(hB[i]);
  }
  std::vector<float> hInit(M * N);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) hInit[r * N + c] = 0.25f * (float)((r * 7 + c * 3) % 11) - 1.125f;

  DevBuf<T> dA(hA.size()), dB(hB.size());
  DevBuf<float> dInit(M * N), dC(M * N);
  dA.upload(hA);
  dB.upload(hB);
  dInit.upload(hInit);
  dC.poison();
  const size_t smem = sizeof(T) * (size_t)(A_ROWS * LDA + B_ROWS * LDB);
  auto kern = gemm_ss_kernel<T, M, N, K, WARP_M, WARP_N, TA, TB, LDA, LDB>;
  if (smem > 48 * 1024) CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kern<<<1, THREADS, smem>>>(dA.p, dB.p, dInit.p, dC.p);
  launch_check();
  std::vector<float> hC;
  dC.download(hC);

  const double rtol = TypeInfo<T>::name()[0] == 'h' ? 2e-3 : 1e-2;
  double max_err = 0;
  int bad = 0, first_r = -1, first_c = -1;
  double first_got = 0, first_ref = 0;
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      double s = 0, sabs = 0;
      for (int k = 0; k < K; ++k) {
        const double a = TA ? fA[k * A_COLS + r] : fA[r * A_COLS + k];
        const double b = TB ? fB[c * B_COLS + k] : fB[k * B_COLS + c];
        s += a * b;
        sabs += fabs(a * b);
      }
      const double ref = hInit[r * N + c] + 2.0 * s;
      const double tol = rtol * (fabs((double)hInit[r * N + c]) + 2.0 * sabs) + 1e-6;
      const double got = hC[r * N + c];
      const double err = fabs(got - ref);
      if (!(err <= tol)) {  // NaN (unwritten / poisoned) fails too
        if (bad++ == 0) {
          first_r = r;
          first_c = c;
          first_got = got;
          first_ref = ref;
        }
      }
      if (err > max_err || err != err) max_err = err;
    }
  }
  char detail[200] = "";
  if (bad)
    snprintf(detail, sizeof detail, "bad=%d/%d first at (%d,%d) got=%g ref=%g", bad, M * N, first_r, first_c,
             first_got, first_ref);
  report(bad == 0, max_err, detail);
}

template <typename T, int M, int N, int K, int WARP_M, int WARP_N>
static void run_gemm_ss_shape(std::mt19937& rng) {
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, false, false, false>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, false, false, true>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, false, true, false>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, false, true, true>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, true, false, false>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, true, false, true>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, true, true, false>(rng);
  run_gemm_ss_case<T, M, N, K, WARP_M, WARP_N, true, true, true>(rng);
}

template <typename T>
static void run_gemm_ss_all(std::mt19937& rng) {
  run_gemm_ss_shape<T, 128, 128, 32, 2, 2>(rng);
  run_gemm_ss_shape<T, 64, 64, 32, 2, 2>(rng);
  run_gemm_ss_shape<T, 128, 256, 32, 2, 4>(rng);
  run_gemm_ss_shape<T, 64, 128, 64, 1, 4>(rng);
  run_gemm_ss_shape<T, 16, 8, 16, 1, 1>(rng);
  run_gemm_ss_shape<T, 128, 128, 64, 4, 1>(rng);
}

// ---------------------------------------------------------------------------
// gemm_ss_simt
// ---------------------------------------------------------------------------

template <typename TI, typename TC, int M, int N, int K, int THREADS, bool TA, bool TB, int LDA, int LDB>
__global__ void gemm_simt_kernel(const TI* gA, const TI* gB, const TC* gInit, TC* gC) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int A_ROWS = TA ? K : M, A_COLS = TA ? M : K;
  constexpr int B_ROWS = TB ? N : K, B_COLS = TB ? K : N;
  constexpr int A_BYTES = ((A_ROWS * LDA * (int)sizeof(TI)) + 15) / 16 * 16;
  TI* sA = reinterpret_cast<TI*>(smem_raw);
  TI* sB = reinterpret_cast<TI*>(smem_raw + A_BYTES);
  load_tile<TI, A_ROWS, A_COLS, LDA>(sA, gA);
  load_tile<TI, B_ROWS, B_COLS, LDB>(sB, gB);
  __syncthreads();
  constexpr int ITERS = tiled::simt_acc_size<M, N, THREADS>();
  TC acc[ITERS];
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = t + i * THREADS;
    acc[i] = e < M * N ? gInit[e] : TC(0);
  }
  tiled::gemm_ss_simt<TI, TI, TC, M, N, K, THREADS, TA, TB, LDA, LDB>(sA, sB, acc);
  tiled::gemm_ss_simt<TI, TI, TC, M, N, K, THREADS, TA, TB, LDA, LDB>(sA, sB, acc);
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = t + i * THREADS;
    if (e < M * N) gC[e] = acc[i];
  }
}

template <typename TI, typename TC, int M, int N, int K, int THREADS, bool TA, bool TB, int PAD>
static void run_simt_case(std::mt19937& rng) {
  constexpr int A_ROWS = TA ? K : M, A_COLS = TA ? M : K;
  constexpr int B_ROWS = TB ? N : K, B_COLS = TB ? K : N;
  constexpr int LDA = A_COLS + PAD, LDB = B_COLS + PAD;
  constexpr bool IS_INT = TC(1) / TC(2) == TC(0);
  char name[160];
  snprintf(name, sizeof name, "gemm_ss_simt<%s->%s,M=%d,N=%d,K=%d,THREADS=%d,TA=%d,TB=%d,LDA=%d,LDB=%d>",
           TypeInfo<TI>::name(), IS_INT ? "int32" : "float", M, N, K, THREADS, (int)TA, (int)TB, LDA, LDB);
  g_case = name;

  std::vector<TI> hA(A_ROWS * A_COLS), hB(B_ROWS * B_COLS);
  std::vector<double> fA(hA.size()), fB(hB.size());
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::uniform_int_distribution<int> idist(-127, 127);
  auto gen = [&](TI& x, double& f) {
    if constexpr (sizeof(TI) == 1) {
      x = (TI)idist(rng);
      f = (double)x;
    } else {
      x = TypeInfo<TI>::from_float(dist(rng));
      f = TypeInfo<TI>::to_float(x);
    }
  };
  for (size_t i = 0; i < hA.size(); ++i) gen(hA[i], fA[i]);
  for (size_t i = 0; i < hB.size(); ++i) gen(hB[i], fB[i]);
  std::vector<TC> hInit(M * N);
  for (int e = 0; e < M * N; ++e) hInit[e] = IS_INT ? (TC)((e * 37) % 1001 - 500) : (TC)(0.125f * (e % 13) - 0.75f);

  DevBuf<TI> dA(hA.size()), dB(hB.size());
  DevBuf<TC> dInit(M * N), dC(M * N);
  dA.upload(hA);
  dB.upload(hB);
  dInit.upload(hInit);
  dC.poison();
  const size_t smem = ((A_ROWS * LDA * sizeof(TI)) + 15) / 16 * 16 + B_ROWS * LDB * sizeof(TI);
  gemm_simt_kernel<TI, TC, M, N, K, THREADS, TA, TB, LDA, LDB><<<1, THREADS, smem>>>(dA.p, dB.p, dInit.p, dC.p);
  launch_check();
  std::vector<TC> hC;
  dC.download(hC);

  double max_err = 0;
  int bad = 0;
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      double s = 0, sabs = 0;
      for (int k = 0; k < K; ++k) {
        const double a = TA ? fA[k * A_COLS + r] : fA[r * A_COLS + k];
        const double b = TB ? fB[c * B_COLS + k] : fB[k * B_COLS + c];
        s += a * b;
        sabs += fabs(a * b);
      }
      const double ref = (double)hInit[r * N + c] + 2.0 * s;
      const double got = (double)hC[r * N + c];
      const double err = fabs(got - ref);
      const double tol = IS_INT ? 0.0 : 1e-5 * (fabs((double)hInit[r * N + c]) + 2.0 * sabs) + 1e-6;
      if (!(err <= tol)) ++bad;
      if (err > max_err || err != err) max_err = err;
    }
  }
  char detail[64] = "";
  if (bad) snprintf(detail, sizeof detail, "bad=%d/%d", bad, M * N);
  report(bad == 0, max_err, detail);
}

template <typename TI, typename TC, int M, int N, int K, int THREADS, int PAD>
static void run_simt_shape(std::mt19937& rng) {
  run_simt_case<TI, TC, M, N, K, THREADS, false, false, PAD>(rng);
  run_simt_case<TI, TC, M, N, K, THREADS, false, true, PAD>(rng);
  run_simt_case<TI, TC, M, N, K, THREADS, true, false, PAD>(rng);
  run_simt_case<TI, TC, M, N, K, THREADS, true, true, PAD>(rng);
}

static void run_simt_all(std::mt19937& rng) {
  run_simt_shape<float, float, 64, 64, 32, 128, 0>(rng);
  run_simt_shape<float, float, 33, 17, 9, 64, 3>(rng);
  run_simt_shape<int8_t, int32_t, 64, 64, 32, 128, 0>(rng);
  run_simt_shape<int8_t, int32_t, 33, 17, 9, 64, 3>(rng);
  run_simt_shape<half, float, 33, 17, 9, 64, 1>(rng);
}

// ---------------------------------------------------------------------------
// cp_async
// ---------------------------------------------------------------------------

__host__ __device__ inline bool cp_pred(int chunk) { return (chunk * 7) % 5 != 2; }

// Chunks [0, half) go in commit group 1, [half, nchunks) in group 2.  After
// wait<1> group 1 must be complete in every thread (then a barrier makes it
// visible block-wide); after wait_all (or wait<0>) everything is.
// Predicated-off chunks get a source address past the end of the allocation.
template <int BYTES, bool WAIT_ALL>
__global__ void cp_async_kernel(const uint8_t* src, int nchunks, uint8_t* out_stage1, uint8_t* out_final) {
  extern __shared__ __align__(16) unsigned char sbuf[];
  const int total = nchunks * BYTES, half_chunks = nchunks / 2;
  for (int i = threadIdx.x; i < total; i += blockDim.x) sbuf[i] = 0xAB;
  __syncthreads();
  for (int c = threadIdx.x; c < half_chunks; c += blockDim.x) {
    const bool p = cp_pred(c);
    const uint8_t* s = p ? src + (size_t)c * BYTES : src + total + 4096 + (size_t)c * BYTES;
    tiled::cp_async<BYTES>(sbuf + c * BYTES, s, p);
  }
  tiled::cp_async_commit();
  for (int c = half_chunks + threadIdx.x; c < nchunks; c += blockDim.x) {
    const bool p = cp_pred(c);
    const uint8_t* s = p ? src + (size_t)c * BYTES : src + total + 4096 + (size_t)c * BYTES;
    tiled::cp_async<BYTES>(sbuf + c * BYTES, s, p);
  }
  tiled::cp_async_commit();
  tiled::cp_async_wait<1>();
  __syncthreads();
  for (int i = threadIdx.x; i < half_chunks * BYTES; i += blockDim.x) out_stage1[i] = sbuf[i];
  if (WAIT_ALL)
    tiled::cp_async_wait_all();
  else
    tiled::cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < total; i += blockDim.x) out_final[i] = sbuf[i];
}

template <int BYTES, bool WAIT_ALL>
static void run_cp_async_case(std::mt19937& rng) {
  char name[96];
  snprintf(name, sizeof name, "cp_async<%d>+%s", BYTES, WAIT_ALL ? "wait_all" : "wait<0>");
  g_case = name;
  const int nchunks = 16000 / BYTES + 3;
  const int total = nchunks * BYTES, half_chunks = nchunks / 2;
  std::vector<uint8_t> hsrc(total);
  std::uniform_int_distribution<int> bd(1, 255);  // nonzero, so zero fill is distinguishable
  for (auto& b : hsrc) b = (uint8_t)bd(rng);
  DevBuf<uint8_t> dsrc(total), dst1(half_chunks * BYTES), dfin(total);
  dsrc.upload(hsrc);
  dst1.poison();
  dfin.poison();
  cp_async_kernel<BYTES, WAIT_ALL><<<1, 128, total>>>(dsrc.p, nchunks, dst1.p, dfin.p);
  launch_check();
  std::vector<uint8_t> h1, hf;
  dst1.download(h1);
  dfin.download(hf);
  int bad = 0, nfalse = 0;
  for (int c = 0; c < nchunks; ++c) {
    const bool p = cp_pred(c);
    nfalse += !p;
    for (int b = 0; b < BYTES; ++b) {
      const int i = c * BYTES + b;
      const uint8_t want = p ? hsrc[i] : 0;
      if (hf[i] != want) ++bad;
      if (c < half_chunks && h1[i] != want) ++bad;
    }
  }
  char detail[96] = "";
  if (bad) snprintf(detail, sizeof detail, "bad_bytes=%d (pred-false chunks %d)", bad, nfalse);
  report(bad == 0 && nfalse > 0, (double)bad, detail);
}

// ---------------------------------------------------------------------------
// warp helpers
// ---------------------------------------------------------------------------

template <typename T>
__global__ void warp_kernel(const T* in, T* osum, T* omax, T* omin, T* oshfl, int width, int mask) {
  const int t = threadIdx.x;
  const T v = in[t];
  osum[t] = tiled::warp_reduce_sum(v, width);
  omax[t] = tiled::warp_reduce_max(v, width);
  omin[t] = tiled::warp_reduce_min(v, width);
  oshfl[t] = tiled::shfl_xor(v, mask);
}

template <typename T>
static double to_d(T x) {
  if constexpr (sizeof(T) == 2)
    return (double)__half2float(x);
  else
    return (double)x;
}

template <typename T>
static void run_warp_case(const char* tname, int width, int mask, std::mt19937& rng) {
  constexpr int NT = 64;  // two warps
  std::vector<T> hin(NT);
  std::uniform_int_distribution<int> idist(-8, 8);
  std::uniform_real_distribution<float> fdist(-4.f, 4.f);
  for (auto& x : hin) {
    if constexpr (sizeof(T) == 2)
      x = __float2half((float)idist(rng));  // small integers: half sums stay exact
    else if constexpr (T(1) / T(2) == T(0))
      x = (T)(idist(rng) * 1000 + idist(rng));
    else
      x = (T)fdist(rng);
  }
  DevBuf<T> din(NT), ds(NT), dmx(NT), dmn(NT), dsh(NT);
  din.upload(hin);
  ds.poison();
  dmx.poison();
  dmn.poison();
  dsh.poison();
  char name[96];
  snprintf(name, sizeof name, "warp_helpers<%s,width=%d,mask=%d>", tname, width, mask);
  g_case = name;
  warp_kernel<T><<<1, NT>>>(din.p, ds.p, dmx.p, dmn.p, dsh.p, width, mask);
  launch_check();
  std::vector<T> hs, hmx, hmn, hsh;
  ds.download(hs);
  dmx.download(hmx);
  dmn.download(hmn);
  dsh.download(hsh);
  double max_err = 0;
  int bad = 0;
  for (int t = 0; t < NT; ++t) {
    const int g0 = t & ~(width - 1);
    double s = 0, sabs = 0, mx = -1e300, mn = 1e300;
    for (int j = g0; j < g0 + width; ++j) {
      const double v = to_d(hin[j]);
      s += v;
      sabs += fabs(v);
      mx = v > mx ? v : mx;
      mn = v < mn ? v : mn;
    }
    const double tol = 1e-6 * sabs;  // exact for int/half inputs here; float rounding only
    const double es = fabs(to_d(hs[t]) - s);
    const double emx = fabs(to_d(hmx[t]) - mx), emn = fabs(to_d(hmn[t]) - mn);
    const double esh = fabs(to_d(hsh[t]) - to_d(hin[(t & ~31) | ((t & 31) ^ mask)]));
    if (!(es <= tol) || !(emx == 0) || !(emn == 0) || !(esh == 0)) ++bad;
    for (double e : {es, emx, emn, esh})
      if (e > max_err || e != e) max_err = e;
  }
  char detail[64] = "";
  if (bad) snprintf(detail, sizeof detail, "bad_lanes=%d/%d", bad, NT);
  report(bad == 0, max_err, detail);
}

static void run_warp_all(std::mt19937& rng) {
  const int cases[][2] = {{32, 1}, {16, 5}, {8, 16}, {4, 31}, {2, 2}, {1, 7}};
  for (auto& c : cases) {
    run_warp_case<float>("float", c[0], c[1], rng);
    run_warp_case<int>("int", c[0], c[1], rng);
    run_warp_case<half>("half", c[0], c[1], rng);
  }
}

int main() {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  fflush(stdout);
  std::mt19937 rng(12345);
  run_gemm_ss_all<half>(rng);
  run_gemm_ss_all<__nv_bfloat16>(rng);
  run_simt_all(rng);
  run_warp_all(rng);
  // cp.async last: if the hardware ever touched the out-of-range source
  // address of a predicated-off copy, the fault would not hide other results.
  run_cp_async_case<4, true>(rng);
  run_cp_async_case<8, true>(rng);
  run_cp_async_case<16, true>(rng);
  run_cp_async_case<16, false>(rng);
  finish_and_exit();
}
