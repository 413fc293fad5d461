// tiled_metal.h -- the device functions of tiled's Metal backend, in Metal Shading Language.
//
// The Metal lowering (targets/metal/lower.py) builds TIR with calls into this header; TVM's
// Metal codegen prints it as MSL, and tiled ships this header and the kernel as one source
// (a Metal library is compiled from one string: newLibraryWithSource, torch.mps.compile_shader).
// Everything here is plain MSL 3.0 (3.1 where TILED_MSL_BFLOAT says bfloat exists) over
// <metal_stdlib>; on Linux the same text is type-checked and run by tiled's CPU
// implementation of <metal_stdlib> (include/cpu/), so the emulated code is the shipped code.
#include <metal_stdlib>
using namespace metal;

namespace tiled {

// bfloat16 as its bits (what TVM's legalization stores): a value converts to float.
struct bf16 {
  ushort bits;
};
inline float to_float(bf16 v) { return as_type<float>(uint(v.bits) << 16); }
inline float to_float(half v) { return float(v); }
inline float to_float(float v) { return v; }
template <typename T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline half from_float<half>(float v) { return half(v); }

// --- global -> threadgroup copies (CUDA's cp.async) ------------------------------------------

template <int BYTES>
struct word_vec;
template <>
struct word_vec<4> {
  typedef uint type;
};
template <>
struct word_vec<8> {
  typedef uint2 type;
};
template <>
struct word_vec<16> {
  typedef uint4 type;
};

// A vector of BYTES (4, 8 or 16) from device to threadgroup memory, zeros when !pred (a tile's
// tail past the tensor's end: `src` is then never read). Metal has no asynchronous copy into
// threadgroup memory: this is a load and a store, complete when it returns.
template <int BYTES>
inline void cp_async(threadgroup void* dst, const device void* src, bool pred) {
  typedef typename word_vec<BYTES>::type V;
  *(threadgroup V*)dst = pred ? *(const device V*)src : V(0);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

// T.exp2 of a float32 (CUDA's ex2.approx): Metal's exp2.
inline float exp2_approx(float x) { return exp2(x); }

// --- gemm ------------------------------------------------------------------------------------

// C (M x N, row stride LDC, threadgroup memory) += op(A) @ op(B) on 8x8 simdgroup matrices,
// for simdgroup `sg` of SIMDGROUPS: it owns C tiles sg, sg + SIMDGROUPS, ... (row-major over
// the (M / 8) x (N / 8) tiles). A is M x K (K x M when TRANS_A), row stride LDA; B is K x N
// (N x K when TRANS_B), row stride LDB; all in threadgroup memory. CLEAR: C = op(A) @ op(B).
// Every lane of the simdgroup calls with the same arguments. No barrier inside.
template <typename TA, typename TB, typename TC, int M, int N, int K, int SIMDGROUPS,
          bool TRANS_A, bool TRANS_B, int LDA, int LDB, int LDC, bool CLEAR>
inline void gemm_simdgroup(const threadgroup void* a_, const threadgroup void* b_,
                           threadgroup void* c_, uint sg) {
#if defined(TILED_MSL_BFLOAT)
  typedef typename metal::conditional<metal::is_same<TA, bf16>::value, bfloat, TA>::type MA;
  typedef typename metal::conditional<metal::is_same<TB, bf16>::value, bfloat, TB>::type MB;
#else
  typedef TA MA;
  typedef TB MB;
#endif
  const threadgroup MA* A = (const threadgroup MA*)a_;
  const threadgroup MB* B = (const threadgroup MB*)b_;
  threadgroup TC* C = (threadgroup TC*)c_;
  for (uint t = sg; t < uint((M / 8) * (N / 8)); t += SIMDGROUPS) {
    const uint tm = t / (N / 8), tn = t % (N / 8);
    threadgroup TC* c_tile = C + tm * 8 * LDC + tn * 8;
    simdgroup_matrix<TC, 8, 8> c;
    if (CLEAR) {
      c = make_filled_simdgroup_matrix<TC, 8, 8>(TC(0));
    } else {
      simdgroup_load(c, c_tile, LDC);
    }
    for (uint k = 0; k < uint(K); k += 8) {
      simdgroup_matrix<MA, 8, 8> a;
      simdgroup_matrix<MB, 8, 8> b;
      simdgroup_load(a, TRANS_A ? A + k * LDA + tm * 8 : A + tm * 8 * LDA + k, LDA, ulong2(0, 0),
                     TRANS_A);
      simdgroup_load(b, TRANS_B ? B + tn * 8 * LDB + k : B + k * LDB + tn * 8, LDB, ulong2(0, 0),
                     TRANS_B);
      simdgroup_multiply_accumulate(c, a, b, c);
    }
    simdgroup_store(c, c_tile, LDC);
  }
}

// c + a * b in the accumulator's type; bfloat16 operands are read through float.
template <typename TC, typename TA, typename TB>
inline TC mac(TC c, TA a, TB b) {
  return TC(c + TC(a) * TC(b));
}
inline float mac(float c, bf16 a, bf16 b) { return c + to_float(a) * to_float(b); }
// The same for an accumulator kept in simdgroup matrices (targets/metal/resident.py): `c`
// holds the calling simdgroup's tiles sg, sg + SIMDGROUPS, ... of the (M / 8) x (N / 8) grid.
template <typename TA, typename TB, typename TC, int M, int N, int K, int SIMDGROUPS,
          bool TRANS_A, bool TRANS_B, int LDA, int LDB, bool CLEAR>
inline void gemm_simdgroup_acc(const threadgroup void* a_, const threadgroup void* b_,
                               thread simdgroup_matrix<TC, 8, 8>* c, uint sg) {
#if defined(TILED_MSL_BFLOAT)
  typedef typename metal::conditional<metal::is_same<TA, bf16>::value, bfloat, TA>::type MA;
  typedef typename metal::conditional<metal::is_same<TB, bf16>::value, bfloat, TB>::type MB;
#else
  typedef TA MA;
  typedef TB MB;
#endif
  const threadgroup MA* A = (const threadgroup MA*)a_;
  const threadgroup MB* B = (const threadgroup MB*)b_;
  uint i = 0;
  for (uint t = sg; t < uint((M / 8) * (N / 8)); t += SIMDGROUPS, ++i) {
    const uint tm = t / (N / 8), tn = t % (N / 8);
    if (CLEAR) c[i] = make_filled_simdgroup_matrix<TC, 8, 8>(TC(0));
    for (uint k = 0; k < uint(K); k += 8) {
      simdgroup_matrix<MA, 8, 8> a;
      simdgroup_matrix<MB, 8, 8> b;
      simdgroup_load(a, TRANS_A ? A + k * LDA + tm * 8 : A + tm * 8 * LDA + k, LDA, ulong2(0, 0),
                     TRANS_A);
      simdgroup_load(b, TRANS_B ? B + tn * 8 * LDB + k : B + k * LDB + tn * 8, LDB, ulong2(0, 0),
                     TRANS_B);
      simdgroup_multiply_accumulate(c[i], a, b, c[i]);
    }
  }
}

// Every tile of a resident accumulator set to v.
template <int TILES, typename TC>
inline void fill_simdgroup(thread simdgroup_matrix<TC, 8, 8>* c, TC v) {
  for (int i = 0; i < TILES; ++i) c[i] = make_filled_simdgroup_matrix<TC, 8, 8>(v);
}

// The calling simdgroup's tiles of a resident accumulator whose rows lie in [r0, r0 + ROWS),
// stored into `out` (ROWS x N, row stride N, threadgroup memory) at row - r0.
template <typename TC, int M, int N, int SIMDGROUPS, int ROWS>
inline void store_simdgroup(thread simdgroup_matrix<TC, 8, 8>* c, threadgroup void* out_,
                            int r0, uint sg) {
  threadgroup TC* out = (threadgroup TC*)out_;
  uint i = 0;
  for (uint t = sg; t < uint((M / 8) * (N / 8)); t += SIMDGROUPS, ++i) {
    const int row = int(t / (N / 8)) * 8, col = int(t % (N / 8)) * 8;
    if (row >= r0 && row < r0 + ROWS) simdgroup_store(c[i], out + (row - r0) * N + col, N);
  }
}

template <typename T>
inline T element(const threadgroup T* p, int i) {
  return p[i];
}
inline bf16 element(const threadgroup bf16* p, int i) { return bf16{p[i].bits}; }

// acc += op(A) @ op(B) on the ALUs, for what no simdgroup matrix takes: thread `tid` owns
// elements e = tid + i * THREADS of the M x N tile (row e / N, column e % N) in acc[i] (the
// cyclic layout). Products added in k order. No barrier inside.
template <typename TA, typename TB, typename TC, int M, int N, int K, int THREADS, bool TRANS_A,
          bool TRANS_B, int LDA, int LDB>
inline void gemm_simt(const threadgroup void* a_, const threadgroup void* b_, thread TC* acc,
                      uint tid) {
  const threadgroup TA* A = (const threadgroup TA*)a_;
  const threadgroup TB* B = (const threadgroup TB*)b_;
  constexpr int ITERS = (M * N + THREADS - 1) / THREADS;
  for (int i = 0; i < ITERS; ++i) {
    const int e = int(tid) + i * THREADS;
    if (e < M * N) {
      const int row = e / N, col = e % N;
      TC c = acc[i];
      for (int k = 0; k < K; ++k) {
        c = mac(c, element(A, TRANS_A ? k * LDA + row : row * LDA + k),
                element(B, TRANS_B ? col * LDB + k : k * LDB + col));
      }
      acc[i] = c;
    }
  }
}

// --- atomics ---------------------------------------------------------------------------------

// The old value of *p; relaxed order, as CUDA's atomicAdd. float max / min: a compare-and-swap
// loop on the word (a NaN `v` never replaces a number).
#define TILED_ATOMIC_INT(SPACE)                                                          \
  inline int atomic_add(SPACE int* p, int v) {                                           \
    return atomic_fetch_add_explicit((SPACE atomic_int*)p, v, memory_order_relaxed);     \
  }                                                                                      \
  inline uint atomic_add(SPACE uint* p, uint v) {                                        \
    return atomic_fetch_add_explicit((SPACE atomic_uint*)p, v, memory_order_relaxed);    \
  }                                                                                      \
  inline int atomic_max(SPACE int* p, int v) {                                           \
    return atomic_fetch_max_explicit((SPACE atomic_int*)p, v, memory_order_relaxed);     \
  }                                                                                      \
  inline uint atomic_max(SPACE uint* p, uint v) {                                        \
    return atomic_fetch_max_explicit((SPACE atomic_uint*)p, v, memory_order_relaxed);    \
  }                                                                                      \
  inline int atomic_min(SPACE int* p, int v) {                                           \
    return atomic_fetch_min_explicit((SPACE atomic_int*)p, v, memory_order_relaxed);     \
  }                                                                                      \
  inline uint atomic_min(SPACE uint* p, uint v) {                                        \
    return atomic_fetch_min_explicit((SPACE atomic_uint*)p, v, memory_order_relaxed);    \
  }                                                                                      \
  template <bool MAX>                                                                    \
  inline float atomic_extreme(SPACE float* p, float v) {                                 \
    SPACE atomic_uint* w = (SPACE atomic_uint*)p;                                        \
    uint old = atomic_load_explicit(w, memory_order_relaxed);                            \
    for (;;) {                                                                           \
      const float cur = as_type<float>(old);                                             \
      if (!(MAX ? v > cur : v < cur)) return cur;                                        \
      if (atomic_compare_exchange_weak_explicit(w, &old, as_type<uint>(v),               \
                                                memory_order_relaxed,                    \
                                                memory_order_relaxed))                   \
        return cur;                                                                      \
    }                                                                                    \
  }                                                                                      \
  inline float atomic_max(SPACE float* p, float v) { return atomic_extreme<true>(p, v); } \
  inline float atomic_min(SPACE float* p, float v) { return atomic_extreme<false>(p, v); }

TILED_ATOMIC_INT(device)
TILED_ATOMIC_INT(threadgroup)
#undef TILED_ATOMIC_INT

// float add: device memory has atomic_float (MSL 3.0); threadgroup memory a compare-and-swap
// loop on the word.
inline float atomic_add(device float* p, float v) {
  return atomic_fetch_add_explicit((device atomic_float*)p, v, memory_order_relaxed);
}
inline float atomic_add(threadgroup float* p, float v) {
  threadgroup atomic_uint* w = (threadgroup atomic_uint*)p;
  uint old = atomic_load_explicit(w, memory_order_relaxed);
  for (;;) {
    const float cur = as_type<float>(old);
    if (atomic_compare_exchange_weak_explicit(w, &old, as_type<uint>(cur + v),
                                              memory_order_relaxed, memory_order_relaxed))
      return cur;
  }
}

}  // namespace tiled
