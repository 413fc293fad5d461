/*
 * cpu_shim.c: the few runtime services a TVM LLVM (CPU) object needs, so that the linked .so is
 * self-contained and loads without libtvm_runtime / libtvm_ffi.
 *
 * A TVM 0.27 CPU object exports `__tvm_ffi_<name>` (the TVM FFI safe-call ABI) and reaches the
 * runtime in two ways:
 *   - direct calls to undefined functions (always `TVMFFIErrorSetRaisedFromCStrParts`);
 *   - "context pointers": weak, zero-initialised function-pointer *variables* such as
 *     `__TVMBackendParallelLaunch` that TVM's own loader fills after dlopen. Nothing fills them
 *     here, so the constructor below stores our implementations into those that exist.
 *
 * Every symbol here is hidden except the `tiled_*` entry points the Python runtime calls: the
 * references from the kernel object bind inside this .so, never to another library's copy.
 *
 * One thread pool per process: every kernel library carries a pool, but the runtime
 * (tiled.runtime.cpu) makes the first library it loads the process's pool and hands that one's
 * services (`tiled_pool`) to each library loaded after it (`tiled_use_pool`), which then
 * launches its parallel loops there and keeps its errors there. Kernels of one process thus
 * share one set of worker threads instead of each parking its own.
 *
 * Thread-safety: errors are thread-local; the parallel launcher is safe to call from several
 * threads at once (launches serialise on the pool; a nested launch runs inline as one task).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))

/* ---- declarations matching tvm/runtime/c_backend_api.h and tvm/ffi/c_api.h ------------------ */

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;

typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

enum { kDLCPU = 1, kTiledErrorCap = 4096, kWorkspaceAlign = 64, kTasksPerThread = 4 };

/* ---- the process's pool ---------------------------------------------------------------------- */

/* The services one library lends the others. kTiledPoolAbi changes with this layout or with the
   meaning of any field; a library refuses a pool of another ABI and keeps its own. */
enum { kTiledPoolAbi = 1 };
typedef struct {
  int abi;
  int (*launch)(FTVMParallelLambda flambda, void* cdata, int num_task);
  int (*barrier)(int task_id, TVMParallelGroupEnv* penv);
  void (*set_error)(const char* kind, const char** parts, int32_t n);
  const char* (*last_error)(void);
  void (*clear_error)(void);
  int (*set_num_threads)(int n);
  int (*get_num_threads)(void);
} tiled_pool_t;

/* Another library's pool this one uses, or NULL for its own. Set once, before any launch. */
static const tiled_pool_t* shared_pool;

/* ---- errors ---------------------------------------------------------------------------------- */

static __thread char tls_error[kTiledErrorCap];

static void error_append(char* buf, size_t* used, const char* text) {
  if (text == NULL) return;
  size_t n = strlen(text);
  size_t room = kTiledErrorCap - 1 - *used;
  if (n > room) n = room;
  memcpy(buf + *used, text, n);
  *used += n;
  buf[*used] = '\0';
}

HIDDEN void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  if (shared_pool != NULL) { /* the pool's worker threads report there */
    shared_pool->set_error(kind, parts, n);
    return;
  }
  size_t used = 0;
  tls_error[0] = '\0';
  error_append(tls_error, &used, kind ? kind : "Error");
  error_append(tls_error, &used, ": ");
  for (int32_t i = 0; i < n; ++i) error_append(tls_error, &used, parts[i]);
}

HIDDEN void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  const char* parts[1] = {message};
  TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}

static void set_errorf(const char* kind, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  TVMFFIErrorSetRaisedFromCStr(kind, msg);
}

/* The message of the last failure on this thread ("Kind: message"), or "" if none. */
EXPORT const char* tiled_last_error(void) {
  return shared_pool != NULL ? shared_pool->last_error() : tls_error;
}

EXPORT void tiled_clear_error(void) {
  if (shared_pool != NULL)
    shared_pool->clear_error();
  else
    tls_error[0] = '\0';
}

