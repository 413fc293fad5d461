// A stand-in for libcuda.so.1, for tests only: it implements the driver calls the loader makes
// on host memory and records them, so tests/cuda_fake_test.cc can check what the loader asks
// the driver to do (module, function, attributes, grid, block, shared memory, stream, every
// kernel parameter's bytes, TMA descriptor requests, cluster launches) on a machine without a
// GPU. Nothing here runs a kernel: it says nothing about what a real GPU computes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_libcuda.h"

namespace {

enum : int { kSuccess = 0, kInvalidValue = 1, kInvalidContext = 201, kNotFound = 500 };

using fake_cuda::Launch;
using fake_cuda::TensorMapCall;

std::mutex mu;
std::set<char*> allocations;
std::map<void*, std::string> functions;          // handle -> name
std::vector<std::string> images;                 // module images
std::vector<Launch> launches;
std::vector<TensorMapCall> tensor_maps;
std::vector<std::pair<int, int>> func_attributes;  // (attribute, value) set
thread_local std::vector<void*> context_stack;
int primary_context;                             // its address is the context handle
int required_cluster[3] = {0, 0, 0};

bool is_allocation(uint64_t p) {
  for (char* a : allocations)
    if (p >= uint64_t(uintptr_t(a)) && p < uint64_t(uintptr_t(a)) + (1 << 30)) return true;
  return false;
}

std::vector<std::vector<unsigned char>> copy_params(void** params) {
  std::vector<std::vector<unsigned char>> out;
  for (size_t i = 0; params && params[i]; ++i) {  // the loader ends its array with a null
    auto* p = static_cast<unsigned char*>(params[i]);
    out.emplace_back(p, p + 128);
  }
  return out;
}

}  // namespace

