// The cuda loader against tests/fake_libcuda.cc, a stand-in libcuda.so.1 that records the
// driver calls (run with LD_LIBRARY_PATH at its folder): for real sm_90a manifests the daemon
// wrote (testdata/sm90a), what the loader asks of the driver. This checks the calls, not what
// a GPU computes: clients/cpp/gpu_check.sh does that on a GPU. Run: tiled_cuda_fake_test [CASE...]
#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "check.h"
#include "fake_libcuda.h"
#include "tiled/loader.h"
#include "tiled/sha256.h"

using nlohmann::json;
using tiled::Arg;
using tiled::Tensor;

namespace {

void* fake() {
  std::string why;
  if (!tiled::CudaDevice::available(&why)) throw std::runtime_error("no driver: " + why);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib || !dlsym(lib, "fake_cuda_launch_count"))
    throw std::runtime_error("the libcuda.so.1 loaded is not the fake: run with "
                             "LD_LIBRARY_PATH=<build>/fake-driver");
  return lib;
}

template <typename T>
T fn(const char* name) {
  return reinterpret_cast<T>(dlsym(fake(), name));
}

size_t launches() { return fn<fake_cuda::LaunchCount>("fake_cuda_launch_count")(); }
const fake_cuda::Launch& launch(size_t i) { return *fn<fake_cuda::LaunchAt>("fake_cuda_launch")(i); }
const fake_cuda::Launch& last_launch() { return launch(launches() - 1); }
size_t tensor_maps() { return fn<fake_cuda::TensorMapCount>("fake_cuda_tensor_map_count")(); }
const fake_cuda::TensorMapCall& tensor_map(size_t i) {
  return *fn<fake_cuda::TensorMapAt>("fake_cuda_tensor_map")(i);
}
size_t modules() { return fn<fake_cuda::ModuleCount>("fake_cuda_module_count")(); }
size_t context_depth() { return fn<fake_cuda::ContextDepth>("fake_cuda_context_depth")(); }
std::vector<std::pair<int, int>> func_attributes() {
  std::vector<std::pair<int, int>> out;
  size_t n = fn<fake_cuda::FuncAttributeCount>("fake_cuda_func_attribute_count")();
  for (size_t i = 0; i < n; ++i) {
    int a, v;
    fn<fake_cuda::FuncAttributeAt>("fake_cuda_func_attribute")(i, &a, &v);
    out.emplace_back(a, v);
  }
  return out;
}

