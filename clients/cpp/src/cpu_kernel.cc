// The cpu backend: a shared library (TVM's LLVM object linked with tiled's shim,
// tiled/compiler/targets/cpu/shim.c) called through its TVM FFI safe-call entry, as
// tiled/runtime/cpu.py does: one DLTensor* per tensor, an int64 / float64 / bool per scalar.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "cpu_level.h"
#include "kernels.h"

namespace tiled {
namespace {

// DLPack (dlpack.h v1.x) and TVM FFI (tvm/ffi/c_api.h, apache-tvm-ffi 0.1.x) structs.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct TVMFFIAny {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  };
};
static_assert(sizeof(DLTensor) == 48 && sizeof(TVMFFIAny) == 16, "TVM FFI ABI");

constexpr int32_t kDLCPU = 1;
constexpr int32_t kTVMFFIInt = 1, kTVMFFIBool = 2, kTVMFFIFloat = 3, kTVMFFIDLTensorPtr = 7;

using SafeCall = int (*)(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
using LastError = const char* (*)();
using SetThreads = int (*)(int);

DLDataType dl_dtype(const std::string& dtype) {
  // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 10 float8_e4m3fn, 12 float8_e5m2
  const DType& t = dtype_named(dtype, dtype);
  uint8_t code = t.family == 'i' ? 0 : t.family == 'u' ? 1 : t.family == 'b' ? 6 : 2;
  if (dtype == "bfloat16") code = 4;
  if (dtype == "float8_e4m3") code = 10;
  if (dtype == "float8_e5m2") code = 12;
  return {code, static_cast<uint8_t>(t.bits), 1};
}

// Empty tensors may come with a null pointer, which TVM's entry rejects; they point here
// (a guarded load's clamped address may read it; the value is discarded).
alignas(64) unsigned char empty_tensor[128];

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// dlopens the library bytes through a private file removed again once loaded. The file name
// is the sha256, so the dynamic loader (which reuses a library when a path repeats) only ever
// hands back a library with these very bytes. A noexec TMPDIR falls back to the cache folder.
void* open_library(const std::string& data, const std::string& digest) {
  std::string errors;
  std::string home = env_or("HOME", "/tmp");
  std::string cache = env_or("TILED_CACHE_DIR", env_or("XDG_CACHE_HOME", home + "/.cache") + "/tiled");
  for (const std::string& base : {env_or("TMPDIR", "/tmp"), cache + "/tmp"}) {
    if (base == cache + "/tmp") {
      ::mkdir(cache.c_str(), 0700);
      ::mkdir(base.c_str(), 0700);
    }
    std::string pattern = base + "/tiled-cpu-XXXXXX";
    std::vector<char> dir(pattern.begin(), pattern.end());
    dir.push_back('\0');
    if (!::mkdtemp(dir.data())) {
      errors += (errors.empty() ? "" : "; ") + base + ": " + std::strerror(errno);
      continue;
    }
    std::string path = std::string(dir.data()) + "/" + digest + ".so";
    void* lib = nullptr;
    {
      std::ofstream out(path, std::ios::binary);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      out.close();
      if (!out) {
        errors += (errors.empty() ? "" : "; ") + path + ": write failed";
      } else {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
          const char* why = dlerror();
          errors += (errors.empty() ? "" : "; ") + std::string(why ? why : "dlopen failed");
        }
      }
    }
    ::unlink(path.c_str());
    ::rmdir(dir.data());
    if (lib) return lib;
  }
  throw LaunchError("cannot load the CPU kernel library: " + errors);
}

class CpuKernel : public Kernel {
 public:
  CpuKernel(const std::string& artifact, const Manifest& m) : Kernel(m) {
    // Never dlclosed: the kernel's thread pool may still be parked in its code.
    void* lib = open_library(artifact, m.artifact_sha256);
    fn_ = reinterpret_cast<SafeCall>(dlsym(lib, m.symbol.c_str()));
    if (!fn_) throw LaunchError(m.name + ": the library has no symbol '" + m.symbol + "'");
    last_error_ = reinterpret_cast<LastError>(dlsym(lib, "tiled_last_error"));
    set_threads_ = reinterpret_cast<SetThreads>(dlsym(lib, "tiled_set_num_threads"));
    if (!last_error_ || !set_threads_)
      throw LaunchError(m.name + " (not linked with tiled's CPU shim): the library has no "
                        "tiled_last_error / tiled_set_num_threads");
    set_threads_(0);
    for (const Param& p : m.params)
      if (p.is_tensor()) dl_dtypes_.push_back(dl_dtype(p.dtype));
      else dl_dtypes_.push_back({});
  }

  int set_num_threads(int n) { return set_threads_(n); }

  void launch(const std::vector<Arg>& args, const LaunchOptions&) override {
    BoundArgs bound = bind_args(manifest_, args);
    size_t n = bound.values.size();
    std::vector<TVMFFIAny> anys(n);
    std::vector<DLTensor> tensors(n);
    std::vector<std::vector<int64_t>> shapes(n);
    for (size_t i = 0; i < n; ++i) {
      const Arg& v = bound.values[i];
      TVMFFIAny& any = anys[i];
      any.zero_padding = 0;
      switch (v.kind()) {
        case Arg::Kind::Tensor: {
          const Tensor& t = v.tensor();
          shapes[i] = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;
          void* data = t.data && t.numel() ? t.data : empty_tensor;
          tensors[i] = DLTensor{data, {kDLCPU, 0}, static_cast<int32_t>(t.shape.size()),
                                dl_dtypes_[i], shapes[i].data(), nullptr, 0};
          any.type_index = kTVMFFIDLTensorPtr;
          any.v_ptr = &tensors[i];
          break;
        }
        case Arg::Kind::Bool:
          any.type_index = kTVMFFIBool;
          any.v_int64 = v.as_int() ? 1 : 0;
          break;
        case Arg::Kind::Int:
          any.type_index = kTVMFFIInt;
          any.v_int64 = v.as_int();
          break;
        case Arg::Kind::UInt:  // a uint64 travels as its int64 bit pattern
          any.type_index = kTVMFFIInt;
          any.v_int64 = static_cast<int64_t>(v.as_uint());
          break;
        case Arg::Kind::Float:
          any.type_index = kTVMFFIFloat;
          any.v_float64 = v.as_float();
          break;
      }
    }
    TVMFFIAny result{};
    int rc = fn_(nullptr, anys.data(), static_cast<int32_t>(n), &result);
    if (rc != 0) {
      const char* message = last_error_();
      throw LaunchError(manifest_.name + ": kernel failed: " +
                        (message && *message ? std::string(message)
                                             : "returned " + std::to_string(rc) + " without a message"));
    }
  }

 private:
  SafeCall fn_ = nullptr;
  LastError last_error_ = nullptr;
  SetThreads set_threads_ = nullptr;
  std::vector<DLDataType> dl_dtypes_;
};

}  // namespace

std::unique_ptr<Kernel> load_cpu(const std::string& artifact, const Manifest& m) {
  check_runs_here(m.name, m.arch, host_cpu());  // before the .so's code can run
  return std::make_unique<CpuKernel>(artifact, m);
}

int set_cpu_threads(Kernel& kernel, int threads) {
  auto* cpu = dynamic_cast<CpuKernel*>(&kernel);
  if (!cpu) throw LaunchError(kernel.manifest().name + ": not a cpu kernel");
  return cpu->set_num_threads(threads);
}

}  // namespace tiled
