#include "tiled/half.h"

#include <cmath>
#include <cstring>

namespace tiled {

uint16_t float16_bits(double x) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (std::isnan(x)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // rounds past the largest finite half, 65504
  if (a < std::ldexp(1.0, -14))            // subnormal or zero: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
  int e = 0;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;          // a = 2m * 2^exponent, 2m in [1, 2)
  double q = std::nearbyint((2 * m - 1) * 1024);  // exact product; ties to even
  if (q == 1024) q = 0, exponent += 1;
  return sign | static_cast<uint16_t>((exponent + 15) << 10 | static_cast<int>(q));
}

double float16_value(uint16_t bits) {
  double sign = bits & 0x8000 ? -1.0 : 1.0;
  int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

uint16_t bfloat16_bits(double x) {
  float f = static_cast<float>(x);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu)) return 0x7FC0;
  return static_cast<uint16_t>(((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & 0xFFFFu);
}

double bfloat16_value(uint16_t bits) {
  uint32_t wide = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

}  // namespace tiled
