// The slice of the CUDA driver API the loader calls, declared here (values and layouts as in
// cuda.h of CUDA 12 / 13) and resolved from libcuda.so.1 with dlsym at run time: the build
// needs no CUDA headers or libraries, and a host without a driver still loads cpu kernels.
// tests/cuda_abi_check.cc compares every declaration with cuda.h where a toolkit is installed.
#pragma once

#include <cstdint>
#include <string>

namespace tiled {
namespace cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

enum : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11,
  CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT = 12,
  CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH = 13,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
  // CUtensorMapDataType
  CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
  CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1,
  CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2,
  CU_TENSOR_MAP_DATA_TYPE_INT32 = 3,
  CU_TENSOR_MAP_DATA_TYPE_UINT64 = 4,
  CU_TENSOR_MAP_DATA_TYPE_INT64 = 5,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT64 = 8,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
  CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B = 1,
  CU_TENSOR_MAP_SWIZZLE_64B = 2,
  CU_TENSOR_MAP_SWIZZLE_128B = 3,
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
};

struct alignas(64) CUtensorMap {
  uint64_t opaque[16];  // 128 bytes (cuda.h aligns it to 128; the driver needs 64)
};

union CUlaunchAttributeValue {
  char pad[64];
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};

struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  CUlaunchAttributeValue value;
};

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

// Function pointers into libcuda.so.1; the optional ones (newer drivers) may be null.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);  // _v2
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuCtxPushCurrent)(CUcontext);   // _v2
  CUresult (*cuCtxPopCurrent)(CUcontext*);   // _v2
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);                   // _v2
  CUresult (*cuMemFree)(CUdeviceptr);                             // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);     // _v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);           // _v2
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);     // _v2
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  // optional
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, int, uint32_t, void*, const uint64_t*,
                                     const uint64_t*, const uint32_t*, const uint32_t*, int,
                                     int, int, int);

  // Raises LaunchError "CALL failed: CUDA_ERROR_X (description)" unless rc is 0.
  void check(CUresult rc, const char* call) const;
};

// The driver, loaded and initialised (cuInit) once; LaunchError when there is none.
const Driver& driver();

// Makes `ctx` current on this thread for the scope, unless it already is.
class ScopedContext {
 public:
  ScopedContext(const Driver& d, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& d_;
  bool pushed_ = false;
};

}  // namespace cuda
}  // namespace tiled