/* ---- workspace -------------------------------------------------------------------------------
 * TVM's code allocates a block's tiles when the block starts and frees them when it ends, so a
 * kernel allocates and frees the same sizes once per block. For tiled.ops' float32 softmax (one
 * 64 KiB tile per block of 4 rows of 4096) glibc's malloc and free (consolidating the freed
 * chunk each time) were 3-4% of a softmax loop's samples (libc 4.4% -> 1.2% with this cache:
 * benchmarks/results/cpu_workspace_reuse_ab.log). Each thread therefore keeps up to
 * kCachedBlocks freed blocks, kCachedBytes at most together, and hands them out again. A block
 * carries its size in a header of kWorkspaceAlign bytes before it. */

enum { kCachedBlocks = 8 };
static const size_t kCachedBytes = (size_t)4 << 20;

typedef struct {
  char* base;  /* what posix_memalign returned; the block starts kWorkspaceAlign past it */
  size_t size; /* the block's bytes */
} cached_block_t;

static __thread cached_block_t tls_blocks[kCachedBlocks];
static __thread int tls_num_blocks;
static __thread size_t tls_cached_bytes;

HIDDEN void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                      int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id, (void)dtype_code_hint, (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    set_errorf("RuntimeError", "workspace on device type %d requested from a CPU kernel",
               device_type);
    return NULL;
  }
  size_t size = nbytes ? (size_t)nbytes : 1;
  int best = -1; /* the smallest cached block that holds `size` */
  for (int i = 0; i < tls_num_blocks; i++)
    if (tls_blocks[i].size >= size && (best < 0 || tls_blocks[i].size < tls_blocks[best].size))
      best = i;
  if (best >= 0) {
    char* base = tls_blocks[best].base;
    tls_cached_bytes -= tls_blocks[best].size;
    tls_blocks[best] = tls_blocks[--tls_num_blocks];
    return base + kWorkspaceAlign;
  }
  void* base = NULL;
  if (size > SIZE_MAX - kWorkspaceAlign ||
      posix_memalign(&base, kWorkspaceAlign, size + kWorkspaceAlign) != 0) {
    set_errorf("MemoryError", "could not allocate %llu bytes of kernel workspace",
               (unsigned long long)nbytes);
    return NULL;
  }
  *(size_t*)base = size;
  return (char*)base + kWorkspaceAlign;
}

HIDDEN int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  if (ptr == NULL) return 0;
  char* base = (char*)ptr - kWorkspaceAlign;
  size_t size = *(size_t*)base;
  if (size <= kCachedBytes - tls_cached_bytes && tls_num_blocks < kCachedBlocks) {
    tls_blocks[tls_num_blocks].base = base;
    tls_blocks[tls_num_blocks].size = size;
    tls_num_blocks++;
    tls_cached_bytes += size;
    return 0;
  }
  free(base);
  return 0;
}

/* ---- parallel launch ------------------------------------------------------------------------- */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int count;
  int total;
  unsigned phase;
} barrier_t;

typedef struct {
  pthread_mutex_t launch_mu; /* one launch at a time uses the pool */
  pthread_mutex_t mu;        /* guards everything below */
  pthread_cond_t work_cv;
  pthread_cond_t done_cv;
  int num_threads;    /* threads a launch uses, the caller included */
  int num_workers;    /* worker threads started so far */
  uint64_t generation;
  int participants;   /* threads taking part in the current launch */
  int dynamic;        /* tasks go to whichever thread is free (run_tasks) */
  int next_task;      /* the next task of a dynamic launch */
  uint64_t pending;   /* participating workers not finished yet (spun on: 64 bits) */
  FTVMParallelLambda flambda;
  void* cdata;
  TVMParallelGroupEnv env;
  int status;
  char error[kTiledErrorCap];
} pool_t;

static pool_t pool = {
    .launch_mu = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};
static barrier_t pool_barrier = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
static __thread int tls_in_parallel;

static int usable_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Sets the threads a parallel loop uses (the calling thread included); n <= 0 means the CPUs
   this process may run on. Returns the value now in effect. */
