"""Exact float8 conversions written as TIR integer arithmetic, for backends whose own are not.

TVM's LLVM legalization of float8 (the cpu backend) decodes e4m3 subnormals as normals
(0x00 reads as 2^-7) and NaN as 480, and rounds on the way back to its own rule. These
conversions follow the OCP FP8 formats exactly as ml_dtypes does: e4m3fn (bias 7, no
infinity, 0x7F / 0xFF are NaN, values past 464 become NaN) and e5m2 (bias 15, IEEE-like
infinities and NaNs), rounding to nearest even, subnormals included.

A float8 value is its bits: a uint8 PrimExpr (a backend using these keeps float8 buffers as
uint8 storage, so TVM never sees a float8 dtype and never legalizes one: its legalization
promotes float8 loads to float32, after which no reinterpret recovers the bits).
"""

from __future__ import annotations

from tvm import tirx

# kind -> (exponent bits, mantissa bits, exponent bias)
FORMATS = {"float8_e4m3fn": (4, 3, 7), "float8_e5m2": (5, 2, 15)}


def _u32(v: int):
    return tirx.const(v, "uint32")


def _let(value, dtype: str, body):
    """body(v) with v bound to `value` once: the formulas use their input many times, and
    nested conversions would otherwise grow the expression exponentially."""
    if isinstance(value, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
        return body(value)
    v = tirx.Var("fp8_in", dtype)
    return tirx.Let(v, value, body(v))


def to_float32(bits, kind: str):
    """The float32 value of the float8 `kind` whose bits are `bits` (uint8)."""
    return _let(tirx.Cast("uint32", bits), "uint32", lambda b: _decode(b, kind))


def _decode(b, kind: str):
    e_bits, m_bits, bias = FORMATS[kind]
    sign = tirx.bitwise_and(tirx.shift_right(b, _u32(7)), _u32(1))
    exp = tirx.bitwise_and(tirx.shift_right(b, _u32(m_bits)), _u32((1 << e_bits) - 1))
    man = tirx.bitwise_and(b, _u32((1 << m_bits) - 1))
    normal = tirx.bitwise_or(
        tirx.shift_left(exp + _u32(127 - bias), _u32(23)),
        tirx.shift_left(man, _u32(23 - m_bits)))
    signed = lambda bits: tirx.bitwise_or(bits, tirx.shift_left(sign, _u32(31)))  # noqa: E731
    as_float = lambda bits: tirx.reinterpret("float32", signed(bits))  # noqa: E731
    # Subnormals: man * 2^(1 - bias - m_bits), exactly representable in float32.
    sub = tirx.Cast("float32", man) * tirx.const(2.0 ** (1 - bias - m_bits), "float32")
    sub = tirx.Select(sign == _u32(1), sub * tirx.const(-1.0, "float32"), sub)  # keeps -0.0
    top = _u32((1 << e_bits) - 1)
    nan = as_float(_u32(0x7FC00000))
    if kind == "float8_e4m3fn":  # only S.1111.111 is special: NaN
        special = tirx.And(exp == top, man == _u32(7))
        out = tirx.Select(special, nan, as_float(normal))
    else:  # e5m2: exponent 31 is infinity (man 0) or NaN
        inf = as_float(_u32(0x7F800000))
        out = tirx.Select(exp == top, tirx.Select(man == _u32(0), inf, nan), as_float(normal))
    return tirx.Select(exp == _u32(0), sub, out)


def from_float32(value, kind: str):
    """`value` (float32) rounded to nearest even into float8 `kind`: its bits (uint8).
    e4m3fn: NaN, infinities and magnitudes past 464 become NaN; e5m2: past 61440 become
    infinity, NaN stays NaN."""
    return _let(tirx.reinterpret("uint32", value), "uint32", lambda u: _encode(u, kind))


def _encode(u, kind: str):
    _, m_bits, bias = FORMATS[kind]
    sign = tirx.shift_left(tirx.shift_right(u, _u32(31)), _u32(7))
    a = tirx.bitwise_and(u, _u32(0x7FFFFFFF))
    drop = 23 - m_bits
    # Round the float32 mantissa to m_bits, ties to even; a carry moves into the exponent.
    rounded = tirx.shift_right(
        a + _u32((1 << (drop - 1)) - 1) + tirx.bitwise_and(tirx.shift_right(a, _u32(drop)),
                                                           _u32(1)),
        _u32(drop))
    normal = rounded - _u32((127 - bias) << m_bits)
    min_normal_bits = (127 - bias + 1) << 23  # float32 bits of the smallest float8 normal
    # Below it: a multiple of the subnormal quantum 2^(1 - bias - m_bits), ties to even.
    scale = tirx.const(2.0 ** (bias + m_bits - 1), "float32")
    absf = tirx.reinterpret("float32", a)
    sub = tirx.Cast("uint32", tirx.nearbyint(absf * scale))
    if kind == "float8_e4m3fn":
        nan = _u32(0x7F)
        mag = tirx.Select(a < _u32(min_normal_bits), sub,
                          tirx.Select(normal > _u32(0x7E), nan, normal))
        mag = tirx.Select(a > _u32(0x7F800000 - 1), nan, mag)  # inf and NaN
    else:
        inf = _u32(0x7C)
        mag = tirx.Select(a < _u32(min_normal_bits), sub,
                          tirx.Select(normal > inf, inf, normal))
        mag = tirx.Select(a > _u32(0x7F800000), _u32(0x7E), mag)  # NaN (inf stays inf)
    return tirx.Cast("uint8", tirx.bitwise_or(mag, sign))
