"""float32 exp, exp2 and sigmoid as TIR arithmetic, for the cpu backend: LLVM turns a vector
exp into one libm call per lane, so an element loop that takes an exponential (softmax, SiLU)
would run at a call per element. These are plain multiplies, adds, selects and bit moves, so
the loop vectorizes at the target's width.

Method: exp(x) = 2^n * exp(r) with n = x / ln 2 rounded to the nearest integer and r = x - n ln 2
(Cody-Waite: ln 2 split in two so that n ln2_hi is exact), |r| <= ln(2) / 2; exp2(x) = 2^n * 2^f
with f = x - n, exact, |f| <= 1/2. exp(r) and 2^f are degree-6 polynomials fitted for least
maximum relative error on those intervals (Lawson's iteratively reweighted least squares over
6001 Chebyshev points, float64, then rounded to float32; exp's two leading coefficients held
at 1): their own error is 3.3e-9 and 2.0e-9 relative, a twentieth of an ulp, where the
degree-7 Taylor series these replace took one more multiply-add. In exp 2^n is two exact
power-of-two factors, so subnormal results round once and overflow gives infinity.
Within 2 ulp of the correctly rounded result over all of float32, exp2's results below 2^-126
excepted (below; tests/compiler/test_cpu_vmath.py sweeps it); NaN in, NaN out; +-inf give
inf and 0.

Where the target scales by a power of two in one instruction (AVX-512's vscalefps, which
rounds a subnormal result once and overflows to infinity), 2^n is LLVM's ldexp instead of
the two factors' bit moves: 3 instructions in place of 9. Elsewhere ldexp would be a libm call
per lane, so exp keeps the factors.

exp2 without ldexp flushes results below 2^-126 to zero, as CUDA's `ex2.approx.ftz` (which
T.exp2 of float32 is on cuda) does, and scales by adding n to the polynomial value's exponent
field: 2 integer instructions where the two factors took 9 and 2 multiplies. Normal results
are the factors' (both scale exactly). A NaN's integer conversion gives INT_MIN on x86
(cvttps2dq) and 0 on AArch64 (fcvtzs), both 0 once shifted, so the NaN from the polynomial
passes unchanged. tiled.ops' float32 softmax (exp2 of the max-subtracted row) took 6.6-7.2 ms
with it where it took 8.0-8.2 ms before over 4096 x 4096 on the 2-core AVX2 host
(benchmarks/README.md).

The input clamp keeps NaN as a select that passes it through (`x < lo ? lo : x`), which x86
does in one max / min instruction; the NaN then reaches the polynomial, whose result stays NaN
whatever the scale factors hold. About 21 vector instructions per exp, 15 per exp2 (15 and 13
with ldexp).
"""

from __future__ import annotations

from tvm import tirx

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_LN2_HI = 0.693359375  # 9 significant bits: n * _LN2_HI is exact for |n| < 2^15
_LN2_LO = _LN2 - _LN2_HI
# Highest power first. exp(r) on [-1.01 ln2 / 2, 1.01 ln2 / 2] (the margin covers the rounding
# of x / ln 2 before it is rounded to n); 2^f on [-1/2, 1/2].
_EXP = (1.3813144760206342e-03, 8.369418792426586e-03, 4.166845604777336e-02,
        0.16666515171527863, 0.4999999403953552, 1.0, 1.0)
_EXP2 = (1.5353361959569156e-04, 1.3398875016719103e-03, 9.61843691766262e-03,
         5.5503323674201965e-02, 0.24022647738456726, 0.6931471824645996, 1.0)


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


def _poly(coefficients, r):
    """The polynomial (highest power first) at r, by Horner's rule."""
    p = _f32(coefficients[0])
    for c in coefficients[1:]:
        p = p * r + _f32(c)
    return p


def _scaled(coefficients, r, n, ldexp: bool):
    """poly(r) * 2^n for n (a float32 integer) in [-151, 129]."""
    p = _poly(coefficients, r)
    k = tirx.Cast("int32", n)
    if ldexp:
        return tirx.call_llvm_pure_intrin("float32", "llvm.ldexp.f32.i32", p, k)
    half = tirx.shift_right(k, tirx.const(1, "int32"))  # floor(k / 2): both factors normal
    return p * _pow2(half) * _pow2(k - half)


def _clamped(x, lo: float, hi: float | None, body):
    """body(x clamped to [lo, hi]), NaN passed through: each bound is taken only when the
    comparison with it holds, which it never does for NaN. hi None: x is never above 0."""
    def clamp(v):
        low = tirx.Select(v < _f32(lo), _f32(lo), v)
        if hi is None:
            return low
        return _let(low, lambda c: tirx.Select(c > _f32(hi), _f32(hi), c))
    return _let(x, lambda v: _let(clamp(v), body))


def exp2(x, ldexp: bool = False):
    """2^x for a float32 x; results below 2^-126 are 0 unless `ldexp` (the target's ldexp is
    one instruction, and that path keeps subnormal results). Past +128 the result is inf."""
    if ldexp:
        def exact(c):
            return _let(tirx.nearbyint(c),
                        lambda n: _let(c - n, lambda f: _scaled(_EXP2, f, n, ldexp)))
        return _clamped(x, -151.0, 129.0, exact)

    def body(c):  # c in [-126, 128]: poly(f) * 2^n is normal or (at n = 128, f = 0) inf
        def scaled(n, f):
            p = _poly(_EXP2, f)
            # p in [2^-0.5, 2^0.5]: its biased exponent is 126 or 127, plus n in [-126, 128]
            # stays within the normal numbers, or reaches 255 (infinity's exponent, with p's
            # mantissa 0: p = 1) only where the result overflows.
            shift = tirx.shift_left(tirx.Cast("int32", n), tirx.const(23, "int32"))
            return tirx.reinterpret("float32", tirx.reinterpret("int32", p) + shift)
        return _let(tirx.nearbyint(c), lambda n: _let(c - n, lambda f: scaled(n, f)))
    # Below -126 the result would be subnormal: 0. (The clamp's lower bound then never
    # decides a result; LLVM drops it.)
    return _let(x, lambda v: tirx.Select(v < _f32(-126.0), _f32(0.0),
                                         _clamped(v, -126.0, 128.0, body)))


def exp(x, ldexp: bool = False, nonpositive: bool = False):
    """e^x for a float32 x (`nonpositive`: x is never above 0, so no upper clamp)."""
    def body(c):
        return _let(tirx.nearbyint(c * _f32(_LOG2E)), lambda n: _let(
            c - n * _f32(_LN2_HI) - n * _f32(_LN2_LO), lambda r: _scaled(_EXP, r, n, ldexp)))
    return _clamped(x, -104.0, None if nonpositive else 89.0, body)


def sigmoid(x, ldexp: bool = False):
    """1 / (1 + e^-x) for a float32 x, as e^x / (1 + e^x) below 0 (where e^-x would overflow
    while the result is still a subnormal)."""
    def body(v):
        return _let(exp(_f32(0.0) - tirx.abs(v), ldexp, nonpositive=True), lambda e: _let(
            _f32(1.0) / (_f32(1.0) + e), lambda s: tirx.Select(v >= _f32(0.0), s, e * s)))
    return _let(x, body)
