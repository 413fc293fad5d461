// Host emulation of tiled_cuda.h's accumulator stores (MmaTile::store, store_acc_warp): the
// header's own text between its "accumulator fragments" marker and T.exp2's comment is pasted
// at TILED_STORE_REGION by tests/compiler/test_mma_epilogue.py, over the stubs below. Every
// thread of the block is a host thread; a warp's 32 threads meet at a barrier in each
// __shfl_xor_sync, so the quad transpose runs as on the GPU.
//
// Compile-time: TILE_M, TILE_N, WARPS_M, WARPS_N (MmaTile's), OUT_T (float, half or bf16).
// stdin: threads, then row0 col0 m n ldc rows_of_C, then each thread's slots (floats).
// stdout: C as rows_of_C x ldc values (float), untouched entries -1.
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __forceinline__ inline

typedef _Float16 half;
struct half2 { half x, y; };
struct __nv_bfloat16 {  // bits only (the host's libgcc may lack bfloat16 conversions)
  uint16_t bits;
  __nv_bfloat16() = default;
  explicit __nv_bfloat16(float f) {  // round to nearest even (no NaNs here)
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct float2 { float x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline half __float2half_rn(float x) { return static_cast<half>(x); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16(x); }
inline half2 __floats2half2_rn(float a, float b) { return {(half)a, (half)b}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }

struct Dim { unsigned x; };
thread_local Dim threadIdx;

struct Warp {
  std::barrier<> bar{32};
  uint32_t slot[32];
};
thread_local Warp* this_warp;

inline uint32_t __shfl_xor_sync(unsigned, uint32_t v, int mask) {
  const int lane = threadIdx.x & 31;
  this_warp->slot[lane] = v;
  this_warp->bar.arrive_and_wait();
  const uint32_t got = this_warp->slot[lane ^ mask];
  this_warp->bar.arrive_and_wait();
  return got;
}

namespace tiled {
// TILED_STORE_REGION
}  // namespace tiled

int main() {
  int threads, row0, col0, m, n, ldc, rows;
  if (scanf("%d %d %d %d %d %d %d", &threads, &row0, &col0, &m, &n, &ldc, &rows) != 7) return 2;
  using Tile = tiled::MmaTile<TILE_M, TILE_N, WARPS_M, WARPS_N>;
  const int slots = (TILE_M / WARPS_M / 16) * (TILE_N / WARPS_N / 8) * 4;
  std::vector<std::vector<float>> acc(threads, std::vector<float>(slots));
  for (auto& a : acc)
    for (float& v : a)
      if (scanf("%f", &v) != 1) return 2;
  // C with a 64-byte aligned start, as a global tensor's rows are
  std::vector<OUT_T> storage(static_cast<size_t>(rows) * ldc + 64, static_cast<OUT_T>(-1.0f));
  OUT_T* C = storage.data();
  while (reinterpret_cast<uintptr_t>(C) % 64) ++C;
  std::vector<Warp> warps((threads + 31) / 32);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx.x = t;
      this_warp = &warps[t / 32];
      Tile::store<OUT_T>(acc[t].data(), C, ldc, row0, col0, m, n, t / 32);
    });
  for (auto& th : pool) th.join();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ldc; ++c)
      printf("%g%c", static_cast<float>(C[static_cast<size_t>(r) * ldc + c]),
             c + 1 == ldc ? '\n' : ' ');
  return 0;
}
