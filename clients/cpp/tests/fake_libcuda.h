// What tests/fake_libcuda.cc (a stand-in libcuda.so.1 for tests) records, and the functions
// a test looks up in it with dlsym to read the records back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fake_cuda {

struct Launch {
  std::string function;
  unsigned grid[3], block[3], smem;
  void* stream;
  std::vector<std::vector<unsigned char>> params;  // the first 128 bytes of each parameter
  unsigned cluster[3] = {1, 1, 1};
  bool ex = false;  // through cuLaunchKernelEx
  int programmatic = 0;  // its programmatic stream serialization attribute
};

struct TensorMapCall {
  int dtype;
  unsigned rank;
  void* address;
  std::vector<uint64_t> dims, strides;
  std::vector<uint32_t> box, element_strides;
  int interleave, swizzle, l2, oob;
};

using LaunchCount = size_t (*)();
using LaunchAt = const Launch* (*)(size_t);
using TensorMapCount = size_t (*)();
using TensorMapAt = const TensorMapCall* (*)(size_t);
using FuncAttributeCount = size_t (*)();
using FuncAttributeAt = void (*)(size_t, int* attribute, int* value);
using ContextDepth = size_t (*)();
using ModuleCount = size_t (*)();
using RequireCluster = void (*)(int, int, int);

}  // namespace fake_cuda
