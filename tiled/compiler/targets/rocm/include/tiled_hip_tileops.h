// tiled_hip_tileops.h -- the tile ops of the ROCm lowering (part of tiled_hip.h, which
// includes it last): cp_async (a global -> LDS vector copy), the float8 tile converts, the
// SIMT gemm and the MFMA gemm.
#pragma once

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
