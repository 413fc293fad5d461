// Loads an artifact by its manifest and launches it: a CPU shared library through its TVM FFI
// entry, or a cubin through the CUDA driver API (libcuda.so.1, opened at run time). No gRPC
// here: this library (tiled_loader) builds and runs where only a C++ compiler is.
//
//   tiled::Manifest m = tiled::Manifest::parse(manifest_json);
//   auto kernel = tiled::load(artifact_bytes, m);            // checks the sha256
//   kernel->launch({tiled::Tensor{a, {n}, "float32"}, ..., 0.5f});
//
// Every problem with the manifest, the artifact or the arguments raises tiled::LaunchError
// (ManifestError for the manifest) naming what is wrong, before anything runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tiled/errors.h"
#include "tiled/manifest.h"

namespace tiled {

// A C-contiguous tensor argument: host memory for a cpu kernel, a device pointer (CUdeviceptr)
// for a cuda kernel. `dtype` is a manifest dtype name.
struct Tensor {
  void* data = nullptr;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t numel() const;
};

// One call argument: a tensor or a scalar (bool, integer, floating point).
class Arg {
 public:
  enum class Kind { Tensor, Bool, Int, UInt, Float };
  Arg(const Tensor& t) : kind_(Kind::Tensor), tensor_(t) {}  // NOLINT: implicit on purpose
  Arg(bool v) : kind_(Kind::Bool), i_(v) {}                 // NOLINT
  Arg(int v) : kind_(Kind::Int), i_(v) {}                   // NOLINT
  Arg(long v) : kind_(Kind::Int), i_(v) {}                  // NOLINT
  Arg(long long v) : kind_(Kind::Int), i_(v) {}             // NOLINT
  Arg(unsigned v) : kind_(Kind::Int), i_(v) {}              // NOLINT
  Arg(unsigned long v) : kind_(Kind::UInt), u_(v) {}        // NOLINT
  Arg(unsigned long long v) : kind_(Kind::UInt), u_(v) {}   // NOLINT
  Arg(float v) : kind_(Kind::Float), f_(v) {}               // NOLINT
  Arg(double v) : kind_(Kind::Float), f_(v) {}              // NOLINT

  Kind kind() const { return kind_; }
  const Tensor& tensor() const { return tensor_; }
  Tensor& tensor() { return tensor_; }
  int64_t as_int() const { return i_; }
  uint64_t as_uint() const { return u_; }
  double as_float() const { return f_; }
  std::string describe() const;  // "a tensor", "an int", ...

 private:
  Kind kind_;
  Tensor tensor_;
  int64_t i_ = 0;
  uint64_t u_ = 0;
  double f_ = 0;
};

// The checked arguments of one call: `values[i]` matches params[i] (an int given for a float
// param is converted); `dims` holds each symbolic dim's extent.
struct BoundArgs {
  std::vector<Arg> values;
  Dims dims;
};

// Checks `args` against the manifest's params as tiled/runtime/args.py does (count, tensor or
// scalar, dtype, rank, static extents, symbolic dims equal wherever they repeat, at most
// 2^31-1 elements, data pointer alignment, scalar ranges) and binds the symbolic dims.
BoundArgs bind_args(const Manifest& manifest, const std::vector<Arg>& args);

// Where and how a cuda launch runs; ignored by cpu kernels.
struct LaunchOptions {
  void* stream = nullptr;  // a CUstream; null: the legacy default stream
  int device = -1;         // CUDA ordinal; -1: where the first tensor's memory lives
};

// A loaded kernel. launch() is thread-safe.
class Kernel {
 public:
  virtual ~Kernel() = default;
  const Manifest& manifest() const { return manifest_; }
  // Checks `args` (bind_args) and runs the kernel. A cpu kernel has finished when this
  // returns; a cuda launch is queued on the stream (synchronize to read results).
  virtual void launch(const std::vector<Arg>& args, const LaunchOptions& options = {}) = 0;
  // (grid, block) for the dims a call binds; LaunchError for an extent out of range.
  std::array<std::array<int64_t, 3>, 2> geometry(const Dims& dims) const;

 protected:
  explicit Kernel(Manifest m) : manifest_(std::move(m)) {}
  Manifest manifest_;
};

// Loads `artifact` (the bytes the manifest's artifact_sha256 names). LaunchError when the bytes
// do not match, no loader exists for the backend, or the library / module does not load.
std::unique_ptr<Kernel> load(const std::string& artifact, const Manifest& manifest);

// A cpu kernel's thread count for its parallel loops (0: the CPUs usable); returns the count
// now in effect. LaunchError for a kernel of another backend.
int set_cpu_threads(Kernel& kernel, int threads);

// The CUDA driver, opened from libcuda.so.1 on first use, for callers that hold device memory
// themselves (tiled-launch does). Every call raises LaunchError naming the failing driver call.
class CudaDevice {
 public:
  // Whether a CUDA driver loads and cuInit succeeds; `why` says why not.
  static bool available(std::string* why = nullptr);
  explicit CudaDevice(int ordinal = 0);  // makes the device's primary context current
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  void* alloc(size_t bytes);
  void free(void* ptr);
  void upload(void* device_ptr, const void* host, size_t bytes);
  void download(void* host, const void* device_ptr, size_t bytes);
  void synchronize();
  std::string name() const;
  int multiprocessors() const;
  std::pair<int, int> compute_capability() const;

 private:
  int ordinal_;
  void* ctx_;
};

}  // namespace tiled
