"""Exact bfloat16 conversions written as TIR integer arithmetic, for backends that keep
bfloat16 values as their bits (uint16) so that TVM never legalizes a bfloat16 itself (cpu:
`ExprLowering.exact_bf16`). TVM's LLVM legalization of bfloat16 leaves a conversion inside a
Let's value unconverted, which then reads the integer storage as a number, and it rounds NaNs
with a low payload to infinity. Rounding here is to nearest even; NaN stays NaN (quieted), as
ml_dtypes converts. Shifts, adds and selects vectorize.
"""

from __future__ import annotations

from tvm import tirx


def _u32(v: int):
    return tirx.const(v, "uint32")


def to_float32(bits):
    """The float32 value of the bfloat16 whose bits are `bits` (uint16): exact, the bits are
    the float32's upper half."""
    return tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("uint32", bits), _u32(16)))


def from_float32(value):
    """`value` (float32) rounded to the nearest bfloat16 (ties to even): its bits (uint16)."""
    u = tirx.Var("bf16_in", "uint32")
    rounded = tirx.shift_right(
        u + _u32(0x7FFF) + tirx.bitwise_and(tirx.shift_right(u, _u32(16)), _u32(1)), _u32(16))
    quiet_nan = tirx.bitwise_or(tirx.shift_right(u, _u32(16)), _u32(0x40))
    is_nan = tirx.bitwise_and(u, _u32(0x7FFFFFFF)) > _u32(0x7F800000)
    return tirx.Cast("uint16", tirx.Let(u, tirx.reinterpret("uint32", value),
                                        tirx.Select(is_nan, quiet_nan, rounded)))
