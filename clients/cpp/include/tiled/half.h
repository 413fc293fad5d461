// 16-bit float conversions: IEEE half and bfloat16 bits <-> double, rounding to nearest even
// (half: as Python's struct 'e'; bfloat16: through float32 first, as tiled's Python runtime).
#pragma once

#include <cstdint>

namespace tiled {

uint16_t float16_bits(double x);
double float16_value(uint16_t bits);
uint16_t bfloat16_bits(double x);
double bfloat16_value(uint16_t bits);

}  // namespace tiled
