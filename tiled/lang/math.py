"""Scalar math on traced values: casts, selects, intrinsics from the IR's fixed registry."""

from __future__ import annotations

import math as _math

from tiled.ir import dtypes, ops
from tiled.lang.builder import definition_error
from tiled.lang.expr import Dim, Expr, as_expr, binary, call, cast, const, select
from tiled.lang.kernel import Scalar
from tiled.v1 import tile_ir_pb2 as pb


def _float_call(op: int, name: str, x) -> Expr:
    e = as_expr(x)
    if not dtypes.is_float(e.dtype):
        raise definition_error(f"T.{name} needs a float argument, got {e.dtype}; cast it first")
    return call(op, e)


def exp(x):
    """e^x of a float. `T.exp(S_local[i, j] - m_local[i])`"""
    return _float_call(pb.EXP, "exp", x)


def exp2(x):
    """2^x of a float (FlashAttention's softmax in base 2).

    >>> T.exp2(S_local[i, j] * scale - m_local[i] * scale)
    """
    return _float_call(pb.EXP2, "exp2", x)


def log(x):
    """The natural log of a float. `T.log(l_local[i])`"""
    return _float_call(pb.LOG, "log", x)


def log2(x):
    """log base 2 of a float. `T.log2(x[i])`"""
    return _float_call(pb.LOG2, "log2", x)


def sqrt(x):
    """The square root of a float. `T.sqrt(var_local[i] + eps)`"""
    return _float_call(pb.SQRT, "sqrt", x)


def rsqrt(x):
    """1 / sqrt(x) of a float (RMSNorm's scale). `T.rsqrt(sq_local[i] / N + eps)`"""
    return _float_call(pb.RSQRT, "rsqrt", x)


def tanh(x):
    """The hyperbolic tangent of a float. `T.tanh(x[i])`"""
    return _float_call(pb.TANH, "tanh", x)


def sigmoid(x):
    """1 / (1 + e^-x) of a float (SiLU is x * sigmoid(x)). `x[i] * T.sigmoid(x[i])`"""
    return _float_call(pb.SIGMOID, "sigmoid", x)


def erf(x):
    """The error function of a float (exact GELU).

    >>> 0.5 * x[i] * (1 + T.erf(x[i] * 0.7071067811865476))
    """
    return _float_call(pb.ERF, "erf", x)


def floor(x):
    """Rounds a float down; the result is a float. `T.floor(x[i])`"""
    return _float_call(pb.FLOOR, "floor", x)


def ceil(x):
    """Rounds a float up; the result is a float. `T.ceil(x[i])`"""
    return _float_call(pb.CEIL, "ceil", x)


def sin(x):
    """The sine of a float (radians). `T.sin(pos * inv_freq[j])`"""
    return _float_call(pb.SIN, "sin", x)


def cos(x):
    """The cosine of a float (radians). `T.cos(pos * inv_freq[j])`"""
    return _float_call(pb.COS, "cos", x)


def abs(x):
    """|x| for any numeric x. `T.abs(v)`"""
    return call(pb.ABS, as_expr(x))


def _is_traced(x) -> bool:
    return isinstance(x, (Expr, Dim))


def max(a, b):
    """Elementwise maximum; on two Python numbers, the Python max. `T.max(m, s)`"""
    if not _is_traced(a) and not _is_traced(b):
        return a if a >= b else b
    return binary(pb.MAX, a, b)


def min(a, b):
    """Elementwise minimum. `T.min(x, 6.0)`"""
    if not _is_traced(a) and not _is_traced(b):
        return a if a <= b else b
    return binary(pb.MIN, a, b)


def clamp(x, lo, hi):
    """x limited to [lo, hi]: min(max(x, lo), hi) (TileLang's T.clamp).

    >>> y[i] = T.clamp(x[i], -448.0, 448.0)
    """
    return min(max(x, lo), hi)


