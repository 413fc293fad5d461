// Compiled (never run) where cuda.h exists: the loader's own declarations of the driver API
// (src/cuda_api.h) must agree with the toolkit's, value for value and field for field.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "cuda_api.h"

namespace ours = tiled::cuda;

#define SAME_VALUE(name) static_assert(int(ours::name) == int(::name), #name)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
SAME_VALUE(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
SAME_VALUE(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH);
SAME_VALUE(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT);
SAME_VALUE(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH);
SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_UINT8);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_UINT16);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_UINT32);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_INT32);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_UINT64);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_INT64);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_FLOAT16);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_FLOAT64);
SAME_VALUE(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
SAME_VALUE(CU_TENSOR_MAP_INTERLEAVE_NONE);
SAME_VALUE(CU_TENSOR_MAP_SWIZZLE_NONE);
SAME_VALUE(CU_TENSOR_MAP_SWIZZLE_32B);
SAME_VALUE(CU_TENSOR_MAP_SWIZZLE_64B);
SAME_VALUE(CU_TENSOR_MAP_SWIZZLE_128B);
SAME_VALUE(CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
SAME_VALUE(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);

static_assert(sizeof(ours::CUdeviceptr) == sizeof(::CUdeviceptr), "CUdeviceptr");
static_assert(sizeof(ours::CUdevice) == sizeof(::CUdevice), "CUdevice");
static_assert(sizeof(ours::CUresult) == sizeof(::CUresult), "CUresult");
static_assert(sizeof(ours::CUtensorMap) == sizeof(::CUtensorMap), "CUtensorMap");
static_assert(sizeof(ours::CUlaunchAttributeValue) == sizeof(::CUlaunchAttributeValue), "value");
static_assert(sizeof(ours::CUlaunchAttribute) == sizeof(::CUlaunchAttribute), "attribute");
static_assert(offsetof(ours::CUlaunchAttribute, value) == offsetof(::CUlaunchAttribute, value),
              "attribute.value");
static_assert(offsetof(ours::CUlaunchAttributeValue, clusterDim) ==
                  offsetof(::CUlaunchAttributeValue, clusterDim), "clusterDim");
static_assert(sizeof(ours::CUlaunchConfig) == sizeof(::CUlaunchConfig), "CUlaunchConfig");
static_assert(offsetof(ours::CUlaunchConfig, hStream) == offsetof(::CUlaunchConfig, hStream),
              "hStream");
static_assert(offsetof(ours::CUlaunchConfig, attrs) == offsetof(::CUlaunchConfig, attrs), "attrs");
static_assert(offsetof(ours::CUlaunchConfig, numAttrs) == offsetof(::CUlaunchConfig, numAttrs),
              "numAttrs");

// Each function pointer has the toolkit function's type (the _v2 entry points where cuda.h
// maps a name to one).
// Parameter types are ours (opaque handles declared here), so compare arity and widths by
// calling through a cast: this only has to compile.
template <typename Ours, typename Theirs>
struct SameArity;
template <typename R1, typename... A1, typename R2, typename... A2>
struct SameArity<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool value =
      sizeof...(A1) == sizeof...(A2) && ((sizeof(A1) == sizeof(A2)) && ...);
};
#define SAME_SIGNATURE(field, fn)                                                         \
  static_assert(SameArity<decltype(ours::Driver::field), decltype(&fn)>::value, #field)
SAME_SIGNATURE(cuInit, cuInit);
SAME_SIGNATURE(cuGetErrorName, cuGetErrorName);
SAME_SIGNATURE(cuDeviceGet, cuDeviceGet);
SAME_SIGNATURE(cuDeviceGetName, cuDeviceGetName);
SAME_SIGNATURE(cuDeviceGetAttribute, cuDeviceGetAttribute);
SAME_SIGNATURE(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
SAME_SIGNATURE(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
SAME_SIGNATURE(cuCtxGetCurrent, cuCtxGetCurrent);
SAME_SIGNATURE(cuCtxPushCurrent, cuCtxPushCurrent_v2);
SAME_SIGNATURE(cuCtxPopCurrent, cuCtxPopCurrent_v2);
SAME_SIGNATURE(cuModuleLoadData, cuModuleLoadData);
SAME_SIGNATURE(cuModuleGetFunction, cuModuleGetFunction);
SAME_SIGNATURE(cuFuncSetAttribute, cuFuncSetAttribute);
SAME_SIGNATURE(cuFuncGetAttribute, cuFuncGetAttribute);
SAME_SIGNATURE(cuLaunchKernel, cuLaunchKernel);
SAME_SIGNATURE(cuLaunchKernelEx, cuLaunchKernelEx);
SAME_SIGNATURE(cuMemAlloc, cuMemAlloc_v2);
SAME_SIGNATURE(cuMemFree, cuMemFree_v2);
SAME_SIGNATURE(cuMemcpyHtoD, cuMemcpyHtoD_v2);
SAME_SIGNATURE(cuMemcpyDtoH, cuMemcpyDtoH_v2);
SAME_SIGNATURE(cuMemsetD8, cuMemsetD8_v2);
SAME_SIGNATURE(cuPointerGetAttribute, cuPointerGetAttribute);
SAME_SIGNATURE(cuTensorMapEncodeTiled, cuTensorMapEncodeTiled);
