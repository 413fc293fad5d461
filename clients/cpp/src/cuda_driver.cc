// libcuda.so.1, opened with dlopen on first use; and CudaDevice over it.
#include <dlfcn.h>

#include <mutex>

#include "cuda_api.h"
#include "tiled/loader.h"

namespace tiled {
namespace cuda {
namespace {

std::string load_error;  // set once, under the call_once below

const Driver* open_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    load_error = std::string("no CUDA driver: dlopen(libcuda.so.1) failed: ") + (why ? why : "?");
    return nullptr;
  }
  static Driver d{};
  bool ok = true;
  auto bind = [&](auto& fn, const char* name, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && required) {
      load_error += std::string(load_error.empty() ? "" : "; ") + "libcuda.so.1 has no " + name;
      ok = false;
    }
  };
  bind(d.cuInit, "cuInit", true);
  bind(d.cuGetErrorName, "cuGetErrorName", true);
  bind(d.cuGetErrorString, "cuGetErrorString", true);
  bind(d.cuDeviceGet, "cuDeviceGet", true);
  bind(d.cuDeviceGetCount, "cuDeviceGetCount", true);
  bind(d.cuDeviceGetName, "cuDeviceGetName", true);
  bind(d.cuDeviceGetAttribute, "cuDeviceGetAttribute", true);
  bind(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", true);
  bind(d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", true);
  bind(d.cuCtxGetCurrent, "cuCtxGetCurrent", true);
  bind(d.cuCtxGetDevice, "cuCtxGetDevice", true);
  bind(d.cuCtxPushCurrent, "cuCtxPushCurrent_v2", true);
  bind(d.cuCtxPopCurrent, "cuCtxPopCurrent_v2", true);
  bind(d.cuCtxSynchronize, "cuCtxSynchronize", true);
  bind(d.cuModuleLoadData, "cuModuleLoadData", true);
  bind(d.cuModuleGetFunction, "cuModuleGetFunction", true);
  bind(d.cuFuncSetAttribute, "cuFuncSetAttribute", true);
  bind(d.cuFuncGetAttribute, "cuFuncGetAttribute", true);
  bind(d.cuLaunchKernel, "cuLaunchKernel", true);
  bind(d.cuMemAlloc, "cuMemAlloc_v2", true);
  bind(d.cuMemFree, "cuMemFree_v2", true);
  bind(d.cuMemcpyHtoD, "cuMemcpyHtoD_v2", true);
  bind(d.cuMemcpyDtoH, "cuMemcpyDtoH_v2", true);
  bind(d.cuMemsetD8, "cuMemsetD8_v2", true);
  bind(d.cuPointerGetAttribute, "cuPointerGetAttribute", true);
  bind(d.cuLaunchKernelEx, "cuLaunchKernelEx", false);
  bind(d.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled", false);
  if (!ok) return nullptr;
  CUresult rc = d.cuInit(0);
  if (rc != 0) {
    const char* name = nullptr;
    d.cuGetErrorName(rc, &name);
    load_error = std::string("cuInit failed: no usable CUDA device (") + (name ? name : "?") + ")";
    return nullptr;
  }
  return &d;
}

const Driver* try_driver() {
  static std::once_flag once;
  static const Driver* d = nullptr;
  std::call_once(once, [] { d = open_driver(); });
  return d;
}

}  // namespace

void Driver::check(CUresult rc, const char* call) const {
  if (rc == 0) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(rc, &name) != 0) name = nullptr;
  if (cuGetErrorString(rc, &text) != 0) text = nullptr;
  std::string what = name ? name : "CUresult " + std::to_string(rc);
  if (text) what += std::string(" (") + text + ")";
  throw LaunchError(std::string(call) + " failed: " + what);
}

const Driver& driver() {
  const Driver* d = try_driver();
  if (!d) throw LaunchError(load_error);
  return *d;
}

ScopedContext::ScopedContext(const Driver& d, CUcontext ctx) : d_(d) {
  CUcontext current = nullptr;
  if (d.cuCtxGetCurrent(&current) == 0 && current == ctx) return;
  d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  pushed_ = true;
}

ScopedContext::~ScopedContext() {
  CUcontext popped = nullptr;
  if (pushed_) d_.cuCtxPopCurrent(&popped);
}

}  // namespace cuda

using cuda::driver;

bool CudaDevice::available(std::string* why) {
  try {
    driver();
    return true;
  } catch (const LaunchError& e) {
    if (why) *why = e.message();
    return false;
  }
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal), ctx_(nullptr) {
  const auto& d = driver();
  cuda::CUdevice dev = 0;
  d.check(d.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  ordinal_ = dev;  // the handle: what every later call takes
  cuda::CUcontext ctx = nullptr;
  d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  ctx_ = ctx;
}

CudaDevice::~CudaDevice() {
  const auto& d = driver();
  cuda::CUcontext popped = nullptr;
  d.cuCtxPopCurrent(&popped);
  d.cuDevicePrimaryCtxRelease(ordinal_);
}

void* CudaDevice::alloc(size_t bytes) {
  const auto& d = driver();
  cuda::CUdeviceptr p = 0;
  d.check(d.cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
  return reinterpret_cast<void*>(p);
}

void CudaDevice::free(void* ptr) {
  if (ptr) driver().cuMemFree(reinterpret_cast<cuda::CUdeviceptr>(ptr));
}

void CudaDevice::upload(void* device_ptr, const void* host, size_t bytes) {
  const auto& d = driver();
  if (bytes)
    d.check(d.cuMemcpyHtoD(reinterpret_cast<cuda::CUdeviceptr>(device_ptr), host, bytes),
            "cuMemcpyHtoD");
}

void CudaDevice::download(void* host, const void* device_ptr, size_t bytes) {
  const auto& d = driver();
  if (bytes)
    d.check(d.cuMemcpyDtoH(host, reinterpret_cast<cuda::CUdeviceptr>(device_ptr), bytes),
            "cuMemcpyDtoH");
}

void CudaDevice::synchronize() {
  const auto& d = driver();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize");
}

std::string CudaDevice::name() const {
  const auto& d = driver();
  char buf[256] = {0};
  d.check(d.cuDeviceGetName(buf, sizeof buf, ordinal_), "cuDeviceGetName");
  return buf;
}

int CudaDevice::multiprocessors() const {
  const auto& d = driver();
  int n = 0;
  d.check(d.cuDeviceGetAttribute(&n, cuda::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal_),
          "cuDeviceGetAttribute");
  return n;
}

std::pair<int, int> CudaDevice::compute_capability() const {
  const auto& d = driver();
  int major = 0, minor = 0;
  d.check(d.cuDeviceGetAttribute(&major, cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                 ordinal_), "cuDeviceGetAttribute");
  d.check(d.cuDeviceGetAttribute(&minor, cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                 ordinal_), "cuDeviceGetAttribute");
  return {major, minor};
}

}  // namespace tiled
