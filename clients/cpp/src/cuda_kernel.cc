// The cuda backend: a cubin loaded with cuModuleLoadData into the primary context of the
// device the call's tensors live on, launched with cuLaunchKernel (cuLaunchKernelEx for cluster
// dims chosen at launch) with the manifest's grid, block and dynamic shared memory. The rules
// follow tiled/runtime/cuda.py: kernel parameter packing, TMA descriptors, preconditions with a
// fallback variant, the SM-count dim of persistent grids, empty tensors.
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_api.h"
#include "cuda_pack.h"
#include "kernels.h"

namespace tiled {
namespace {

using namespace cuda;  // NOLINT

constexpr int64_t kDefaultSmemLimit = 48 * 1024;  // beyond it a kernel must opt in
constexpr size_t kEmptyBytes = 256;

int tma_data_type(const std::string& dtype) {
  // TMA copies bits: integer, bool and float8 types travel as the unsigned type of their
  // width (as CUTLASS does); the signed / float names only matter for a NaN fill, unused.
  static const std::map<std::string, int> types = {
      {"float16", CU_TENSOR_MAP_DATA_TYPE_FLOAT16}, {"bfloat16", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16},
      {"float32", CU_TENSOR_MAP_DATA_TYPE_FLOAT32}, {"float64", CU_TENSOR_MAP_DATA_TYPE_FLOAT64},
      {"int32", CU_TENSOR_MAP_DATA_TYPE_INT32},     {"uint32", CU_TENSOR_MAP_DATA_TYPE_UINT32},
      {"int64", CU_TENSOR_MAP_DATA_TYPE_INT64},     {"uint64", CU_TENSOR_MAP_DATA_TYPE_UINT64},
      {"int16", CU_TENSOR_MAP_DATA_TYPE_UINT16},    {"uint16", CU_TENSOR_MAP_DATA_TYPE_UINT16},
      {"int8", CU_TENSOR_MAP_DATA_TYPE_UINT8},      {"uint8", CU_TENSOR_MAP_DATA_TYPE_UINT8},
      {"bool", CU_TENSOR_MAP_DATA_TYPE_UINT8},      {"float8_e4m3", CU_TENSOR_MAP_DATA_TYPE_UINT8},
      {"float8_e5m2", CU_TENSOR_MAP_DATA_TYPE_UINT8}};
  return types.at(dtype);
}

int tma_swizzle(int bytes) {
  return bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
         : bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
         : bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                       : CU_TENSOR_MAP_SWIZZLE_NONE;
}

std::array<unsigned char, 128> encode_tensor_map(const Driver& d, const TensorMapRequest& r) {
  if (!d.cuTensorMapEncodeTiled)
    throw LaunchError("this driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 or newer)");
  std::vector<uint32_t> element_strides(r.dims.size(), 1);
  CUtensorMap map{};
  CUresult rc = d.cuTensorMapEncodeTiled(
      &map, tma_data_type(r.dtype), uint32_t(r.dims.size()), r.address, r.dims.data(),
      r.strides.data(), r.box.data(), element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
      tma_swizzle(r.swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  d.check(rc, "cuTensorMapEncodeTiled");
  std::array<unsigned char, 128> out;
  std::memcpy(out.data(), &map, sizeof map);
  return out;
}

struct Loaded {
  CUcontext ctx = nullptr;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  bool compiled_cluster = false;  // cluster dims fixed in the cubin
};

class CudaKernel : public Kernel {
 public:
  CudaKernel(const std::string& cubin, const Manifest& m) : Kernel(m), cubin_(cubin) {
    for (size_t i = 0; i < m.kernel_args.size(); ++i) {
      const KernelArg& ka = m.kernel_args[i];
      if (ka.kind != "scalar") continue;
      const std::string& t = m.params[ka.param].dtype;
      if (t == "float8_e4m3" || t == "float8_e5m2")
        throw LaunchError(m.name + ": " + m.params[ka.param].name + ": " + t +
                          " scalars cannot be passed to a CUDA kernel");
    }
    std::set<std::string> used;
    for (const Expr& e : m.grid) e.names(&used);
    uses_sm_count_ = used.count(kSmCountDim) > 0;
    if (m.fallback) fallback_ = std::make_unique<CudaKernel>(cubin, *m.fallback);
  }

  void launch(const std::vector<Arg>& args, const LaunchOptions& options) override {
    BoundArgs bound = bind_args(manifest_, args);
    launch_bound(bound, options);
  }

 private:
  void launch_bound(BoundArgs& bound, const LaunchOptions& options) {
    const Manifest& m = manifest_;
    std::vector<std::string> failed;
    for (const Expr& e : m.requires_)
      if (e.eval(bound.dims) != 0) failed.push_back(e.str());
    if (!failed.empty()) {
      if (fallback_) return fallback_->launch_bound(bound, options);
      std::string list;
      for (const auto& f : failed) list += (list.empty() ? "" : ", ") + f;
      throw LaunchError(m.name + ": dims fail the kernel's launch precondition(s) [" + list +
                        "] (each must be 0): its TMA descriptors need rows a multiple of 16 "
                        "bytes apart");
    }
    const Driver& d = driver();
    int device = options.device >= 0 ? options.device : locate(d, bound);
    Dims dims = bound.dims;
    if (uses_sm_count_) dims[kSmCountDim] = sm_count(d, device);
    auto geo = geometry(dims);
    const auto& grid = geo[0];
    const auto& block = geo[1];
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;  // nothing to launch
    const Loaded& loaded = load_on(d, device);
    ScopedContext scope(d, loaded.ctx);
    for (size_t i = 0; i < m.params.size(); ++i) {
      Arg& v = bound.values[i];
      // A guarded load of an empty tensor still forms its (clamped) address: it must point
      // at readable memory, never at NULL.
      if (v.kind() == Arg::Kind::Tensor && v.tensor().numel() == 0)
        v.tensor().data = empty_buffer(d, device);
    }
    // packed in the kernel's context: encoding a tensor_map is a driver call
    std::vector<ParamSlot> slots = pack_kernel_args(m, bound, [&](const TensorMapRequest& r) {
      return encode_tensor_map(d, r);
    });
    std::vector<void*> params(slots.size() + 1);
    for (size_t i = 0; i < slots.size(); ++i) params[i] = slots[i].bytes;
    CUstream stream = static_cast<CUstream>(options.stream);
    bool cluster = (m.cluster[0] != 1 || m.cluster[1] != 1 || m.cluster[2] != 1) &&
                   !loaded.compiled_cluster;
    if (!cluster && !m.pdl) {
      d.check(d.cuLaunchKernel(loaded.function, unsigned(grid[0]), unsigned(grid[1]),
                               unsigned(grid[2]), unsigned(block[0]), unsigned(block[1]),
                               unsigned(block[2]), unsigned(m.dynamic_smem_bytes), stream,
                               params.data(), nullptr),
              "cuLaunchKernel");
      return;
    }
    // Cluster dims chosen at launch time and programmatic launches need cuLaunchKernelEx.
    if (!d.cuLaunchKernelEx)
      throw LaunchError(m.name + (cluster ? ": cluster dims" : ": a programmatic launch") +
                        " needs cuLaunchKernelEx, which this driver lacks");
    CUlaunchAttribute attrs[2]{};
    unsigned n = 0;
    if (cluster) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = unsigned(m.cluster[0]);
      attrs[n].value.clusterDim.y = unsigned(m.cluster[1]);
      attrs[n++].value.clusterDim.z = unsigned(m.cluster[2]);
    }
    if (m.pdl) {  // T.pdl_sync: it may start before the stream's earlier kernels end
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n++].value.programmaticStreamSerializationAllowed = 1;
    }
    CUlaunchConfig config{unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2]),
                          unsigned(block[0]), unsigned(block[1]), unsigned(block[2]),
                          unsigned(m.dynamic_smem_bytes), stream, attrs, n};
    d.check(d.cuLaunchKernelEx(&config, loaded.function, params.data(), nullptr),
            "cuLaunchKernelEx");
  }