EXPORT int tiled_set_num_threads(int n) {
  if (shared_pool != NULL) return shared_pool->set_num_threads(n);
  if (n <= 0) n = usable_cpus();
  if (n > 1024) n = 1024;
  pthread_mutex_lock(&pool.launch_mu);
  pool.num_threads = n;
  pthread_mutex_unlock(&pool.launch_mu);
  return n;
}

EXPORT int tiled_get_num_threads(void) {
  if (shared_pool != NULL) return shared_pool->get_num_threads();
  pthread_mutex_lock(&pool.launch_mu);
  if (pool.num_threads <= 0) pool.num_threads = usable_cpus();
  int n = pool.num_threads;
  pthread_mutex_unlock(&pool.launch_mu);
  return n;
}

/* Runs the tasks of one thread: task ids index, index + stride, ... below num_task; or, for
   a launch that left the task count to the pool (`dynamic`), whichever task is next, so that
   a thread the OS preempts (the CPUs are shared) holds up only the task it is in, not a fixed
   share of the loop. On failure the first error is copied to the pool, since the error is
   thread-local to this worker, and no further task starts. */
static void run_tasks(int index, int stride, FTVMParallelLambda f, void* cdata,
                      TVMParallelGroupEnv* env, int* status, char* error) {
  for (int t = index;; t += stride) {
    if (pool.dynamic) {
      t = __atomic_fetch_add(&pool.next_task, 1, __ATOMIC_RELAXED);
      if (__atomic_load_n(status, __ATOMIC_RELAXED) != 0) return;
    }
    if (t >= env->num_task) return;
    int rc = f(t, env, cdata);
    if (rc != 0) {
      pthread_mutex_lock(&pool.mu);
      if (*status == 0) {
        *status = rc;
        memcpy(error, tls_error, kTiledErrorCap);
      }
      pthread_mutex_unlock(&pool.mu);
      return;
    }
  }
}

/* How long a thread spins for the next event (a worker for the next launch, the launching
   thread for its workers to finish) before it sleeps on a condition variable: waking a
   sleeping thread costs tens of microseconds on a virtual machine (57 us measured per launch
   on a 2-core KVM guest), more than a small kernel runs. 0: sleep at once. */
static int64_t spin_ns = 200 * 1000;

EXPORT int tiled_set_spin_us(int us) {
  if (shared_pool != NULL) return -1; /* the pool's owner decides */
  __atomic_store_n(&spin_ns, us > 0 ? (int64_t)us * 1000 : 0, __ATOMIC_RELAXED);
  return 0;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins until *word != value or the spin budget is spent; returns whether it changed. */
static int spin_while_equal(const uint64_t* word, uint64_t value) {
  int64_t budget = __atomic_load_n(&spin_ns, __ATOMIC_RELAXED);
  if (budget <= 0) return 0;
  int64_t deadline = now_ns() + budget;
  for (unsigned i = 1;; ++i) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != value) return 1;
    cpu_relax();
    if ((i & 63) == 0 && now_ns() > deadline) return 0;
  }
}

static void* worker_main(void* arg) {
  int index = (int)(intptr_t)arg; /* 1..num_workers; the launching thread is 0 */
  uint64_t seen = 0;
  tls_in_parallel = 1;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    if (pool.generation == seen) {
      pthread_mutex_unlock(&pool.mu);
      spin_while_equal(&pool.generation, seen);
      pthread_mutex_lock(&pool.mu);
      while (pool.generation == seen) pthread_cond_wait(&pool.work_cv, &pool.mu);
    }
    seen = pool.generation;
    if (index >= pool.participants) continue;
    FTVMParallelLambda f = pool.flambda;
    void* cdata = pool.cdata;
    int stride = pool.participants;
    pthread_mutex_unlock(&pool.mu);
    run_tasks(index, stride, f, cdata, &pool.env, &pool.status, pool.error);
    pthread_mutex_lock(&pool.mu);
    if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_RELEASE) == 0)
      pthread_cond_signal(&pool.done_cv);
  }
  return NULL;
}

