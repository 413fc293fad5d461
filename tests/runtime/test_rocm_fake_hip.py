"""tiled.runtime.rocm's calls into the HIP runtime, against a stand-in libamdhip64 built here
(the functions it calls, with HIP 5.2's signatures from hip_runtime_api.h, recording what they
receive). No AMD GPU is involved: this checks the ctypes side of a launch — the code object
handed to hipModuleLoadData, the symbol, grid / block / stream and the argument buffer passed
through `extra` (HIP_LAUNCH_PARAM_BUFFER_POINTER / SIZE / END), the device switched to the
tensors' and back, a device of another arch refused."""

import ctypes
import shutil
import subprocess

import pytest

import tiled.lang as T
from tiled.compiler import compile_program
from tiled.errors import LaunchError
from tiled.runtime import rocm
from tiled.runtime.args import bind_args

FAKE_HIP = r"""
#include <stdlib.h>
#include <string.h>
typedef int hipError_t;
static int cur = 0, launches = 0, loads = 0;
static unsigned char image_head[64];
static char symbol[256];
static unsigned geometry[7];
static void* stream_seen;
static unsigned char kernarg[4096];
static size_t kernarg_size;
static int device_at_launch = -1;

hipError_t hipGetDeviceCount(int* n) { *n = 2; return 0; }
hipError_t hipGetDevice(int* d) { *d = cur; return 0; }
hipError_t hipSetDevice(int d) { if (d < 0 || d > 1) return 101; cur = d; return 0; }
hipError_t hipGetDevicePropertiesR0600(void* prop, int d) {
  memset(prop, 0, 1472);
  strcpy((char*)prop + 396, d == 0 ? "gfx942:sramecc+:xnack-" : "gfx90a:sramecc+:xnack-");
  return 0;
}
hipError_t hipModuleLoadData(void** module, const void* image) {
  memcpy(image_head, image, 64);
  loads++;
  *module = (void*)0x1234;
  return 0;
}
hipError_t hipModuleGetFunction(void** f, void* module, const char* name) {
  if (module != (void*)0x1234) return 400;
  strncpy(symbol, name, 255);
  *f = (void*)0x5678;
  return 0;
}
hipError_t hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, void* stream,
                                 void** params, void** extra) {
  if (f != (void*)0x5678 || params != 0 || extra == 0) return 1;
  if (extra[0] != (void*)1 || extra[2] != (void*)2 || extra[4] != (void*)3) return 1;
  kernarg_size = *(size_t*)extra[3];
  memcpy(kernarg, extra[1], kernarg_size);
  unsigned g[7] = {gx, gy, gz, bx, by, bz, shared};
  memcpy(geometry, g, sizeof g);
  stream_seen = stream;
  device_at_launch = cur;
  launches++;
  return 0;
}
hipError_t hipMalloc(void** p, size_t n) { *p = calloc(1, n); return 0; }
hipError_t hipMemset(void* p, int v, size_t n) { memset(p, v, n); return 0; }
const char* hipGetErrorName(hipError_t e) {
  return e == 101 ? "hipErrorInvalidDevice" : "hipErrorUnknown";
}
int fake_launches(void) { return launches; }
int fake_loads(void) { return loads; }
const unsigned char* fake_image_head(void) { return image_head; }
const char* fake_symbol(void) { return symbol; }
const unsigned* fake_geometry(void) { return geometry; }
void* fake_stream(void) { return stream_seen; }
const unsigned char* fake_kernarg(size_t* n) { *n = kernarg_size; return kernarg; }
int fake_device_at_launch(void) { return device_at_launch; }
"""


@pytest.fixture
def fake_hip(tmp_path, monkeypatch):
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler to build the stand-in HIP runtime")
    src, so = tmp_path / "fake_hip.c", tmp_path / "libfakehip.so"
    src.write_text(FAKE_HIP)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(so)], check=True)
    monkeypatch.setattr(rocm, "HIP_LIBRARIES", (str(so),))
    monkeypatch.setattr(rocm, "_hip", None)
    lib = ctypes.CDLL(str(so))
    for name in ("fake_image_head", "fake_symbol", "fake_geometry", "fake_kernarg"):
        getattr(lib, name).restype = ctypes.c_void_p
    lib.fake_stream.restype = ctypes.c_void_p
    yield lib
    monkeypatch.setattr(rocm, "_hip", None)


@pytest.fixture(scope="module")
def scaled():
    @T.prim_func
    def axpb(X: T.Tensor((T.dyn("N"),), "float16"), Y: T.Tensor((T.dyn("N"),), "float16"),
             a: T.float16, b: T.float32):
        with T.Kernel(T.ceildiv(T.dyn("N"), 256), threads=256) as bx:
            for i in T.Parallel(256):
                if bx * 256 + i < X.shape[0]:
                    Y[bx * 256 + i] = X[bx * 256 + i] * a + b

    return compile_program(axpb, "rocm:gfx942")


class FakeTensor:
    def __init__(self, n: int, ptr: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f2", "data": (ptr, False),
                                         "version": 3, "strides": None}


def test_a_launch_hands_hip_the_code_object_geometry_stream_and_arguments(fake_hip, scaled):
    k = rocm.ROCmKernel(scaled.artifact, scaled.manifest)
    args = (FakeTensor(1000, 0x7F0000001000), FakeTensor(1000, 0x7F0000002000), 2.5, -1.25)
    k(*args, stream=0xABC0)
    assert fake_hip.fake_launches() == 1 and fake_hip.fake_loads() == 1
    assert ctypes.string_at(fake_hip.fake_image_head(), 64) == scaled.artifact[:64]
    assert ctypes.string_at(fake_hip.fake_symbol()) == scaled.manifest.symbol.encode()
    geometry = (ctypes.c_uint * 7).from_address(fake_hip.fake_geometry())
    assert list(geometry) == [4, 1, 1, 256, 1, 1, 0]  # ceil(1000 / 256) blocks, no dynamic LDS
    assert fake_hip.fake_stream() == 0xABC0
    n = ctypes.c_size_t()
    fake_hip.fake_kernarg.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    buf = ctypes.string_at(fake_hip.fake_kernarg(ctypes.byref(n)), n.value)
    want = rocm.KernargPlan(scaled.manifest).pack(bind_args(scaled.manifest.params, args,
                                                            "cuda"))
    assert buf == bytes(want) and n.value == scaled.manifest.code_object["kernarg_size"]
    k(*args, stream=0xABC0)
    assert fake_hip.fake_launches() == 2 and fake_hip.fake_loads() == 1  # loaded once


def test_another_devices_arch_is_refused_and_the_callers_device_kept(fake_hip, scaled):
    h = rocm.hip()
    h.call("hipSetDevice", 1)  # the caller's current device: a gfx90a
    k = rocm.ROCmKernel(scaled.artifact, scaled.manifest)
    with pytest.raises(LaunchError, match="compiled for gfx942, but device 1 is gfx90a"):
        k(FakeTensor(10, 0x1000), FakeTensor(10, 0x2000), 1.0, 0.0)
    assert h.current_device() == 1
    assert rocm.local_arch() == "gfx942"  # device 0's
    with pytest.raises(LaunchError, match="hipSetDevice failed: hipErrorInvalidDevice"):
        h.call("hipSetDevice", 7)
