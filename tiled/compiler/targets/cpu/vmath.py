"""float32 exp, exp2 and sigmoid as TIR arithmetic, for the cpu backend: LLVM turns a vector
exp into one libm call per lane, so an element loop that takes an exponential (softmax, SiLU)
would run at a call per element. These are plain multiplies, adds, selects and bit moves, so
the loop vectorizes at the target's width.

Method (Cephes' expf): exp(x) = 2^n * exp(r) with n = round(x / ln 2) and r = x - n ln 2
(ln 2 split in two so that n ln2_hi is exact), |r| <= ln(2) / 2; exp(r) by its Taylor series to
r^7 (the next term is below 6e-9 relative); 2^n as two exact power-of-two factors, so
subnormal results round once and overflow gives infinity. exp2 reduces to r = (x - n) ln 2.
Within 2 ulp of the correctly rounded result over all of float32 (tests/compiler/
test_cpu_vmath.py sweeps it); NaN in, NaN out; +-inf give inf and 0.
"""

from __future__ import annotations

from tvm import tirx

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_LN2_HI = 0.693359375  # 9 significant bits: n * _LN2_HI is exact for |n| < 2^15
_LN2_LO = _LN2 - _LN2_HI
_TAYLOR = [1.0 / f for f in (5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0)]  # r^7 .. r^0


def _f32(v: float):
    return tirx.const(v, "float32")


def _let(value, body):
    """body(v) with v bound to `value` once (the formulas read their inputs many times)."""
    if isinstance(value, tirx.Var | tirx.FloatImm):
        return body(value)
    v = tirx.Var("vm", str(value.ty))
    return tirx.Let(v, value, body(v))


def _pow2(k):
    """2^k for int32 k in [-126, 127], by its bits."""
    biased = tirx.Cast("uint32", k + tirx.const(127, "int32"))
    return tirx.reinterpret("float32", tirx.shift_left(biased, tirx.const(23, "uint32")))


def _exp_reduced(r, n):
    """exp(r) * 2^n for |r| <= ln(2) / 2 and n (a float32 integer) in [-151, 129]."""
    p = _f32(_TAYLOR[0])
    for c in _TAYLOR[1:]:
        p = p * r + _f32(c)
    k = tirx.Cast("int32", n)
    half = tirx.shift_right(k, tirx.const(1, "int32"))  # floor(k / 2): both factors normal
    return p * _pow2(half) * _pow2(k - half)


def _clamped(x, lo: float, hi: float, body):
    """body(x clamped to [lo, hi]), NaN passed through (a clamp would turn it into a bound)."""
    return _let(x, lambda v: tirx.Select(
        tirx.isnan(v), v, body(tirx.Min(tirx.Max(v, _f32(lo)), _f32(hi)))))


def exp2(x):
    """2^x for a float32 x. Past +129 or -151 the result is inf or 0 anyway."""
    def body(c):
        return _let(tirx.floor(c + _f32(0.5)), lambda n: _let(
            (c - n) * _f32(_LN2), lambda r: _exp_reduced(r, n)))
    return _clamped(x, -151.0, 129.0, body)


def exp(x):
    """e^x for a float32 x."""
    def body(c):
        return _let(tirx.floor(c * _f32(_LOG2E) + _f32(0.5)), lambda n: _let(
            c - n * _f32(_LN2_HI) - n * _f32(_LN2_LO), lambda r: _exp_reduced(r, n)))
    return _clamped(x, -104.0, 89.0, body)


def sigmoid(x):
    """1 / (1 + e^-x) for a float32 x, as e^x / (1 + e^x) below 0 (where e^-x would overflow
    while the result is still a subnormal)."""
    def body(v):
        return _let(exp(_f32(0.0) - tirx.abs(v)), lambda e: _let(
            _f32(1.0) / (_f32(1.0) + e), lambda s: tirx.Select(v >= _f32(0.0), s, e * s)))
    return _let(x, body)
