// The pure half of the cuda launch (internal): a kernel's C parameters packed from checked
// arguments, and the TMA descriptor each tensor_map argument needs, with no driver call except
// through the encoder passed in. tests/loader_test.cc checks them without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tiled/loader.h"

namespace tiled {

// One cuTensorMapEncodeTiled call, every list innermost dim first. Interleave none, element
// strides of 1, L2 promotion 256B and zero out-of-bounds fill are implied.
struct TensorMapRequest {
  std::string dtype;               // manifest dtype of the elements
  void* address = nullptr;         // 16-byte aligned
  std::vector<uint64_t> dims;      // elements per dim
  std::vector<uint64_t> strides;   // bytes between steps of dims 1.., multiples of 16
  std::vector<uint32_t> box;       // elements per dim
  int swizzle = 0;                 // bytes: 0 | 32 | 64 | 128
};

// Checks the TMA rules that depend on the tensor (the manifest checked the box) and builds
// the request for kernel_args[i] over `t`; LaunchError naming the rule otherwise.
TensorMapRequest tensor_map_request(const Manifest& m, size_t i, const Tensor& t);

// 128 bytes of CUtensorMap for a request (the driver's cuTensorMapEncodeTiled in a launch).
using TensorMapEncoder = std::function<std::array<unsigned char, 128>(const TensorMapRequest&)>;

// One kernel parameter's storage, aligned for a CUtensorMap.
struct alignas(64) ParamSlot {
  unsigned char bytes[128];
};

// The value of every kernel_arg, in order: a tensor's pointer (8 bytes), a scalar in its dtype
// (float16 / bfloat16 as their bits), a dim in its int32 / int64 / uint32 / uint64 (LaunchError
// when it does not fit), a tensor_map's descriptor from `encode`.
std::vector<ParamSlot> pack_kernel_args(const Manifest& m, const BoundArgs& bound,
                                        const TensorMapEncoder& encode);

}  // namespace tiled