def ceildiv(a, b):
    """ceil(a / b) for non-negative ints; exact on Python ints. `T.ceildiv(M, 128)`"""
    if not _is_traced(a) and not _is_traced(b):
        return -(-a // b)
    return (a + b - 1) // b


def if_then_else(cond, a, b):
    """`a` where cond holds, else `b` (both evaluated). `T.if_then_else(i < n, x, 0.0)`"""
    return select(cond, a, b)


def reinterpret(dtype, value):
    """`value`'s bits read as `dtype`, a dtype of the same width (TileLang's and TVM's
    T.reinterpret(dtype, value)): the int32 <-> float32 and int16 <-> float16 / bfloat16 bit
    tricks of dequantization kernels (float8 not yet).

    >>> f = T.reinterpret("float32", (word & 15) | 0x4B000000) - 8388608.0  # 2^23 + q - 2^23
    """
    if isinstance(value, (str, Scalar)) and not isinstance(dtype, (str, Scalar)):
        raise definition_error("T.reinterpret takes (dtype, value), as TileLang's: "
                               f"T.reinterpret({value!r}, ...)")
    dt = _dtype_arg(dtype, "reinterpret")
    e = as_expr(value)
    if "bool" in (dt, e.dtype) or dtypes.bits(dt) != dtypes.bits(e.dtype) or dt == e.dtype:
        raise definition_error(f"T.reinterpret: {e.dtype} cannot be read as {dt}; it takes a "
                               "value to another dtype of the same width (not bool)")
    if "float8" in dt + e.dtype:
        raise definition_error(f"T.reinterpret of {e.dtype} as {dt}: float8 values are not "
                               "reinterpreted yet; store the bytes as uint8 and T.cast")
    node = pb.Expr(dtype=dtypes.to_enum(dt))
    node.call.op = pb.REINTERPRET
    node.call.args.add().CopyFrom(e.node)
    return Expr(node, dt)


def _dtype_arg(dtype, what: str) -> str:
    if isinstance(dtype, Scalar):  # T.float16 and friends
        dtype = dtype.dtype
    try:
        return dtypes.canonical_name(dtype)
    except (ValueError, TypeError, KeyError):
        raise definition_error(f"T.{what}: {dtype!r} is not a dtype") from None


def infinity(dtype):
    """+inf of a float dtype (float8_e4m3 has none: use T.max_value there).

    >>> T.fill(m_local, -T.infinity("float32"))
    """
    dt = _dtype_arg(dtype, "infinity")
    if not dtypes.is_float(dt):
        raise definition_error(f"T.infinity needs a float dtype, got {dt}; for integers use "
                               "T.max_value / T.min_value")
    if dt == "float8_e4m3":
        raise definition_error("T.infinity: float8_e4m3 has no infinity (its largest value is "
                               "448); use T.max_value(\"float8_e4m3\")")
    return const(_math.inf, dt)


def max_value(dtype):
    """The largest finite value of a dtype: 127 for int8, 65504.0 for float16.

    >>> T.fill(lo_local, T.max_value("float32"))
    """
    dt = _dtype_arg(dtype, "max_value")
    return _extreme(dt, "max_value", 1)


def min_value(dtype):
    """The smallest (most negative) finite value of a dtype: -128 for int8, 0 for uint8,
    -65504.0 for float16.

    >>> T.fill(hi_local, T.min_value("int32"))
    """
    dt = _dtype_arg(dtype, "min_value")
    return _extreme(dt, "min_value", 0)


def _extreme(dt: str, what: str, high: int) -> Expr:
    enum = dtypes.to_enum(dt)
    if dt == "bool":
        raise definition_error(f"T.{what} needs a number dtype, not bool")
    if dtypes.is_float(dt):
        m = ops.FLOAT_MAX[enum]
        return const(m if high else -m, dt)
    value = ops.INT_RANGE[enum][high]
    if value >= 1 << 63:  # a Tile IR constant is an int64
        raise definition_error(f"T.{what}(\"{dt}\") = {value} has no Tile IR constant "
                               "(constants hold int64); use int64, or compare the other way")
    return const(value, dt)


def all_of(*conds):
    """Logical and of bools. `T.all_of(i < M, j < N)`"""
    out = as_expr(conds[0])
    for c in conds[1:]:
        out = binary(pb.AND, out, c)
    return out


def any_of(*conds):
    """Logical or of bools. `T.any_of(i == 0, j == 0)`"""
    out = as_expr(conds[0])
    for c in conds[1:]:
        out = binary(pb.OR, out, c)
    return out


__all__ = ["abs", "all_of", "any_of", "cast", "ceil", "ceildiv", "clamp", "cos", "erf", "exp",
           "exp2", "floor", "if_then_else", "infinity", "log", "log2", "max", "max_value", "min",
           "min_value", "reinterpret", "rsqrt", "sigmoid", "sin", "sqrt", "tanh"]
