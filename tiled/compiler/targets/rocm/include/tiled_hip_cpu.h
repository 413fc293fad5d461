// tiled_hip_cpu.h -- the ISA layer of tiled_hip.h for the CPU emulation of ROCm kernels
// (tiled.compile(k, target="rocm:gfx942").emulate(...)): the kernel's HIP source, exactly as
// it is compiled for the GPU, built as host C++ (clang++ -x c++) on top of this file instead
// of tiled_hip_amdgcn.h.
//
// Execution model: the blocks of the grid run one after another; the threads of a block are
// fibers (ucontext) on one OS thread, switched only where threads meet: __syncthreads (the
// block's barrier), a lane exchange (a shuffle) and an MFMA instruction (the wave's barrier:
// all 64 lanes of a wave take part). A barrier some threads never reach is reported as a
// deadlock naming the threads, not a hang. The block's LDS pool is an arena filled with 0xFF
// before each block, so a read of LDS no thread wrote gives NaN / -1, not an old block's
// data. MFMA instructions are reference implementations over AMD's documented register
// layouts (the 16x16 family: A[lane % 16][kpl * (lane / 16) + j], B[kpl * (lane / 16) +
// j][lane % 16], D[4 * (lane / 16) + r][lane % 16], kpl = K / 4 elements per lane; checked
// against AMD's matrix instruction calculator in tests/compiler/test_rocm_mfma_layouts.py),
// reading fp8 as gfx942's MFMA does (FNUZ formats).
#pragma once

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define TILED_LDS_POOL(name, bytes) uchar* name = ::tiled::emu::lds_pool(bytes)

