"""The C compiler driver and the CPU runtime shim it links into every CPU kernel."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tiled import config
from tiled.compiler.toolchain import cc
from tiled.errors import ToolchainError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _scoped_config(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield


def test_cc_version_names_the_compiler():
    v = cc.cc_version()
    assert v and "\n" not in v


def test_shim_objects_are_cached_per_digest_and_level(tmp_path):
    first = cc.shim_objects()
    assert [p.parent for p in first] == [tmp_path / "cache" / "shim"] * len(cc.SHIM_SOURCES)
    stamps = [p.stat().st_mtime_ns for p in first]
    assert cc.shim_objects() == first and [p.stat().st_mtime_ns for p in first] == stamps
    assert sorted(p.name for p in first[0].parent.iterdir()) == sorted(p.name for p in first)
    other = cc.shim_objects(("-O1",))  # another level's flags: other objects, both kept
    assert not set(other) & set(first) and all(p.is_file() for p in first + other)


def test_a_second_cache_dir_gets_the_objects_this_process_compiled(tmp_path, monkeypatch):
    first = cc.shim_objects(("-O1",))
    calls = []
    monkeypatch.setattr(cc, "_run", lambda argv, what: calls.append(what))
    with config.override(cache_dir=tmp_path / "other"):
        second = cc.shim_objects(("-O1",))
    assert not calls, calls  # no compile: the bytes came from this process's first one
    assert [p.parent for p in second] == [tmp_path / "other" / "shim"] * len(cc.SHIM_SOURCES)
    assert [p.read_bytes() for p in second] == [p.read_bytes() for p in first]
    assert not [p for p in second[0].parent.iterdir() if p.name.startswith(".")]


def test_missing_compiler_is_a_toolchain_error():
    with config.override(cc="no-such-cc-tiled"), pytest.raises(ToolchainError, match="TILED_CC"):
        cc.cc_version()


def test_link_failure_carries_tool_output(tmp_path):
    with pytest.raises(ToolchainError, match="does not exist"):
        cc.link_cpu_library(tmp_path / "missing.o", tmp_path / "k.so")
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"not an object file")
    with pytest.raises(ToolchainError, match=r"linking the CPU kernel failed[\s\S]*junk\.o"):
        cc.link_cpu_library(junk, tmp_path / "k.so")
    assert not (tmp_path / "k.so").exists()


# Stands in for a TVM object: it defines context pointers the way TVM's LLVM codegen does
# (weak, zero-initialised, default visibility) and exports a safe-call style entry.
FAKE_KERNEL = r"""
#include <stdint.h>
__attribute__((weak)) void* __TVMBackendParallelLaunch = 0;
__attribute__((weak)) void* __TVMBackendAllocWorkspace = 0;
void TVMFFIErrorSetRaisedFromCStrParts(const char*, const char**, int32_t);
int __tvm_ffi_fake(void* self, const void* args, int32_t n, void* result) {
  const char* parts[3] = {"bad ", 0, "input"};
  if (n != 0) { TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 3); return -1; }
  return __TVMBackendParallelLaunch && __TVMBackendAllocWorkspace ? 0 : 7;
}
"""


def test_linked_library_exports_only_entry_and_shim_api(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text(FAKE_KERNEL)
    obj = tmp_path / "fake.o"
    subprocess.run(["cc", "-c", "-fPIC", str(src), "-o", str(obj)], check=True)
    cc.link_cpu_library(obj, tmp_path / "fake.so")
    nm = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "fake.so")],
                        capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in nm.splitlines()}
    assert {"__tvm_ffi_fake", "tiled_last_error", "tiled_set_num_threads"} <= names
    assert not {n for n in names if n.startswith(("TVM", "__TVM"))}, names

    import ctypes

    lib = ctypes.CDLL(str(tmp_path / "fake.so"), mode=ctypes.RTLD_LOCAL)
    lib.tiled_last_error.restype = ctypes.c_char_p
    assert lib.__tvm_ffi_fake(None, None, 0, None) == 0  # the constructor filled both pointers
    assert lib.__tvm_ffi_fake(None, None, 1, None) == -1
    assert lib.tiled_last_error() == b"ValueError: bad input"  # NULL parts are skipped


# Drives the shim's parallel launcher, barrier and workspace directly.
HARNESS = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int, Env*, void*);
int TVMBackendParallelLaunch(Lambda, void*, int);
int TVMBackendParallelBarrier(int, Env*);
void* TVMBackendAllocWorkspace(int, int, uint64_t, int, int);
int TVMBackendFreeWorkspace(int, int, void*);
int TVMFFIHandleInitOnce(void**, int (*)(void**));
void tiled_atomic_add_float32(float*, float);
void tiled_atomic_add_float64(double*, double);
void tiled_atomic_add_int32(int32_t*, int32_t);
void tiled_atomic_add_int64(int64_t*, int64_t);
void TVMFFIErrorSetRaisedFromCStrParts(const char*, const char**, int32_t);
const char* tiled_last_error(void);
int tiled_set_num_threads(int);

static int hits[64], phase_ok = 1, seen_tasks;
static int stage[64];
static pthread_t who[64];

static int count(int task, Env* env, void* cdata) {
  (void)cdata;
  __atomic_add_fetch(&hits[task], 1, __ATOMIC_SEQ_CST);
  who[task] = pthread_self();
  __atomic_store_n(&seen_tasks, env->num_task, __ATOMIC_SEQ_CST);
  return 0;
}
static int with_barrier(int task, Env* env, void* cdata) {
  (void)cdata;
  for (int round = 1; round <= 50; ++round) {
    stage[task] = round;
    if (TVMBackendParallelBarrier(task, env)) return -1;
    for (int t = 0; t < env->num_task; ++t) if (stage[t] < round) phase_ok = 0;
    if (TVMBackendParallelBarrier(task, env)) return -1;
  }
  return 0;
}
static int failing(int task, Env* env, void* cdata) {
  (void)cdata;
  if (task == env->num_task - 1) {
    const char* parts[1] = {"task failed on a worker"};
    TVMFFIErrorSetRaisedFromCStrParts("RuntimeError", parts, 1);
    return -1;
  }
  return 0;
}
static int inner_tasks;
static int inner(int task, Env* env, void* cdata) { (void)task, (void)cdata;
  inner_tasks = env->num_task; return 0; }
static int outer(int task, Env* env, void* cdata) { (void)env, (void)cdata;
  return task == 0 ? TVMBackendParallelLaunch(inner, 0, 0) : 0; }
static float f32;
static double f64;
static int32_t i32;
static int64_t i64;
static int adds(int task, Env* env, void* cdata) {
  (void)task, (void)env, (void)cdata;
  for (int i = 0; i < 100000; ++i) {
    tiled_atomic_add_float32(&f32, 1.0f);
    tiled_atomic_add_float64(&f64, 0.5);
    tiled_atomic_add_int32(&i32, 1);
    tiled_atomic_add_int64(&i64, 1LL << 33);
  }
  return 0;
}
static int inits;
static int init(void** out) { ++inits; *out = (void*)0x1; return 0; }

#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c); \
  return 1; } } while (0)
int main(void) {
  CHECK(tiled_set_num_threads(4) == 4);
  CHECK(TVMBackendParallelLaunch(count, 0, 4) == 0);  /* task t on thread t */
  CHECK(seen_tasks == 4);
  for (int t = 0; t < 4; ++t) CHECK(hits[t] == 1);
  CHECK(pthread_equal(who[0], pthread_self()));
  CHECK(!pthread_equal(who[3], pthread_self()));
  memset(hits, 0, sizeof hits);
  CHECK(TVMBackendParallelLaunch(count, 0, 0) == 0);  /* the pool's choice: 4 per thread */
  CHECK(seen_tasks == 16);
  for (int t = 0; t < 16; ++t) CHECK(hits[t] == 1);
  memset(hits, 0, sizeof hits);
  CHECK(TVMBackendParallelLaunch(count, 0, 10) == 0);  /* more tasks than threads */
  for (int t = 0; t < 10; ++t) CHECK(hits[t] == 1);
  CHECK(TVMBackendParallelLaunch(with_barrier, 0, 4) == 0 && phase_ok);
  CHECK(TVMBackendParallelLaunch(failing, 0, 0) == -1);  /* the last of 16 dynamic tasks */
  CHECK(strcmp(tiled_last_error(), "RuntimeError: task failed on a worker") == 0);
  CHECK(TVMBackendParallelLaunch(outer, 0, 0) == 0 && inner_tasks == 1);
  CHECK(tiled_set_num_threads(1) == 1);
  CHECK(TVMBackendParallelLaunch(with_barrier, 0, 0) == 0 && phase_ok);
  void* p = TVMBackendAllocWorkspace(1, 0, 1 << 20, 2, 32);
  CHECK(p && ((uintptr_t)p % 64) == 0);
  CHECK(TVMBackendFreeWorkspace(1, 0, p) == 0);
  CHECK(TVMBackendAllocWorkspace(2, 0, 16, 2, 32) == 0);
  CHECK(strstr(tiled_last_error(), "device type 2") != 0);
  CHECK(tiled_set_num_threads(4) == 4);
  CHECK(TVMBackendParallelLaunch(adds, 0, 4) == 0);  /* 4 threads x 100000 adds, exact */
  CHECK(f32 == 400000.0f && f64 == 200000.0 && i32 == 400000 && i64 == 400000LL << 33);
  void* handle = 0;
  CHECK(TVMFFIHandleInitOnce(&handle, init) == 0 && TVMFFIHandleInitOnce(&handle, init) == 0);
  CHECK(inits == 1 && handle == (void*)0x1);
  puts("ok");
  return 0;
}
"""