  // The device the call's tensors live on: the first non-empty tensor's, else the current
  // context's, else 0.
  int locate(const Driver& d, const BoundArgs& bound) const {
    for (const Arg& v : bound.values) {
      if (v.kind() != Arg::Kind::Tensor || !v.tensor().data) continue;
      int ordinal = 0;
      CUresult rc = d.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                            reinterpret_cast<CUdeviceptr>(v.tensor().data));
      if (rc != 0) {
        try {
          d.check(rc, "cuPointerGetAttribute");
        } catch (const LaunchError& e) {
          throw LaunchError(manifest_.name + ": a tensor's data pointer is not CUDA device "
                            "memory (" + e.message() + ")");
        }
      }
      return ordinal;
    }
    CUcontext ctx = nullptr;
    CUdevice dev = 0;
    if (d.cuCtxGetCurrent(&ctx) == 0 && ctx && d.cuCtxGetDevice(&dev) == 0) return dev;
    return 0;
  }

  int sm_count(const Driver& d, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sm_counts_.find(device);
    if (it != sm_counts_.end()) return it->second;
    CUdevice dev = 0;
    d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    int n = 0;
    d.check(d.cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
            "cuDeviceGetAttribute");
    return sm_counts_[device] = n;
  }

  void* empty_buffer(const Driver& d, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = empty_.find(device);
    if (it != empty_.end()) return it->second;
    CUdeviceptr p = 0;
    d.check(d.cuMemAlloc(&p, kEmptyBytes), "cuMemAlloc");
    d.check(d.cuMemsetD8(p, 0, kEmptyBytes), "cuMemsetD8");
    return empty_[device] = reinterpret_cast<void*>(p);
  }

  const Loaded& load_on(const Driver& d, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = loaded_.find(device);
    if (it != loaded_.end()) return it->second;
    const Manifest& m = manifest_;
    Loaded l;
    CUdevice dev = 0;
    d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    d.check(d.cuDevicePrimaryCtxRetain(&l.ctx, dev), "cuDevicePrimaryCtxRetain");
    ScopedContext scope(d, l.ctx);
    d.check(d.cuModuleLoadData(&l.module, cubin_.data()), "cuModuleLoadData");
    try {
      d.check(d.cuModuleGetFunction(&l.function, l.module, m.symbol.c_str()),
              "cuModuleGetFunction");
    } catch (const LaunchError& e) {
      throw LaunchError(m.name + ": cubin has no kernel '" + m.symbol + "': " + e.message());
    }
    if (m.dynamic_smem_bytes > kDefaultSmemLimit)
      d.check(d.cuFuncSetAttribute(l.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   int(m.dynamic_smem_bytes)),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    int fixed[3] = {0, 0, 0};
    const int attrs[3] = {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
                          CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
                          CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH};
    bool known = true;
    for (int a = 0; a < 3; ++a) known = known && d.cuFuncGetAttribute(&fixed[a], attrs[a], l.function) == 0;
    if (known && fixed[0]) {  // the cubin fixes its cluster dims
      for (int a = 0; a < 3; ++a)
        if (std::max(1, fixed[a]) != m.cluster[a])
          throw LaunchError(m.name + ": the cubin fixes cluster dims (" +
                            std::to_string(std::max(1, fixed[0])) + ", " +
                            std::to_string(std::max(1, fixed[1])) + ", " +
                            std::to_string(std::max(1, fixed[2])) +
                            ") but the manifest says otherwise");
      l.compiled_cluster = true;
    }
    return loaded_[device] = l;
  }

  std::string cubin_;
  bool uses_sm_count_ = false;
  std::unique_ptr<CudaKernel> fallback_;
  std::mutex mu_;
  std::map<int, Loaded> loaded_;
  std::map<int, int> sm_counts_;
  std::map<int, void*> empty_;
};

}  // namespace

std::unique_ptr<Kernel> load_cuda(const std::string& artifact, const Manifest& m) {
  return std::make_unique<CudaKernel>(artifact, m);
}

}  // namespace tiled