extern "C" {

int cuInit(unsigned) { return kSuccess; }
int cuGetErrorName(int rc, const char** name) {
  *name = rc == kNotFound ? "CUDA_ERROR_NOT_FOUND" : rc == kInvalidValue ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_UNKNOWN";
  return kSuccess;
}
int cuGetErrorString(int, const char** text) {
  *text = "fake driver";
  return kSuccess;
}
int cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return kInvalidValue;
  *dev = 0;
  return kSuccess;
}
int cuDeviceGetCount(int* n) { *n = 1; return kSuccess; }
int cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, "fake CUDA device", size_t(len));
  return kSuccess;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
  *value = attribute == 16 ? 132 : attribute == 75 ? 9 : 0;  // SMs; compute capability 9.0
  return kSuccess;
}
int cuDevicePrimaryCtxRetain(void** ctx, int) { *ctx = &primary_context; return kSuccess; }
int cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }
int cuCtxGetCurrent(void** ctx) {
  *ctx = context_stack.empty() ? nullptr : context_stack.back();
  return kSuccess;
}
int cuCtxGetDevice(int* dev) {
  if (context_stack.empty()) return kInvalidContext;
  *dev = 0;
  return kSuccess;
}
int cuCtxPushCurrent_v2(void* ctx) { context_stack.push_back(ctx); return kSuccess; }
int cuCtxPopCurrent_v2(void** ctx) {
  if (context_stack.empty()) return kInvalidContext;
  if (ctx) *ctx = context_stack.back();
  context_stack.pop_back();
  return kSuccess;
}
int cuCtxSynchronize() { return context_stack.empty() ? kInvalidContext : kSuccess; }
int cuModuleLoadData(void** module, const void* image) {
  if (context_stack.empty()) return kInvalidContext;
  std::lock_guard<std::mutex> lock(mu);
  const char* bytes = static_cast<const char*>(image);
  if (std::memcmp(bytes, "\x7f" "ELF", 4) == 0) {  // a real cubin (64-bit ELF): its size
    uint64_t shoff;                                 // ends with the section headers
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, bytes + 0x28, 8);
    std::memcpy(&shentsize, bytes + 0x3a, 2);
    std::memcpy(&shnum, bytes + 0x3c, 2);
    images.emplace_back(bytes, shoff + uint64_t(shentsize) * shnum);
  } else {
    images.emplace_back(bytes);  // the tests' stand-in images are text
  }
  *module = reinterpret_cast<void*>(images.size());
  return kSuccess;
}
int cuModuleGetFunction(void** function, void* module, const char* name) {
  std::lock_guard<std::mutex> lock(mu);
  const std::string& image = images.at(size_t(reinterpret_cast<uintptr_t>(module)) - 1);
  if (image.find(name) == std::string::npos) return kNotFound;
  void* handle = new char(0);
  functions[handle] = name;
  *function = handle;
  return kSuccess;
}
int cuFuncSetAttribute(void*, int attribute, int value) {
  std::lock_guard<std::mutex> lock(mu);
  func_attributes.emplace_back(attribute, value);
  return kSuccess;
}
int cuFuncGetAttribute(int* value, int attribute, void*) {
  *value = attribute >= 11 && attribute <= 13 ? required_cluster[attribute - 11] : 0;
  return kSuccess;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void* stream, void** params, void** extra) {
  if (context_stack.empty() || extra) return kInvalidContext;
  std::lock_guard<std::mutex> lock(mu);
  Launch l{functions.at(f), {gx, gy, gz}, {bx, by, bz}, smem, stream, copy_params(params)};
  launches.push_back(l);
  return kSuccess;
}
struct LaunchConfig {
  unsigned grid[3], block[3], smem;
  void* stream;
  struct Attribute {
    int id;
    char pad[4];
    union {
      char bytes[64];
      unsigned cluster[3];
      int programmatic;
    } value;
  } * attrs;
  unsigned num_attrs;
};
int cuLaunchKernelEx(const LaunchConfig* c, void* f, void** params, void**) {
  if (context_stack.empty()) return kInvalidContext;
  std::lock_guard<std::mutex> lock(mu);
  Launch l{functions.at(f), {c->grid[0], c->grid[1], c->grid[2]},
           {c->block[0], c->block[1], c->block[2]}, c->smem, c->stream, copy_params(params)};
  l.ex = true;
  for (unsigned i = 0; i < c->num_attrs; ++i)
    if (c->attrs[i].id == 4)
      std::memcpy(l.cluster, c->attrs[i].value.cluster, sizeof l.cluster);
    else if (c->attrs[i].id == 6)
      l.programmatic = c->attrs[i].value.programmatic;
  launches.push_back(l);
  return kSuccess;
}
int cuMemAlloc_v2(uint64_t* p, size_t bytes) {
  if (context_stack.empty()) return kInvalidContext;
  char* mem = static_cast<char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
  std::lock_guard<std::mutex> lock(mu);
  allocations.insert(mem);
  *p = uint64_t(uintptr_t(mem));
  return kSuccess;
}
int cuMemFree_v2(uint64_t p) {
  std::lock_guard<std::mutex> lock(mu);
  char* mem = reinterpret_cast<char*>(uintptr_t(p));
  if (!allocations.erase(mem)) return kInvalidValue;
  std::free(mem);
  return kSuccess;
}
int cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
  std::memcpy(reinterpret_cast<void*>(uintptr_t(dst)), src, n);
  return kSuccess;
}
int cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
  std::memcpy(dst, reinterpret_cast<void*>(uintptr_t(src)), n);
  return kSuccess;
}
int cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) {
  std::memset(reinterpret_cast<void*>(uintptr_t(dst)), v, n);
  return kSuccess;
}
int cuPointerGetAttribute(void* value, int attribute, uint64_t p) {
  std::lock_guard<std::mutex> lock(mu);
  if (attribute != 9 || !is_allocation(p)) return kInvalidValue;
  *static_cast<int*>(value) = 0;
  return kSuccess;
}
int cuTensorMapEncodeTiled(void* map, int dtype, unsigned rank, void* address,
                           const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                           const uint32_t* element_strides, int interleave, int swizzle, int l2,
                           int oob) {
  std::lock_guard<std::mutex> lock(mu);
  TensorMapCall c{dtype, rank, address, {dims, dims + rank}, {strides, strides + rank - 1},
                  {box, box + rank}, {element_strides, element_strides + rank}, interleave,
                  swizzle, l2, oob};
  tensor_maps.push_back(c);
  std::memset(map, int(0xc0 + tensor_maps.size()), 128);  // a mark per descriptor
  return kSuccess;
}

// --- what the tests read back -------------------------------------------------------------

size_t fake_cuda_launch_count() { return launches.size(); }
const Launch* fake_cuda_launch(size_t i) { return &launches.at(i); }
size_t fake_cuda_tensor_map_count() { return tensor_maps.size(); }
const TensorMapCall* fake_cuda_tensor_map(size_t i) { return &tensor_maps.at(i); }
size_t fake_cuda_func_attribute_count() { return func_attributes.size(); }
void fake_cuda_func_attribute(size_t i, int* attribute, int* value) {
  *attribute = func_attributes.at(i).first;
  *value = func_attributes.at(i).second;
}
size_t fake_cuda_context_depth() { return context_stack.size(); }
size_t fake_cuda_module_count() { return images.size(); }
void fake_cuda_require_cluster(int x, int y, int z) {
  required_cluster[0] = x, required_cluster[1] = y, required_cluster[2] = z;
}

}  // extern "C"