json manifest(const std::string& name) {
  std::ifstream in(std::string(TILED_TESTDATA_DIR) + "/sm90a/" + name + ".manifest.json");
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

// A kernel from the manifest over a stand-in "cubin": text naming the kernels it holds.
std::unique_ptr<tiled::Kernel> load(json m, const std::string& cubin) {
  m["artifact_sha256"] = tiled::sha256_hex(cubin);
  return tiled::load(cubin, tiled::Manifest::parse(m.dump()));
}

template <typename T>
T slot(const fake_cuda::Launch& l, size_t i) {
  T v;
  std::memcpy(&v, l.params.at(i).data(), sizeof v);
  return v;
}

uint64_t address(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

// The gemm manifest's three 4096 x 4096 float16 tensors, all over one allocation `a`.
std::vector<Arg> gemm_args(void* a) {
  const int64_t n = 4096;
  return {Tensor{a, {n, n}, "float16"}, Tensor{a, {n, n}, "float16"},
          Tensor{a, {n, n}, "float16"}};
}

}  // namespace

TEST(vadd_launches_with_the_manifests_geometry_and_parameters) {
  tiled::CudaDevice device;
  auto kernel = load(manifest("vadd"), "fake cubin: vadd_kernel");
  const int64_t n = 100003;
  void* a = device.alloc(n * 4);
  void* b = device.alloc(n * 4);
  void* c = device.alloc(n * 4);
  size_t before = launches(), depth = context_depth();
  tiled::LaunchOptions on;
  on.stream = reinterpret_cast<void*>(0x5eed);
  kernel->launch({Tensor{a, {n}, "float32"}, Tensor{b, {n}, "float32"}, Tensor{c, {n}, "float32"}},
                 on);
  CHECK_EQ(launches(), before + 1);
  const fake_cuda::Launch& l = last_launch();
  CHECK_EQ(l.function, std::string("vadd_kernel"));
  CHECK_EQ(l.grid[0], 98u);  // ceildiv(100003, 1024)
  CHECK_EQ(l.grid[1] * l.grid[2], 1u);
  CHECK_EQ(l.block[0], 256u);
  CHECK_EQ(l.smem, 0u);
  CHECK(l.stream == on.stream);
  CHECK(!l.ex);
  CHECK_EQ(l.params.size(), 4u);
  CHECK_EQ(slot<uint64_t>(l, 0), address(a));
  CHECK_EQ(slot<uint64_t>(l, 1), address(b));
  CHECK_EQ(slot<uint64_t>(l, 2), address(c));
  CHECK_EQ(slot<int32_t>(l, 3), 100003);
  CHECK_EQ(context_depth(), depth);  // the device's context was current: nothing pushed
  size_t loaded = modules();
  kernel->launch({Tensor{a, {5}, "float32"}, Tensor{b, {5}, "float32"}, Tensor{c, {5}, "float32"}});
  CHECK_EQ(modules(), loaded);  // loaded once per device
  CHECK_EQ(last_launch().grid[0], 1u);
  CHECK_EQ(slot<int32_t>(last_launch(), 3), 5);
  size_t count = launches();
  kernel->launch({Tensor{a, {0}, "float32"}, Tensor{b, {0}, "float32"}, Tensor{c, {0}, "float32"}});
  CHECK_EQ(launches(), count);  // a zero grid launches nothing
  std::vector<float> host(8);
  CHECK_THROWS(kernel->launch({Tensor{host.data(), {8}, "float32"}, Tensor{b, {8}, "float32"},
                               Tensor{c, {8}, "float32"}}),
               "LAUNCH_ERROR", "not CUDA device memory");
  device.free(a), device.free(b), device.free(c);
}

TEST(launch_without_a_current_context_pushes_the_primary_one_and_pops_it) {
  auto kernel = load(manifest("vadd"), "fake cubin: vadd_kernel");
  void* a;
  {
    tiled::CudaDevice device;  // pushes while it lives
    a = device.alloc(64);
  }
  CHECK_EQ(context_depth(), 0u);
  tiled::LaunchOptions on;
  on.device = 0;
  kernel->launch({Tensor{a, {4}, "float32"}, Tensor{a, {4}, "float32"}, Tensor{a, {4}, "float32"}},
                 on);
  CHECK_EQ(context_depth(), 0u);
  CHECK_EQ(last_launch().grid[0], 1u);
}

TEST(gemm_opts_into_shared_memory_and_encodes_its_tma_descriptors) {
  tiled::CudaDevice device;
  auto kernel = load(manifest("gemm"), "fake cubin: gemm_kernel");
  const int64_t n = 4096;
  void* a = device.alloc(n * n * 2);
  void* b = device.alloc(n * n * 2);
  void* c = device.alloc(n * n * 2);
  size_t maps = tensor_maps(), attributes = func_attributes().size();
  for (int repeat = 0; repeat < 2; ++repeat)
    kernel->launch({Tensor{a, {n, n}, "float16"}, Tensor{b, {n, n}, "float16"},
                    Tensor{c, {n, n}, "float16"}});
  const fake_cuda::Launch& l = last_launch();
  CHECK_EQ(l.function, std::string("gemm_kernel"));
  CHECK_EQ(l.grid[0], 132u);  // min(32 * 32 tiles, the fake's 132 SMs): a persistent grid
  CHECK_EQ(l.block[0], 256u);
  CHECK_EQ(l.smem, 132224u);
  auto attrs = func_attributes();
  CHECK_EQ(attrs.size(), attributes + 1);  // once, when the module loads
  CHECK((attrs.back() == std::pair<int, int>{8, 132224}));  // MAX_DYNAMIC_SHARED_SIZE_BYTES
  CHECK_EQ(l.params.size(), 3u);
  CHECK_EQ(slot<uint64_t>(l, 0), address(c));
  CHECK_EQ(tensor_maps(), maps + 4);  // two descriptors per launch
  const fake_cuda::TensorMapCall& ta = tensor_map(maps + 2);
  const fake_cuda::TensorMapCall& tb = tensor_map(maps + 3);
  CHECK(ta.address == a && tb.address == b);
  CHECK_EQ(ta.dtype, 6);  // FLOAT16
  CHECK_EQ(ta.rank, 2u);
  CHECK((ta.dims == std::vector<uint64_t>{4096, 4096}));
  CHECK((ta.strides == std::vector<uint64_t>{8192}));
  CHECK((ta.box == std::vector<uint32_t>{64, 128}));
  CHECK((tb.box == std::vector<uint32_t>{64, 64}));
  CHECK((ta.element_strides == std::vector<uint32_t>{1, 1}));
  CHECK_EQ(ta.swizzle, 3);  // 128B
  CHECK_EQ(ta.l2, 3);       // 256B promotion
  CHECK_EQ(ta.interleave + ta.oob, 0);
  // each descriptor's 128 bytes travel by value in its parameter slot
  for (size_t i = 1; i <= 2; ++i) {
    unsigned char mark = l.params[i][0];
    CHECK(mark >= 0xc1);
    for (unsigned char byte : l.params[i]) CHECK_EQ(int(byte), int(mark));
  }
  CHECK(l.params[1][0] != l.params[2][0]);
  device.free(a), device.free(b), device.free(c);
}

TEST(cluster_dims_launch_through_cuLaunchKernelEx_unless_the_cubin_fixes_them) {
  tiled::CudaDevice device;
  json m = manifest("gemm");
  m["cluster"] = {2, 1, 1};
  void* a = device.alloc(4096 * 4096 * 2);
  std::vector<Arg> args = gemm_args(a);
  load(m, "fake cubin: gemm_kernel")->launch(args);
  CHECK(last_launch().ex);
  CHECK_EQ(last_launch().cluster[0], 2u);
  CHECK_EQ(last_launch().cluster[1] * last_launch().cluster[2], 1u);
  CHECK_EQ(last_launch().grid[0], 132u);
  fn<fake_cuda::RequireCluster>("fake_cuda_require_cluster")(2, 1, 1);
  load(m, "fake cubin: gemm_kernel")->launch(args);
  CHECK(!last_launch().ex);  // fixed in the cubin: a plain launch
  fn<fake_cuda::RequireCluster>("fake_cuda_require_cluster")(4, 1, 1);
  CHECK_THROWS(load(m, "fake cubin: gemm_kernel")->launch(args), "LAUNCH_ERROR",
               "the cubin fixes cluster dims (4, 1, 1)");
  fn<fake_cuda::RequireCluster>("fake_cuda_require_cluster")(0, 0, 0);
  device.free(a);
}

TEST(a_kernel_holding_pdl_sync_launches_programmatically) {
  tiled::CudaDevice device;
  json m = manifest("gemm");
  m["pdl"] = true;
  void* a = device.alloc(4096 * 4096 * 2);
  std::vector<Arg> args = gemm_args(a);
  load(m, "fake cubin: gemm_kernel")->launch(args);
  CHECK(last_launch().ex);
  CHECK_EQ(last_launch().programmatic, 1);
  CHECK_EQ(last_launch().cluster[0], 1u);
  m["cluster"] = {2, 1, 1};  // both attributes
  load(m, "fake cubin: gemm_kernel")->launch(args);
  CHECK(last_launch().ex && last_launch().programmatic == 1 && last_launch().cluster[0] == 2u);
  m["pdl"] = 1;
  CHECK_THROWS(load(m, "fake cubin: gemm_kernel"), "MANIFEST_ERROR",
               "pdl: expected true or false");
  device.free(a);
}

TEST(a_failed_precondition_runs_the_fallback_or_is_refused) {
  tiled::CudaDevice device;
  json m = manifest("vadd");
  m["requires"] = {{"floormod", "N", 2}};
  json fallback = {{"symbol", "vadd_fallback"}, {"kernel_args", m["kernel_args"]},
                   {"grid", {{"ceildiv", "N", 256}, 1, 1}}, {"block", {256, 1, 1}},
                   {"dynamic_smem_bytes", 0}, {"cluster", {1, 1, 1}}};
  void* a = device.alloc(4096);
  auto args = [&](int64_t n) {
    return std::vector<Arg>{Tensor{a, {n}, "float32"}, Tensor{a, {n}, "float32"},
                            Tensor{a, {n}, "float32"}};
  };
  CHECK_THROWS(load(m, "fake cubin: vadd_kernel")->launch(args(11)), "LAUNCH_ERROR",
               "fail the kernel's launch precondition(s) [[\"floormod\", \"N\", 2]]");
  m["fallback"] = fallback;
  auto kernel = load(m, "fake cubin: vadd_kernel vadd_fallback");
  kernel->launch(args(10));
  CHECK_EQ(last_launch().function, std::string("vadd_kernel"));
  kernel->launch(args(513));
  CHECK_EQ(last_launch().function, std::string("vadd_fallback"));
  CHECK_EQ(last_launch().grid[0], 3u);
  device.free(a);
}

TEST(a_cubin_without_the_manifests_kernel_is_refused) {
  tiled::CudaDevice device;
  void* a = device.alloc(64);
  CHECK_THROWS(load(manifest("vadd"), "fake cubin: other_kernel")
                   ->launch({Tensor{a, {4}, "float32"}, Tensor{a, {4}, "float32"},
                             Tensor{a, {4}, "float32"}}),
               "LAUNCH_ERROR", "cubin has no kernel 'vadd_kernel': cuModuleGetFunction failed: "
                               "CUDA_ERROR_NOT_FOUND");
  device.free(a);
}

int main(int argc, char** argv) { return check::run_tests(argc, argv); }
