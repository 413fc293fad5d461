// Argument checks against a manifest's params: the rules of tiled/runtime/args.py for
// C-contiguous tensors given as (pointer, shape, dtype) and C++ scalars.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tiled/loader.h"

namespace tiled {
namespace {

// Kernels index tensors with 32-bit integers (TVM's index type here).
constexpr int64_t kMaxElements = (int64_t(1) << 31) - 1;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

double float_max(const std::string& dtype) {
  if (dtype == "float16") return 65504.0;
  if (dtype == "bfloat16") return 3.3895313892515355e38;
  if (dtype == "float32") return 3.4028234663852886e38;
  if (dtype == "float8_e4m3") return 448.0;
  if (dtype == "float8_e5m2") return 57344.0;
  return std::numeric_limits<double>::infinity();
}

Arg check_scalar(const Param& p, const Arg& a) {
  const DType& t = dtype_named(p.dtype, p.name);
  if (a.kind() == Arg::Kind::Tensor)
    throw LaunchError(p.name + ": expected a " + p.dtype + " scalar, got a tensor");
  if (t.family == 'b') {
    if (a.kind() != Arg::Kind::Bool) throw LaunchError(p.name + ": expected a bool, got " + a.describe());
    return a;
  }
  if (t.family == 'i' || t.family == 'u') {
    if (a.kind() != Arg::Kind::Int && a.kind() != Arg::Kind::UInt)
      throw LaunchError(p.name + ": expected an int for " + p.dtype + ", got " + a.describe());
    bool neg = a.kind() == Arg::Kind::Int && a.as_int() < 0;
    // magnitude checks in unsigned arithmetic: the value may be any int64 or uint64
    uint64_t mag = a.kind() == Arg::Kind::UInt ? a.as_uint()
                   : neg ? uint64_t(-(a.as_int() + 1)) + 1 : uint64_t(a.as_int());
    uint64_t hi = t.family == 'u' ? (t.bits == 64 ? UINT64_MAX : (uint64_t(1) << t.bits) - 1)
                                  : (uint64_t(1) << (t.bits - 1)) - 1;
    uint64_t lo = t.family == 'u' ? 0 : uint64_t(1) << (t.bits - 1);  // magnitude of the min
    if (neg ? mag > lo : mag > hi) {
      std::string value = a.kind() == Arg::Kind::UInt ? std::to_string(a.as_uint())
                                                      : std::to_string(a.as_int());
      std::string low = t.family == 'u' ? "0" : "-" + std::to_string(lo);
      throw LaunchError(p.name + ": " + value + " is out of range for " + p.dtype + " [" + low +
                        ", " + std::to_string(hi) + "]");
    }
    return a;
  }
  if (a.kind() == Arg::Kind::Bool || a.kind() == Arg::Kind::Tensor)
    throw LaunchError(p.name + ": expected a float or int for " + p.dtype + ", got " +
                      a.describe());
  double v = a.kind() == Arg::Kind::Float  ? a.as_float()
             : a.kind() == Arg::Kind::UInt ? double(a.as_uint())
                                           : double(a.as_int());
  if (std::isfinite(v) && std::fabs(v) > float_max(p.dtype)) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", v);
    throw LaunchError(p.name + ": " + text + " is out of range for " + p.dtype);
  }
  return Arg(v);
}

void check_tensor(const Param& p, const Arg& a, BoundArgs* bound, std::map<std::string, std::string>* first) {
  if (a.kind() != Arg::Kind::Tensor)
    throw LaunchError(p.name + ": expected a tensor, got " + a.describe());
  const Tensor& t = a.tensor();
  if (t.dtype != p.dtype) throw LaunchError(p.name + ": expected dtype " + p.dtype + ", got " + t.dtype);
  if (t.shape.size() != p.shape.size()) {
    std::string want;
    for (size_t i = 0; i < p.shape.size(); ++i)
      want += (i ? ", " : "") +
              (p.shape[i].symbolic ? p.shape[i].name : std::to_string(p.shape[i].value));
    throw LaunchError(p.name + ": expected " + std::to_string(p.shape.size()) + " dims [" + want +
                      "], got " + std::to_string(t.shape.size()) + " (shape " +
                      shape_text(t.shape) + ")");
  }
  for (size_t i = 0; i < t.shape.size(); ++i) {
    const Extent& want = p.shape[i];
    int64_t got = t.shape[i];
    std::string dim = p.name + ": dim " + std::to_string(i);
    if (got < 0) throw LaunchError(dim + " is negative (" + std::to_string(got) + ")");
    if (!want.symbolic) {
      if (got != want.value)
        throw LaunchError(dim + " must be " + std::to_string(want.value) + ", got " + std::to_string(got));
      continue;
    }
    auto it = bound->dims.find(want.name);
    if (it == bound->dims.end()) {
      bound->dims[want.name] = got;
      (*first)[want.name] = p.name;
    } else if (it->second != got) {
      throw LaunchError(dim + " is " + want.name + "=" + std::to_string(got) + " here but " +
                        want.name + "=" + std::to_string(it->second) + " from " + (*first)[want.name]);
    }
  }
  int64_t numel = t.numel();
  if (numel > kMaxElements)
    throw LaunchError(p.name + ": " + std::to_string(numel) +
                      " elements; tiled kernels index tensors with 32-bit integers, so a tensor "
                      "holds at most " + std::to_string(kMaxElements) + " (split it)");
  uintptr_t ptr = reinterpret_cast<uintptr_t>(t.data);
  if (numel && ptr % uintptr_t(p.alignment())) {
    char text[32];
    std::snprintf(text, sizeof text, "%#" PRIxPTR, ptr);
    throw LaunchError(p.name + ": data pointer " + text + " is not aligned to " +
                      std::to_string(p.alignment()) + " bytes, as the kernel requires");
  }
  if (numel && !t.data) throw LaunchError(p.name + ": null data pointer for " + std::to_string(numel) + " elements");
}

}  // namespace

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return 0;
    if (__builtin_mul_overflow(n, s, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::string Arg::describe() const {
  switch (kind_) {
    case Kind::Tensor: return "a tensor";
    case Kind::Bool: return "a bool";
    case Kind::Int:
    case Kind::UInt: return "an int";
    case Kind::Float: return "a float";
  }
  return "?";
}

BoundArgs bind_args(const Manifest& m, const std::vector<Arg>& args) {
  if (args.size() != m.params.size()) {
    std::string names;
    for (size_t i = 0; i < m.params.size(); ++i) names += (i ? ", " : "") + m.params[i].name;
    throw LaunchError(m.name + ": expected " + std::to_string(m.params.size()) + " arguments (" +
                      names + "), got " + std::to_string(args.size()));
  }
  BoundArgs bound;
  std::map<std::string, std::string> first;
  for (size_t i = 0; i < args.size(); ++i) {
    const Param& p = m.params[i];
    try {
      if (p.is_tensor()) {
        check_tensor(p, args[i], &bound, &first);
        bound.values.push_back(args[i]);
      } else {
        bound.values.push_back(check_scalar(p, args[i]));
      }
    } catch (const LaunchError& e) {
      throw LaunchError(m.name + ": " + e.message());
    }
  }
  return bound;
}

}  // namespace tiled
