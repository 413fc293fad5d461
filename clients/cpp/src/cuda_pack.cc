// Kernel parameter packing and TMA descriptor requests, as tiled/runtime/cuda.py's LaunchPlan.
#include "cuda_pack.h"

#include <climits>
#include <cstring>

#include "tiled/half.h"

namespace tiled {
namespace {

void pack_scalar(const std::string& dtype, const Arg& v, unsigned char* out) {
  const DType& t = dtype_named(dtype, dtype);
  if (t.family == 'f') {
    double x = v.kind() == Arg::Kind::Float ? v.as_float() : double(v.as_int());
    if (dtype == "float16") {
      uint16_t h = float16_bits(x);
      std::memcpy(out, &h, 2);
    } else if (dtype == "bfloat16") {
      uint16_t h = bfloat16_bits(x);
      std::memcpy(out, &h, 2);
    } else if (dtype == "float32") {
      float f = static_cast<float>(x);
      std::memcpy(out, &f, 4);
    } else {
      std::memcpy(out, &x, 8);
    }
    return;
  }
  // ints and bool: the low bytes of the two's complement value, little-endian
  uint64_t bits = v.kind() == Arg::Kind::UInt ? v.as_uint() : static_cast<uint64_t>(v.as_int());
  std::memcpy(out, &bits, static_cast<size_t>(t.bytes()));
}

}  // namespace

TensorMapRequest tensor_map_request(const Manifest& m, size_t i, const Tensor& t) {
  const KernelArg& ka = m.kernel_args[i];
  const Param& p = m.params[ka.param];
  std::string what = m.name + ": " + p.name + " (kernel_args[" + std::to_string(i) +
                     "], tensor_map)";
  int64_t size = dtype_named(p.dtype, p.name).bytes();
  const auto& shape = t.shape;
  size_t rank = shape.size();
  for (int64_t s : shape)
    if (s < 1 || s > (int64_t(1) << 32))
      throw LaunchError(what + ": shape has a dim of " + std::to_string(s) +
                        "; TMA needs every dim in 1..2^32");
  TensorMapRequest r;
  // Outer dims, innermost first (the tensor is C-contiguous). A dim of size 1 is never
  // stepped: any legal stride describes it, so it takes the smallest that keeps the strides
  // ordered and 16-byte multiples.
  int64_t span = shape[rank - 1];  // elements the dims inside the current one cover
  for (int j = int(rank) - 2; j >= 0; --j) {
    int64_t stride = span;
    std::string name = j == int(rank) - 2 ? "row stride" : "stride of dim " + std::to_string(j);
    if (shape[j] == 1) stride = (span * size + 15) / 16 * 16 / size;
    int64_t nbytes = stride * size;
    if (nbytes % 16) {
      if (j == int(rank) - 2) {
        const Extent& last = p.shape.back();
        std::string rows = last.symbolic
                               ? last.name + "=" + std::to_string(shape[rank - 1]) + " " + p.dtype + " rows are"
                               : std::to_string(shape[rank - 1]) + "-element " + p.dtype + " rows are";
        throw LaunchError(what + ": " + rows + " " + std::to_string(nbytes) +
                          " bytes; TMA needs row strides that are multiples of 16 bytes: pad "
                          "the row length to a multiple of " +
                          std::to_string(std::max<int64_t>(1, 16 / size)));
      }
      throw LaunchError(what + ": " + name + " is " + std::to_string(nbytes) +
                        " bytes; TMA needs strides that are multiples of 16 bytes");
    }
    if (nbytes >= (int64_t(1) << 40))
      throw LaunchError(what + ": " + name + " " + std::to_string(nbytes) +
                        " bytes; TMA needs less than 2^40");
    r.strides.push_back(uint64_t(nbytes));
    span = stride * shape[j];
  }
  if (reinterpret_cast<uintptr_t>(t.data) % 16)
    throw LaunchError(what + ": data pointer is not 16-byte aligned; TMA needs a 16-byte "
                      "aligned base");
  r.dtype = p.dtype;
  r.address = t.data;
  r.dims.assign(shape.rbegin(), shape.rend());
  r.box.assign(ka.box.begin(), ka.box.end());
  r.swizzle = ka.swizzle;
  return r;
}

std::vector<ParamSlot> pack_kernel_args(const Manifest& m, const BoundArgs& bound,
                                        const TensorMapEncoder& encode) {
  std::vector<ParamSlot> slots(m.kernel_args.size());
  for (size_t i = 0; i < m.kernel_args.size(); ++i) {
    const KernelArg& ka = m.kernel_args[i];
    unsigned char* out = slots[i].bytes;
    std::memset(out, 0, sizeof slots[i].bytes);
    if (ka.kind == "tensor") {
      uint64_t ptr = reinterpret_cast<uintptr_t>(bound.values[ka.param].tensor().data);
      std::memcpy(out, &ptr, 8);
    } else if (ka.kind == "scalar") {
      pack_scalar(m.params[ka.param].dtype, bound.values[ka.param], out);
    } else if (ka.kind == "dim") {
      int64_t v = bound.dims.at(ka.name);
      bool fits = ka.dtype == "int64" || (ka.dtype == "uint64" && v >= 0) ||
                  (ka.dtype == "int32" && v >= INT32_MIN && v <= INT32_MAX) ||
                  (ka.dtype == "uint32" && v >= 0 && v <= int64_t(UINT32_MAX));
      if (!fits)
        throw LaunchError(m.name + ": dim " + ka.name + "=" + std::to_string(v) +
                          " does not fit the kernel's " + ka.dtype + " parameter #" +
                          std::to_string(i));
      std::memcpy(out, &v, ka.dtype == "int32" || ka.dtype == "uint32" ? 4 : 8);
    } else {  // tensor_map
      TensorMapRequest r = tensor_map_request(m, i, bound.values[ka.param].tensor());
      std::array<unsigned char, 128> desc;
      try {
        desc = encode(r);
      } catch (const LaunchError& e) {
        throw LaunchError(m.name + ": " + m.params[ka.param].name + " (kernel_args[" +
                          std::to_string(i) + "], tensor_map): encoding the TMA descriptor "
                          "failed: " + e.message());
      }
      std::memcpy(out, desc.data(), desc.size());
    }
  }
  return slots;
}

}  // namespace tiled