/* Starts workers up to `want`; returns how many exist (fewer if pthread_create failed). */
static int ensure_workers(int want) {
  while (pool.num_workers < want) {
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&tid, &attr, worker_main, (void*)(intptr_t)(pool.num_workers + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0) break;
    pool.num_workers++;
  }
  return pool.num_workers;
}

static void run_inline(FTVMParallelLambda flambda, void* cdata, int* rc) {
  /* One task covers the whole range: TVM's lambdas split work by penv->num_task. */
  TVMParallelGroupEnv env = {NULL, 1};
  barrier_t single = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1, 0};
  env.sync_handle = &single;
  *rc = flambda(0, &env, cdata);
}

HIDDEN int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  int rc = 0;
  if (tls_in_parallel) { /* nested parallel loop: run it on this thread */
    run_inline(flambda, cdata, &rc);
    return rc;
  }
  pthread_mutex_lock(&pool.launch_mu);
  if (pool.num_threads <= 0) pool.num_threads = usable_cpus();
  int requested = num_task;
  if (num_task <= 0) num_task = pool.num_threads;
  int participants = num_task < pool.num_threads ? num_task : pool.num_threads;
  pthread_mutex_lock(&pool.mu);
  int workers = ensure_workers(participants - 1);
  if (participants > workers + 1) participants = workers + 1;
  /* TVM's lambdas split the loop into num_task contiguous chunks: when the count is ours to
     choose, a few per thread, handed out as threads come free. */
  if (requested <= 0) num_task = participants * kTasksPerThread;
  if (participants <= 1) {
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.launch_mu);
    tls_in_parallel = 1;
    run_inline(flambda, cdata, &rc);
    tls_in_parallel = 0;
    return rc;
  }
  pool_barrier.count = 0;
  pool_barrier.total = participants;
  pool.flambda = flambda;
  pool.cdata = cdata;
  pool.env.sync_handle = &pool_barrier;
  pool.env.num_task = num_task;
  pool.dynamic = requested <= 0;
  pool.next_task = 0;
  pool.participants = participants;
  pool.pending = participants - 1;
  pool.status = 0;
  pool.error[0] = '\0';
  __atomic_add_fetch(&pool.generation, 1, __ATOMIC_RELEASE); /* spinning workers read it */
  pthread_cond_broadcast(&pool.work_cv);
  pthread_mutex_unlock(&pool.mu);

  tls_in_parallel = 1;
  run_tasks(0, participants, flambda, cdata, &pool.env, &pool.status, pool.error);
  tls_in_parallel = 0;

  /* The workers finish about when this thread does: spin for them before sleeping. */
  uint64_t left = __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE);
  while (left > 0 && spin_while_equal(&pool.pending, left))
    left = __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE);
  pthread_mutex_lock(&pool.mu);
  while (pool.pending > 0) pthread_cond_wait(&pool.done_cv, &pool.mu);
  rc = pool.status;
  if (rc != 0) memcpy(tls_error, pool.error, kTiledErrorCap);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.launch_mu);
  return rc;
}

HIDDEN int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  barrier_t* b = (barrier_t*)penv->sync_handle;
  if (b == NULL || b->total <= 1) return 0;
  if (penv->num_task > b->total) {
    /* Tasks beyond the thread count run one after another on a thread; a barrier among them
       would never open. */
    set_errorf("RuntimeError", "parallel barrier with %d tasks on %d threads", penv->num_task,
               b->total);
    return -1;
  }
  pthread_mutex_lock(&b->mu);
  unsigned phase = b->phase;
  if (++b->count == b->total) {
    b->count = 0;
    b->phase++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (phase == b->phase) pthread_cond_wait(&b->cv, &b->mu);
  }
  pthread_mutex_unlock(&b->mu);
  return 0;
}

/* ---- atomics: T.atomic_add on cpu lowers to call_extern("tiled_atomic_add_<dtype>") ---------
 * Each returns the value it replaced (T.atomic_add(..., return_prev=True)); tiled_fence orders
 * a block's memory accesses against other blocks' (memory_order other than relaxed). */