namespace tiled {
namespace emu {

constexpr int WAVE = 64;
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int SLOT_BYTES = 64;  // a lane's share of its wave's exchange area

struct dim3v {
  unsigned x, y, z;
};

struct Barrier {
  int expected = 0, arrived = 0;
  unsigned gen = 0;
};

struct Fiber {
  ucontext_t ctx;
  dim3v tid;
  int flat = 0;
  bool done = false;
  Barrier* waiting = nullptr;  // blocked until waiting->gen != wait_gen
  unsigned wait_gen = 0;
  const char* where = "";  // what it waits at (for the deadlock report)
};

struct Grid {
  dim3v grid, block, bidx;
  int nthreads = 0, nwaves = 0, current = 0;
  Fiber* fibers = nullptr;
  char* stacks = nullptr;
  Barrier block_bar;
  Barrier* wave_bar = nullptr;
  unsigned char* xchg = nullptr;  // nwaves * WAVE * SLOT_BYTES
  unsigned char* lds = nullptr;
  size_t lds_bytes = 0;
  ucontext_t sched;
  void (*launch)(void**) = nullptr;
  void** args = nullptr;
  char error[512] = {0};
};

inline Grid* g_grid = nullptr;

inline Fiber& self() { return g_grid->fibers[g_grid->current]; }

[[noreturn]] inline void fail(const char* msg) {
  fprintf(stderr, "tiled emulation: %s\n", msg);
  exit(3);
}

inline void yield() { swapcontext(&self().ctx, &g_grid->sched); }

inline void arrive(Barrier& b, const char* where) {
  const unsigned gen = b.gen;
  if (++b.arrived >= b.expected) {
    b.arrived = 0;
    b.gen++;
    return;
  }
  Fiber& f = self();
  f.waiting = &b;
  f.wait_gen = gen;
  f.where = where;
  yield();
  f.waiting = nullptr;
}

inline unsigned char* lds_pool(size_t bytes) {
  if (bytes > g_grid->lds_bytes) fail("the kernel's LDS pool is larger than the arena");
  return g_grid->lds;
}

inline dim3v thread_idx() { return self().tid; }
inline dim3v block_idx() { return g_grid->bidx; }

inline int flat_tid() { return self().flat; }

// The wave's exchange: every lane of the wave deposits `bytes` of its own, then reads what
// lane `src` deposited (`out`), with the wave's barrier before and after the read.
inline void exchange(const void* mine, int bytes, int src, void* out) {
  Grid& g = *g_grid;
  const int t = flat_tid(), w = t / WAVE, l = t % WAVE;
  unsigned char* area = g.xchg + (size_t)w * WAVE * SLOT_BYTES;
  memcpy(area + l * SLOT_BYTES, mine, bytes);
  arrive(g.wave_bar[w], "a lane exchange (shuffle)");
  const int lanes = g.wave_bar[w].expected;
  if (src >= 0 && src < lanes) {
    memcpy(out, area + src * SLOT_BYTES, bytes);
  } else {
    memset(out, 0xFF, bytes);  // a lane outside the wave: poison
  }
  arrive(g.wave_bar[w], "a lane exchange (shuffle)");
}

static void fiber_main() {
  Grid& g = *g_grid;
  g.launch(g.args);
  Fiber& f = self();
  f.done = true;
  // A thread that has finished counts as arrived at the block's barrier (a wave that ends
  // leaves the hardware barrier too); a lane exchange it never joins stays a deadlock.
  g.block_bar.expected--;
  if (g.block_bar.arrived >= g.block_bar.expected && g.block_bar.arrived > 0) {
    g.block_bar.arrived = 0;
    g.block_bar.gen++;
  }
  swapcontext(&f.ctx, &g.sched);
}

inline void deadlock(Grid& g) {
  int n = snprintf(g.error, sizeof g.error,
                   "deadlock in block (%u, %u, %u): no thread can run;", g.bidx.x, g.bidx.y,
                   g.bidx.z);
  for (int i = 0; i < g.nthreads && n < (int)sizeof g.error - 80; ++i) {
    Fiber& f = g.fibers[i];
    if (!f.done) {
      n += snprintf(g.error + n, sizeof g.error - n, " thread %d waits at %s;", i, f.where);
      if (n > 300) break;
    }
  }
  fail(g.error);
}

inline void run_block(Grid& g) {
  g.block_bar = Barrier{};
  g.block_bar.expected = g.nthreads;
  for (int w = 0; w < g.nwaves; ++w) {
    g.wave_bar[w] = Barrier{};
    g.wave_bar[w].expected = g.nthreads - w * WAVE < WAVE ? g.nthreads - w * WAVE : WAVE;
  }
  memset(g.lds, 0xFF, g.lds_bytes);
  for (int i = 0; i < g.nthreads; ++i) {
    Fiber& f = g.fibers[i];
    f.done = false;
    f.waiting = nullptr;
    f.flat = i;
    f.tid = {(unsigned)(i % g.block.x), (unsigned)(i / g.block.x % g.block.y),
             (unsigned)(i / (g.block.x * g.block.y))};
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g.stacks + (size_t)i * (STACK_BYTES + 4096) + 4096;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  int live = g.nthreads;
  while (live > 0) {
    bool ran = false;
    for (int i = 0; i < g.nthreads; ++i) {
      Fiber& f = g.fibers[i];
      if (f.done || (f.waiting != nullptr && f.waiting->gen == f.wait_gen)) continue;
      g.current = i;
      swapcontext(&g.sched, &f.ctx);
      ran = true;
      if (f.done) live--;
    }
    if (!ran) deadlock(g);
  }
}

inline void run_grid(dim3v grid, dim3v block, size_t lds_bytes, void (*launch)(void**),
                     void** args) {
  Grid g;
  g.grid = grid;
  g.block = block;
  g.nthreads = (int)(block.x * block.y * block.z);
  g.nwaves = (g.nthreads + WAVE - 1) / WAVE;
  g.launch = launch;
  g.args = args;
  g.lds_bytes = lds_bytes;
  g.lds = (unsigned char*)aligned_alloc(64, lds_bytes ? (lds_bytes + 63) / 64 * 64 : 64);
  g.fibers = new Fiber[g.nthreads];
  g.wave_bar = new Barrier[g.nwaves];
  g.xchg = new unsigned char[(size_t)g.nwaves * WAVE * SLOT_BYTES];
  const size_t span = (size_t)g.nthreads * (STACK_BYTES + 4096);
  g.stacks = (char*)mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
  if (g.stacks == MAP_FAILED) fail("cannot map the fibers' stacks");
  for (int i = 0; i < g.nthreads; ++i) {  // a guard page below each stack
    mprotect(g.stacks + (size_t)i * (STACK_BYTES + 4096), 4096, PROT_NONE);
  }
  g_grid = &g;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g.bidx = {x, y, z};
        run_block(g);
      }
  g_grid = nullptr;
  munmap(g.stacks, span);
  delete[] g.fibers;
  delete[] g.wave_bar;
  delete[] g.xchg;
  free(g.lds);
}

// --- the reference MFMA (16x16 family) --------------------------------------------------

// Which lane and slot hold element (row, k) of A, (k, col) of B, (row, col) of D, for
// KPL = K / 4 elements per lane: AMD's register layouts (module comment).
constexpr int a_lane(int row, int k, int kpl) { return row + 16 * (k / kpl); }
constexpr int b_lane(int k, int col, int kpl) { return col + 16 * (k / kpl); }
constexpr int d_row(int lane, int r) { return 4 * (lane / 16) + r; }
constexpr int d_col(int lane) { return lane % 16; }

inline double fnuz_f8(unsigned char v, bool e5m2) {
  if (v == 0x80) return NAN;  // FNUZ: the one NaN, no negative zero, no infinity
  const int bias = e5m2 ? 16 : 8, mbits = e5m2 ? 2 : 3;
  const int e = (v & 0x7F) >> mbits, m = v & ((1 << mbits) - 1);
  const double mag = e ? ldexp(1.0 + m / (double)(1 << mbits), e - bias)
                       : ldexp(m / (double)(1 << mbits), 1 - bias);
  return v & 0x80 ? -mag : mag;
}

// One MFMA for the calling lane's wave: each lane passes its KPL elements of A and of B
// (TA / TB raw element storage, decoded by `dec`) and its 4 accumulators, which become D.
template <int K, typename TA, typename TB, typename TC, typename Acc, typename Dec>
inline void mfma16(const TA* a, const TB* b, TC* c, Dec dec) {
  constexpr int KPL = K / 4;
  static_assert(KPL * sizeof(TA) <= SLOT_BYTES / 2 && KPL * sizeof(TB) <= SLOT_BYTES / 2,
                "mfma16: operands larger than a lane's exchange slot");
  Grid& g = *g_grid;
  const int t = flat_tid(), w = t / WAVE, l = t % WAVE;
  if (g.wave_bar[w].expected != WAVE) fail("MFMA issued by a wave of fewer than 64 lanes");
  unsigned char* area = g.xchg + (size_t)w * WAVE * SLOT_BYTES;
  memcpy(area + l * SLOT_BYTES, a, KPL * sizeof(TA));
  memcpy(area + l * SLOT_BYTES + SLOT_BYTES / 2, b, KPL * sizeof(TB));
  arrive(g.wave_bar[w], "an MFMA instruction");
  TC d[4];
  for (int r = 0; r < 4; ++r) {
    const int row = d_row(l, r), col = d_col(l);
    Acc sum = 0;
    for (int k = 0; k < K; ++k) {
      TA x;
      TB y;
      memcpy(&x, area + a_lane(row, k, KPL) * SLOT_BYTES + (k % KPL) * sizeof(TA), sizeof(TA));
      memcpy(&y, area + b_lane(k, col, KPL) * SLOT_BYTES + SLOT_BYTES / 2 + (k % KPL) * sizeof(TB),
             sizeof(TB));
      sum += dec(x, 0) * dec(y, 1);
    }
    d[r] = (TC)(c[r] + sum);
  }
  arrive(g.wave_bar[w], "an MFMA instruction");
  for (int r = 0; r < 4; ++r) c[r] = d[r];
}

}  // namespace emu

namespace isa {

using emu::dim3v;
inline dim3v thread_idx() { return emu::thread_idx(); }
inline dim3v block_idx() { return emu::block_idx(); }
inline void barrier() { emu::arrive(emu::g_grid->block_bar, "__syncthreads()"); }
inline void fence_device() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline int lane_id() { return emu::flat_tid() % emu::WAVE; }

inline int bpermute(int src, int v) {
  int out;
  emu::exchange(&v, sizeof v, src & (emu::WAVE - 1), &out);
  return out;
}

inline float exp_f32(float x) { return expf(x); }
inline float exp2_f32(float x) { return exp2f(x); }
inline float exp2_approx_f32(float x) {
  const float y = exp2f(x);
  return fabsf(y) < 1.17549435e-38f ? 0.0f : y;  // v_exp_f32 flushes results below 2^-126
}
inline float log_f32(float x) { return logf(x); }
inline float log2_f32(float x) { return log2f(x); }
inline float sqrt_f32(float x) { return sqrtf(x); }
inline double sqrt_f64(double x) { return sqrt(x); }

inline void mfma_f32_16x16x16_f16(const _Float16* a, const _Float16* b, float* c) {
  emu::mfma16<16, _Float16, _Float16, float, double>(
      a, b, c, [](_Float16 v, int) { return (double)v; });
}

inline void mfma_f32_16x16x16_bf16(const unsigned short* a, const unsigned short* b, float* c) {
  emu::mfma16<16, unsigned short, unsigned short, float, double>(a, b, c, [](unsigned short v,
                                                                             int) {
    const uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return (double)f;
  });
}

inline void mfma_f32_16x16x4_f32(const float* a, const float* b, float* c) {
  emu::mfma16<4, float, float, float, double>(a, b, c, [](float v, int) { return (double)v; });
}

#if defined(__gfx942__)
inline void mfma_i32_16x16x32_i8(const signed char* a, const signed char* b, int* c) {
  emu::mfma16<32, signed char, signed char, int, long long>(
      a, b, c, [](signed char v, int) { return (long long)v; });
}

template <bool BF8_A, bool BF8_B>
inline void mfma_f32_16x16x32_f8(const unsigned char* a, const unsigned char* b, float* c) {
  emu::mfma16<32, unsigned char, unsigned char, float, double>(
      a, b, c, [](unsigned char v, int which) {
        return emu::fnuz_f8(v, which == 0 ? BF8_A : BF8_B);
      });
}
#else
inline void mfma_i32_16x16x16_i8(const signed char* a, const signed char* b, int* c) {
  emu::mfma16<16, signed char, signed char, int, long long>(
      a, b, c, [](signed char v, int) { return (long long)v; });
}
#endif

// The blocks of the emulation run on one OS thread: atomics need no hardware support, but
// keep the GPU's semantics (a read-modify-write of the whole word).
template <typename W>
inline bool cas(W* addr, W& expected, W desired) {
  return __atomic_compare_exchange_n(addr, &expected, desired, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED);
}

template <typename T>
inline T fetch_add(T* addr, T v) {
  const T old = *addr;
  *addr = old + v;
  return old;
}

}  // namespace isa

namespace emu {

// The emulation program's entry (main): tiled_emulate.py writes the arguments into one
// file, BLOB; argv: BLOB gx gy gz bx by bz LDS_BYTES REDZONE then one token per kernel
// argument, "t:OFFSET:NBYTES" (a tensor's bytes at OFFSET, with REDZONE bytes of 0xA5
// before and after) or "s:OFFSET" (a scalar's bytes). Tensors are written back in place.
// Exit status 3 and a message on stderr: a deadlock, a write outside a tensor argument.
inline int main(int argc, char** argv, void (*launch)(void**), int nargs) {
  if (argc != 10 + nargs) fail("bad command line (tiled emulation driver)");
  const int fd = open(argv[1], O_RDWR);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) fail("cannot open the argument file");
  unsigned char* blob = (unsigned char*)mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE,
                                             MAP_SHARED, fd, 0);
  if (blob == MAP_FAILED) fail("cannot map the argument file");
  const dim3v grid = {(unsigned)atol(argv[2]), (unsigned)atol(argv[3]), (unsigned)atol(argv[4])};
  const dim3v block = {(unsigned)atol(argv[5]), (unsigned)atol(argv[6]),
                       (unsigned)atol(argv[7])};
  const size_t lds = (size_t)atoll(argv[8]), redzone = (size_t)atoll(argv[9]);
  void** args = new void*[nargs > 0 ? nargs : 1];
  for (int i = 0; i < nargs; ++i) {
    const char* tok = argv[10 + i];
    const size_t off = (size_t)atoll(tok + 2);
    args[i] = blob + off;
  }
  if (grid.x && grid.y && grid.z) run_grid(grid, block, lds, launch, args);
  for (int i = 0; i < nargs; ++i) {
    const char* tok = argv[10 + i];
    if (tok[0] != 't') continue;
    const char* colon = strchr(tok + 2, ':');
    const size_t off = (size_t)atoll(tok + 2), n = (size_t)atoll(colon + 1);
    for (size_t j = 0; j < redzone; ++j) {
      if (blob[off - 1 - j] != 0xA5 || blob[off + n + j] != 0xA5) {
        char msg[160];
        snprintf(msg, sizeof msg, "the kernel wrote outside tensor argument %d (%s %zu bytes "
                 "of it)", i, blob[off - 1 - j] != 0xA5 ? "before" : "after", j + 1);
        fail(msg);
      }
    }
  }
  msync(blob, st.st_size, MS_SYNC);
  munmap(blob, st.st_size);
  close(fd);
  delete[] args;
  return 0;
}

}  // namespace emu
}  // namespace tiled
