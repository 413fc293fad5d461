// tiled_msl_runtime.cc -- the emulation's runtime for Metal kernels on the CPU (linked with the
// kernel's MSL, built over tiled_msl_cpu.h; emulate.py drives it).
//
// Threadgroups run one after another; the threads of a group are fibers (ucontext) on one OS
// thread, switched only where threads meet: threadgroup_barrier (the group), and simdgroup
// functions, simdgroup_barrier and simdgroup matrix operations (the 32 lanes of a simdgroup).
// The fibers of even groups are started in ascending order, of odd groups in descending order,
// so a missing barrier between a write and another thread's read shows in one of them. What is
// an error (exit status 3, a message naming the threads and the MSL source lines):
//   - threads of a group reaching different barriers (a barrier in divergent code), or a thread
//     returning while others wait at a barrier (a barrier reached by part of the group);
//   - no thread able to run (a deadlock);
//   - threadgroup memory beyond 32 KB; a write outside a tensor argument (red zones).
// Threadgroup memory is filled with 0xFF before each group: a read of memory no thread of the
// group wrote gives NaN / -1, not an earlier group's data.
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

extern "C" void tiled_emu_kernel(void** buffers);

namespace {

constexpr int SIMD = 32;
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr size_t THREADGROUP_BYTES = 32 * 1024;
constexpr int SLOT = 64;  // bytes a lane may contribute to a simdgroup exchange

struct Rendezvous {
  int expected = 0, arrived = 0, line = 0;
  unsigned gen = 0;
};

struct Fiber {
  ucontext_t ctx;
  unsigned tid[3];
  int flat = 0;
  bool done = false;
  Rendezvous* waiting = nullptr;
  unsigned wait_gen = 0;
  int line = 0;
  size_t tg_offset = 0;  // the next threadgroup allocation of this thread
};

struct Group {
  unsigned grid[3], size[3], pos[3];
  int nthreads = 0, nsimd = 0, current = 0, finished = 0;
  Fiber* fibers = nullptr;
  char* stacks = nullptr;
  Rendezvous group_bar;
  Rendezvous* simd_bar = nullptr;
  unsigned char* xchg = nullptr;  // nsimd * SIMD * SLOT
  unsigned char* tg = nullptr;    // THREADGROUP_BYTES, 64-byte aligned
  size_t tg_high = 0;
  ucontext_t sched;
  void** buffers = nullptr;
  char msg[1024];
};

Group* g_group = nullptr;

Fiber& self() { return g_group->fibers[g_group->current]; }

[[noreturn]] void fail(const char* msg) {
  fprintf(stderr, "tiled emulation: %s\n", msg);
  exit(3);
}

// "threads 0-15, 17" for the fibers that satisfy `pred`.
template <typename P>
int list_threads(char* out, size_t n, P pred) {
  Group& g = *g_group;
  int len = 0, count = 0;
  for (int i = 0; i < g.nthreads && len < (int)n - 32; ++i) {
    if (!pred(g.fibers[i])) continue;
    int j = i;
    while (j + 1 < g.nthreads && pred(g.fibers[j + 1])) ++j;
    len += snprintf(out + len, n - len, count ? ", %d" : "%d", i);
    if (j > i) len += snprintf(out + len, n - len, "-%d", j);
    ++count;
    i = j;
  }
  return len;
}

[[noreturn]] void fail_group(const char* what) {
  Group& g = *g_group;
  int n = snprintf(g.msg, sizeof g.msg, "threadgroup (%u, %u, %u): %s", g.pos[0], g.pos[1],
                   g.pos[2], what);
  fail(g.msg);
  (void)n;
}

void yield() { swapcontext(&self().ctx, &g_group->sched); }

const char* kind(const Rendezvous* r) {
  return r == &g_group->group_bar ? "threadgroup_barrier" : "a simdgroup operation";
}

void arrive(Rendezvous& r, int line) {
  Group& g = *g_group;
  Fiber& f = self();
  char buf[512], who[256];
  if (&r == &g.group_bar && g.finished > 0) {
    list_threads(who, sizeof who, [](const Fiber& x) { return x.done; });
    snprintf(buf, sizeof buf, "thread %d reached threadgroup_barrier (MSL line %d) after "
             "threads %s returned: a barrier reached by part of the threadgroup", f.flat,
             line, who);
    fail_group(buf);
  }
  if (r.arrived > 0 && r.line != line) {
    list_threads(who, sizeof who, [&](const Fiber& x) { return x.waiting == &r; });
    snprintf(buf, sizeof buf, "divergent barrier: threads %s wait at %s on MSL line %d, thread "
             "%d reached %s on line %d", who, kind(&r), r.line, f.flat, kind(&r), line);
    fail_group(buf);
  }
  r.line = line;
  const unsigned gen = r.gen;
  if (++r.arrived >= r.expected) {
    r.arrived = 0;
    r.gen++;
    return;
  }
  f.waiting = &r;
  f.wait_gen = gen;
  f.line = line;
  yield();
  f.waiting = nullptr;
}

void fiber_main() {
  Group& g = *g_group;
  tiled_emu_kernel(g.buffers);
  Fiber& f = self();
  f.done = true;
  g.finished++;
  Rendezvous* pending = g.group_bar.arrived > 0 ? &g.group_bar : nullptr;
  const int simd = f.flat / SIMD;
  if (!pending && g.simd_bar[simd].arrived > 0) pending = &g.simd_bar[simd];
  if (pending) {
    char buf[512], who[256];
    list_threads(who, sizeof who, [&](const Fiber& x) { return x.waiting == pending; });
    snprintf(buf, sizeof buf, "thread %d returned while threads %s wait at %s (MSL line %d): "
             "a barrier reached by part of the %s", f.flat, who, kind(pending), pending->line,
             pending == &g.group_bar ? "threadgroup" : "simdgroup");
    fail_group(buf);
  }
  swapcontext(&f.ctx, &g.sched);
}

void deadlock() {
  Group& g = *g_group;
  char buf[900], who[256];
  int n = snprintf(buf, sizeof buf, "deadlock: no thread can run;");
  bool seen_group = false;
  int seen_lines[8], nseen = 0;
  for (int i = 0; i < g.nthreads && nseen < 8; ++i) {
    const Fiber& f = g.fibers[i];
    if (f.done) continue;
    const bool group = f.waiting == &g.group_bar;
    bool seen = group && seen_group;
    for (int j = 0; j < nseen && !group; ++j) seen |= seen_lines[j] == f.line;
    if (seen) continue;
    if (group) {
      seen_group = true;
    } else {
      seen_lines[nseen++] = f.line;
    }
    const int line = f.line;
    list_threads(who, sizeof who, [&](const Fiber& x) {
      return !x.done && (x.waiting == &g.group_bar) == group && (group || x.line == line);
    });
    n += snprintf(buf + n, sizeof buf - n, " threads %s wait at %s (MSL line %d);", who,
                  kind(f.waiting), line);
  }
  fail_group(buf);
}

void run_group(Group& g, bool descending) {
  g.group_bar = Rendezvous{};
  g.group_bar.expected = g.nthreads;
  g.finished = 0;
  for (int s = 0; s < g.nsimd; ++s) {
    g.simd_bar[s] = Rendezvous{};
    g.simd_bar[s].expected = g.nthreads - s * SIMD < SIMD ? g.nthreads - s * SIMD : SIMD;
  }
  memset(g.tg, 0xFF, THREADGROUP_BYTES);
  for (int i = 0; i < g.nthreads; ++i) {
    Fiber& f = g.fibers[i];
    f.done = false;
    f.waiting = nullptr;
    f.flat = i;
    f.tg_offset = 0;
    f.tid[0] = i % g.size[0];
    f.tid[1] = i / g.size[0] % g.size[1];
    f.tid[2] = i / (g.size[0] * g.size[1]);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g.stacks + (size_t)i * (STACK_BYTES + 4096) + 4096;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  int live = g.nthreads;
  while (live > 0) {
    bool ran = false;
    for (int k = 0; k < g.nthreads; ++k) {
      const int i = descending ? g.nthreads - 1 - k : k;
      Fiber& f = g.fibers[i];
      if (f.done || (f.waiting != nullptr && f.waiting->gen == f.wait_gen)) continue;
      g.current = i;
      swapcontext(&g.sched, &f.ctx);
      ran = true;
      if (f.done) live--;
    }
    if (!ran) deadlock();
  }
}

}  // namespace

extern "C" {

void* tiled_emu_threadgroup_alloc(size_t bytes, size_t align) {
  Fiber& f = self();
  const size_t at = (f.tg_offset + align - 1) / align * align;
  if (at + bytes > THREADGROUP_BYTES) {
    char buf[160];
    snprintf(buf, sizeof buf, "the kernel declares %zu bytes of threadgroup memory; Apple GPUs "
             "have %zu", at + bytes, THREADGROUP_BYTES);
    fail_group(buf);
  }
  f.tg_offset = at + bytes;
  return g_group->tg + at;
}

void tiled_emu_barrier(int line, int simdgroup) {
  Group& g = *g_group;
  arrive(simdgroup ? g.simd_bar[self().flat / SIMD] : g.group_bar, line);
}

int tiled_emu_simd_exchange(const void* mine, int bytes, void* all, int line, const char*) {
  Group& g = *g_group;
  if (bytes > SLOT) fail("a simd function of a value wider than the exchange slot");
  const int t = self().flat, s = t / SIMD, lane = t % SIMD;
  unsigned char* area = g.xchg + (size_t)s * SIMD * SLOT;
  memcpy(area + lane * SLOT, mine, bytes);
  arrive(g.simd_bar[s], line);
  const int lanes = g.simd_bar[s].expected;
  for (int i = 0; i < lanes; ++i) memcpy((char*)all + i * bytes, area + i * SLOT, bytes);
  arrive(g.simd_bar[s], line);
  return lanes;
}

void tiled_emu_fail(const char* what, int line) {
  char buf[512];
  snprintf(buf, sizeof buf, "thread %d, MSL line %d: %s", self().flat, line, what);
  fail_group(buf);
}

// which: 0 thread_position_in_threadgroup, 1 threadgroup_position_in_grid,
// 2 threads_per_threadgroup, 3 threadgroups_per_grid, 4 thread_position_in_grid.
void tiled_emu_position(int which, unsigned* xyz) {
  Group& g = *g_group;
  const Fiber& f = self();
  for (int d = 0; d < 3; ++d) {
    const unsigned v[5] = {f.tid[d], g.pos[d], g.size[d], g.grid[d],
                           g.pos[d] * g.size[d] + f.tid[d]};
    xyz[d] = v[which];
  }
}

int tiled_emu_lane(void) { return self().flat % SIMD; }

}  // extern "C"

// argv: BLOB gx gy gz tx ty tz REDZONE, then one token per buffer index: "t:OFFSET:NBYTES" (a
// tensor's bytes at OFFSET with REDZONE bytes of 0xA5 on each side), "s:OFFSET" (the argument
// struct) or "-" (no buffer). Tensors are written back in place.
int main(int argc, char** argv) {
  if (argc < 9) fail("bad command line (tiled emulation driver)");
  const int fd = open(argv[1], O_RDWR);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) fail("cannot open the argument file");
  unsigned char* blob =
      (unsigned char*)mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (blob == MAP_FAILED) fail("cannot map the argument file");
  Group g;
  for (int d = 0; d < 3; ++d) {
    g.grid[d] = (unsigned)atol(argv[2 + d]);
    g.size[d] = (unsigned)atol(argv[5 + d]);
  }
  const size_t redzone = (size_t)atoll(argv[8]);
  const int nbuf = argc - 9;
  g.buffers = new void*[nbuf > 0 ? nbuf : 1];
  for (int i = 0; i < nbuf; ++i) {
    const char* tok = argv[9 + i];
    g.buffers[i] = tok[0] == '-' ? nullptr : blob + atoll(tok + 2);
  }
  g.nthreads = (int)(g.size[0] * g.size[1] * g.size[2]);
  g.nsimd = (g.nthreads + SIMD - 1) / SIMD;
  g.fibers = new Fiber[g.nthreads];
  g.simd_bar = new Rendezvous[g.nsimd];
  g.xchg = new unsigned char[(size_t)g.nsimd * SIMD * SLOT];
  g.tg = (unsigned char*)aligned_alloc(64, THREADGROUP_BYTES);
  const size_t span = (size_t)g.nthreads * (STACK_BYTES + 4096);
  g.stacks = (char*)mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
  if (g.stacks == MAP_FAILED) fail("cannot map the fibers' stacks");
  for (int i = 0; i < g.nthreads; ++i)  // a guard page below each stack
    mprotect(g.stacks + (size_t)i * (STACK_BYTES + 4096), 4096, PROT_NONE);
  g_group = &g;
  unsigned long linear = 0;
  for (unsigned z = 0; z < g.grid[2]; ++z)
    for (unsigned y = 0; y < g.grid[1]; ++y)
      for (unsigned x = 0; x < g.grid[0]; ++x) {
        g.pos[0] = x, g.pos[1] = y, g.pos[2] = z;
        run_group(g, linear++ % 2 == 1);
      }
  for (int i = 0; i < nbuf; ++i) {
    const char* tok = argv[9 + i];
    if (tok[0] != 't') continue;
    const char* colon = strchr(tok + 2, ':');
    const size_t off = (size_t)atoll(tok + 2), n = (size_t)atoll(colon + 1);
    for (size_t j = 0; j < redzone; ++j) {
      if (blob[off - 1 - j] != 0xA5 || blob[off + n + j] != 0xA5) {
        char msg[160];
        snprintf(msg, sizeof msg, "the kernel wrote outside the tensor at buffer(%d) (%s %zu "
                 "bytes of it)", i, blob[off - 1 - j] != 0xA5 ? "before" : "after", j + 1);
        fail(msg);
      }
    }
  }
  msync(blob, st.st_size, MS_SYNC);
  return 0;
}