HIDDEN void tiled_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- streaming stores (targets/cpu/stream_out.py) --------------------------------------------
 * A kernel whose output may take non-temporal stores asks once per call whether this one
 * does: the output 16-byte aligned (the alignment the streaming loop was compiled for) and at
 * least the threshold in bytes: TILED_CPU_STREAM_BYTES when set (0: every aligned output), else
 * twice the largest cache this CPU reports in sysfs, else 64 MiB. An output that fits the
 * cache may be read back from there by the next kernel, and one about its size still keeps
 * part of itself there: tiled.ops' bfloat16 RMSNorm over 4096 x 4096 (32 MiB, the AVX2
 * development VM's L3) ran 0.91-0.97x as fast streamed
 * (benchmarks/results/cpu_stream_stores_threshold_1x_llc.json). */

static int64_t largest_cache_bytes(void) {
  int64_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96], text[32];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE* f = fopen(path, "r");
    if (f == NULL) continue;
    char* got = fgets(text, sizeof text, f);
    fclose(f);
    if (got == NULL) continue;
    char* end;
    long long n = strtoll(text, &end, 10);
    int64_t bytes = n * (*end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1);
    if (n > 0 && bytes > best) best = bytes;
  }
  return best;
}

static int64_t stream_threshold(void) {
  static int64_t cached = -1;
  int64_t t = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (t >= 0) return t;
  const char* env = getenv("TILED_CPU_STREAM_BYTES");
  char* end = NULL;
  long long v = env != NULL && *env != '\0' ? strtoll(env, &end, 10) : -1;
  if (env != NULL && end != NULL && *end == '\0' && v >= 0) {
    t = v;
  } else {
    t = 2 * largest_cache_bytes();
    if (t <= 0) t = 64LL << 20;
  }
  __atomic_store_n(&cached, t, __ATOMIC_RELAXED);
  return t;
}

HIDDEN int32_t tiled_stream_ok(const void* out, int64_t nbytes) {
  return ((uintptr_t)out & 15) == 0 && nbytes >= stream_threshold();
}

/* The threshold this library's kernels stream above (tests, diagnostics). */
EXPORT int64_t tiled_stream_threshold(void) { return stream_threshold(); }

HIDDEN int32_t tiled_atomic_add_int32(int32_t* addr, int32_t value) {
  return __atomic_fetch_add(addr, value, __ATOMIC_RELAXED);
}

HIDDEN int64_t tiled_atomic_add_int64(int64_t* addr, int64_t value) {
  return __atomic_fetch_add(addr, value, __ATOMIC_RELAXED);
}