def test_shim_parallel_runtime(tmp_path):
    src = tmp_path / "harness.c"
    src.write_text(HARNESS)
    exe = tmp_path / "harness"
    subprocess.run(["cc", "-O1", "-pthread", str(src), *map(str, cc.shim_objects()), "-o",
                    str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.parametrize("which", range(len(cc.SHIM_SOURCES)))
def test_shim_digest_tracks_each_source(monkeypatch, tmp_path, which):
    before = cc.shim_digest()
    sources = list(cc.SHIM_SOURCES)
    edited = tmp_path / sources[which].name
    edited.write_text(sources[which].read_text() + "\n/* edit */\n")
    sources[which] = edited
    monkeypatch.setattr(cc, "SHIM_SOURCES", tuple(sources))
    assert cc.shim_digest() != before


# Two kernel libraries in one process: the second launches on the first's pool and reports
# its errors there (tiled.runtime.cpu wires this up as it loads kernels).
POOL_KERNEL = r"""
#include <pthread.h>
#include <stdint.h>
typedef struct { void* sync_handle; int32_t num_task; } Env;
__attribute__((weak)) void* __TVMBackendParallelLaunch = 0;
void TVMFFIErrorSetRaisedFromCStrParts(const char*, const char**, int32_t);
static pthread_t ran_on[8];
static int task(int t, Env* env, void* cdata) {
  (void)env, (void)cdata;
  ran_on[t] = pthread_self();
  if (t == 1 && cdata) {
    const char* parts[1] = {"worker failed"};
    TVMFFIErrorSetRaisedFromCStrParts("RuntimeError", parts, 1);
    return -1;
  }
  return 0;
}
int run(int fail) {
  return ((int (*)(void*, void*, int))__TVMBackendParallelLaunch)(task, fail ? &ran_on : 0, 2);
}
unsigned long worker(void) { return (unsigned long)ran_on[1]; }
"""


def test_libraries_share_the_first_ones_pool(tmp_path):
    import ctypes

    src = tmp_path / "k.c"
    src.write_text(POOL_KERNEL)
    obj = tmp_path / "k.o"
    subprocess.run(["cc", "-c", "-fPIC", str(src), "-o", str(obj)], check=True)
    libs = []
    for name in ("a", "b"):
        cc.link_cpu_library(obj, tmp_path / f"{name}.so")
        lib = ctypes.CDLL(str(tmp_path / f"{name}.so"), mode=ctypes.RTLD_LOCAL)
        lib.tiled_pool.restype = ctypes.c_void_p
        lib.tiled_use_pool.argtypes = [ctypes.c_void_p]
        lib.tiled_last_error.restype = ctypes.c_char_p
        lib.worker.restype = ctypes.c_ulong
        libs.append(lib)
    a, b = libs
    assert a.tiled_set_num_threads(2) == 2 and b.tiled_set_num_threads(1) == 1
    assert b.tiled_use_pool(a.tiled_pool()) == 0
    assert b.tiled_use_pool(b.tiled_pool()) == -1  # never its own
    assert b.tiled_get_num_threads() == 2  # the pool's, no longer b's own
    assert a.run(0) == 0 and b.run(0) == 0
    assert a.worker() == b.worker()  # one worker thread served both
    assert b.run(1) == -1 and b.tiled_last_error() == b"RuntimeError: worker failed"
    b.tiled_clear_error()
    assert a.tiled_last_error() == b""
