// The launch manifest (tiled/runtime/manifest.py is the reference): plain JSON that, with the
// artifact bytes, is all a loader needs to launch a kernel. Parsing validates it the way the
// Python runtime does; every problem is a ManifestError naming the field.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace tiled {

// Symbolic dims bound by a call: name -> extent.
using Dims = std::map<std::string, int64_t>;

// A dtype the manifest names ("float32", "bfloat16", ...): its size and family.
struct DType {
  std::string name;
  int bits = 0;
  char family = 0;  // 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
  int bytes() const { return bits < 8 ? 1 : bits / 8; }
};

// The DType called `name`; ManifestError (naming `where`) when there is none.
const DType& dtype_named(const std::string& name, const std::string& where);

// A grid / block / requires expression: an int, a dim name, or [op, a, b] with op one of
// add, sub, mul, floordiv, floormod, ceildiv, min, max.
struct Expr {
  enum class Kind { Int, Name, Op };
  Kind kind = Kind::Int;
  int64_t value = 0;
  std::string name;  // Name: the dim; Op: the operator
  std::vector<Expr> args;

  // The value for `dims`; floordiv / floormod round toward negative infinity (as Python),
  // ceildiv up. LaunchError on an unbound name or a division by zero.
  int64_t eval(const Dims& dims) const;
  // The dim names it reads.
  void names(std::set<std::string>* out) const;
  std::string str() const;  // as JSON
};

// One entry of a tensor's shape: a static extent or a symbolic dim's name.
struct Extent {
  bool symbolic = false;
  int64_t value = 0;
  std::string name;
};

// One parameter of the kernel's signature, in call order.
struct Param {
  std::string name;
  std::string kind;  // "tensor" | "scalar"
  std::string dtype;
  std::vector<Extent> shape;  // tensors only
  int64_t align = 0;          // tensors: bytes the data pointer must be aligned to; 0: element
  bool is_tensor() const { return kind == "tensor"; }
  int64_t alignment() const;
};

// One C parameter of a CUDA kernel (see the manifest module's doc).
struct KernelArg {
  std::string kind;  // "tensor" | "scalar" | "dim" | "tensor_map"
  int param = -1;    // tensor / scalar / tensor_map: index into params
  std::string name;  // dim: the dim
  std::string dtype; // dim: int32 | int64 | uint32 | uint64
  std::vector<int64_t> box;  // tensor_map: elements per dim, innermost first
  int swizzle = 0;           // tensor_map: bytes, 0 | 32 | 64 | 128
};

// A validated manifest. Immutable once parsed.
struct Manifest {
  int manifest_version = 1;
  std::string name, program_digest, target, backend, arch, artifact_format, artifact_sha256;
  std::string symbol;
  std::vector<Param> params;
  std::vector<KernelArg> kernel_args;
  std::array<Expr, 3> grid, block;
  int64_t dynamic_smem_bytes = 0;
  std::array<int64_t, 3> cluster{1, 1, 1};
  // The kernel holds a T.pdl_sync: launched with programmatic stream serialization (cuda).
  bool pdl = false;
  // Launch preconditions: each must evaluate to 0, else `fallback` runs (cuda only).
  std::vector<Expr> requires_;
  // Another kernel of the same artifact for calls that fail a precondition; null if none.
  std::shared_ptr<const Manifest> fallback;
  // The symbolic dims, in order of first appearance in the params.
  std::vector<std::string> dims;

  // Parses and validates manifest JSON text; ManifestError on any problem.
  static Manifest parse(const std::string& json_text);
};

// The name a CUDA grid may use for the device's multiprocessor count (persistent kernels).
inline constexpr const char* kSmCountDim = "tiled_sm_count";

}  // namespace tiled