/* Floats: compare-and-swap on the bit pattern until no other thread got in between. */
HIDDEN float tiled_atomic_add_float32(float* addr, float value) {
  uint32_t* bits = (uint32_t*)addr;
  uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), want;
  float was;
  do {
    float sum;
    memcpy(&was, &old, sizeof was);
    sum = was + value;
    memcpy(&want, &sum, sizeof want);
  } while (!__atomic_compare_exchange_n(bits, &old, want, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return was;
}

HIDDEN double tiled_atomic_add_float64(double* addr, double value) {
  uint64_t* bits = (uint64_t*)addr;
  uint64_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), want;
  double was;
  do {
    double sum;
    memcpy(&was, &old, sizeof was);
    sum = was + value;
    memcpy(&want, &sum, sizeof want);
  } while (!__atomic_compare_exchange_n(bits, &old, want, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return was;
}

/* ---- T.atomic_max / T.atomic_min: call_extern("tiled_atomic_{max,min}_<dtype>") ---------------
 * A compare-and-swap loop that stops as soon as the stored value already wins, so a max that
 * changes nothing writes nothing. The value replaces the stored one only when it compares
 * greater (max) or less (min), as IEEE compares: a NaN on either side changes nothing, and
 * -0.0 equals +0.0 (the CUDA backend's rule, tiled_atomic.h). Floats travel as their bits
 * (float16 and bfloat16 have no calling convention common to LLVM and C compilers) and are
 * compared through a key that sorts as the values do; the result is always one of the two
 * operands, so no conversion is needed. */

#define TILED_ATOMIC_INT(op, name, T, wins)                                                 \
  HIDDEN T tiled_atomic_##op##_##name(T* addr, T value) {                                  \
    T old = __atomic_load_n(addr, __ATOMIC_RELAXED);                                      \
    while ((wins) &&                                                                      \
           !__atomic_compare_exchange_n(addr, &old, value, 1, __ATOMIC_RELAXED,           \
                                        __ATOMIC_RELAXED)) {                              \
    }                                                                                     \
    return old;                                                                           \
  }
#define TILED_ATOMIC_INTS(name, T)                   \
  TILED_ATOMIC_INT(max, name, T, value > old)        \
  TILED_ATOMIC_INT(min, name, T, value < old)
TILED_ATOMIC_INTS(int8, int8_t)
TILED_ATOMIC_INTS(int16, int16_t)
TILED_ATOMIC_INTS(int32, int32_t)
TILED_ATOMIC_INTS(int64, int64_t)
TILED_ATOMIC_INTS(uint8, uint8_t)
TILED_ATOMIC_INTS(uint16, uint16_t)
TILED_ATOMIC_INTS(uint32, uint32_t)
TILED_ATOMIC_INTS(uint64, uint64_t)

/* An IEEE value's bits (NaN excluded) as an unsigned key that sorts as the value does; both
 * zeros map to one key. */
#define TILED_FLOAT_KEY(U, bits, sign)                                       \
  (((bits) & (U) ~(sign)) == 0 ? (U)(sign)                                   \
                               : (bits) & (sign) ? (U) ~(bits) : (U)((bits) | (sign)))
#define TILED_IS_NAN(U, bits, sign, inf) (((bits) & (U) ~(sign)) > (inf))
#define TILED_ATOMIC_FLOAT(op, name, U, sign, inf, beats)                                   \
  HIDDEN U tiled_atomic_##op##_##name(U* addr, U value) {                                  \
    if (TILED_IS_NAN(U, value, sign, inf)) return __atomic_load_n(addr, __ATOMIC_RELAXED); \
    U key = TILED_FLOAT_KEY(U, value, sign);                                              \
    U old = __atomic_load_n(addr, __ATOMIC_RELAXED);                                      \
    while (!TILED_IS_NAN(U, old, sign, inf) && key beats TILED_FLOAT_KEY(U, old, sign) &&  \
           !__atomic_compare_exchange_n(addr, &old, value, 1, __ATOMIC_RELAXED,           \
                                        __ATOMIC_RELAXED)) {                              \
    }                                                                                     \
    return old;                                                                           \
  }
#define TILED_ATOMIC_FLOATS(name, U, sign, inf)            \
  TILED_ATOMIC_FLOAT(max, name, U, sign, inf, >)           \
  TILED_ATOMIC_FLOAT(min, name, U, sign, inf, <)
TILED_ATOMIC_FLOATS(float16, uint16_t, (uint16_t)0x8000u, (uint16_t)0x7c00u)
TILED_ATOMIC_FLOATS(bfloat16, uint16_t, (uint16_t)0x8000u, (uint16_t)0x7f80u)
TILED_ATOMIC_FLOATS(float32, uint32_t, 0x80000000u, 0x7f800000u)
TILED_ATOMIC_FLOATS(float64, uint64_t, 0x8000000000000000ull, 0x7ff0000000000000ull)

/* ---- FFI services a tiled kernel never needs; they fail loudly instead of jumping to NULL ---- */

HIDDEN int TVMFFIEnvModLookupFromImports(void* library_ctx, const char* func_name, void** out) {
  (void)library_ctx, (void)out;
  set_errorf("RuntimeError", "kernel looked up function '%s': the tiled runtime has no TVM "
             "function registry", func_name ? func_name : "?");
  return -1;
}

HIDDEN int TVMFFIFunctionCall(void* func, void* args, int32_t num_args, void* result) {
  (void)func, (void)args, (void)num_args, (void)result;
  set_errorf("RuntimeError", "kernel called a TVM packed function: unsupported by the tiled "
             "runtime");
  return -1;
}

static pthread_mutex_t init_once_mu = PTHREAD_MUTEX_INITIALIZER;

HIDDEN int TVMFFIHandleInitOnce(void** handle_addr, int (*init_func)(void** result)) {
  int rc = 0;
  pthread_mutex_lock(&init_once_mu);
  if (*handle_addr == NULL) {
    void* result = NULL;
    rc = init_func(&result);
    if (rc == 0) *handle_addr = result;
  }
  pthread_mutex_unlock(&init_once_mu);
  return rc;
}

/* ---- context pointers ------------------------------------------------------------------------ */

/* Weak and hidden: a pointer the object does not define stays NULL (hidden undefined weak
   symbols resolve at link time, never against another loaded library). */
#define CONTEXT_POINTER(name) extern void* __##name __attribute__((weak, visibility("hidden")));
CONTEXT_POINTER(TVMBackendParallelLaunch)
CONTEXT_POINTER(TVMBackendParallelBarrier)
CONTEXT_POINTER(TVMBackendAllocWorkspace)
CONTEXT_POINTER(TVMBackendFreeWorkspace)
CONTEXT_POINTER(TVMFFIErrorSetRaisedFromCStr)
CONTEXT_POINTER(TVMFFIEnvModLookupFromImports)
CONTEXT_POINTER(TVMFFIFunctionCall)
CONTEXT_POINTER(TVMFFIHandleInitOnce)
#undef CONTEXT_POINTER

#define FILL(name) \
  if (&__##name != NULL) __##name = (void*)&name;

static void after_fork_in_child(void) {
  /* Worker threads do not survive fork(); the child starts its own on first use. */
  pthread_mutex_init(&pool.launch_mu, NULL);
  pthread_mutex_init(&pool.mu, NULL);
  pthread_cond_init(&pool.work_cv, NULL);
  pthread_cond_init(&pool.done_cv, NULL);
  pool.num_workers = 0;
  pool.generation = 0;
  pool.participants = 0;
  pool.pending = 0;
  tls_in_parallel = 0;
}

/* This library's own pool services, for the libraries loaded after it. */
EXPORT const tiled_pool_t* tiled_pool(void) {
  static const tiled_pool_t mine = {kTiledPoolAbi,
                                    TVMBackendParallelLaunch,
                                    TVMBackendParallelBarrier,
                                    TVMFFIErrorSetRaisedFromCStrParts,
                                    tiled_last_error,
                                    tiled_clear_error,
                                    tiled_set_num_threads,
                                    tiled_get_num_threads};
  return &mine;
}

/* Makes this library launch its parallel loops on `owner` (another library's tiled_pool()) and
   report errors there. Call it once, before the kernel first runs. Returns 0, or -1 (and keeps
   this library's own pool) when `owner` has another ABI or is this library's own. */
EXPORT int tiled_use_pool(const tiled_pool_t* owner) {
  if (owner == NULL || owner->abi != kTiledPoolAbi || owner == tiled_pool()) return -1;
  if (&__TVMBackendParallelLaunch != NULL) __TVMBackendParallelLaunch = (void*)owner->launch;
  if (&__TVMBackendParallelBarrier != NULL) __TVMBackendParallelBarrier = (void*)owner->barrier;
  shared_pool = owner;
  return 0;
}

__attribute__((constructor)) static void tiled_shim_init(void) {
  FILL(TVMBackendParallelLaunch)
  FILL(TVMBackendParallelBarrier)
  FILL(TVMBackendAllocWorkspace)
  FILL(TVMBackendFreeWorkspace)
  FILL(TVMFFIErrorSetRaisedFromCStr)
  FILL(TVMFFIEnvModLookupFromImports)
  FILL(TVMFFIFunctionCall)
  FILL(TVMFFIHandleInitOnce)
  pthread_atfork(NULL, NULL, after_fork_in_child);
}
#undef FILL
