"""Operator tables of the Tile IR, shared by the verifier, the printer and the compiler.

Every table is keyed by wire enum value. A value missing from a table is an unknown operator:
the verifier rejects it, the printer shows it as `?`.
"""

from __future__ import annotations

from tiled.v1 import tile_ir_pb2 as pb

# Intrinsics: arity, and which dtypes each accepts. All but REINTERPRET return their argument
# dtype; REINTERPRET returns its argument's bits as another dtype of the same width.
INTRINSIC_ARITY: dict[int, int] = {
    pb.NEG: 1, pb.NOT: 1, pb.EXP: 1, pb.EXP2: 1, pb.LOG: 1, pb.LOG2: 1, pb.SQRT: 1, pb.RSQRT: 1,
    pb.TANH: 1, pb.ABS: 1, pb.SIGMOID: 1, pb.FLOOR: 1, pb.CEIL: 1, pb.POW: 2, pb.ERF: 1,
    pb.SIN: 1, pb.COS: 1, pb.REINTERPRET: 1,
}
FLOAT_INTRINSICS = frozenset(INTRINSIC_ARITY) - {pb.NEG, pb.NOT, pb.ABS, pb.REINTERPRET}
NUMERIC_INTRINSICS = frozenset({pb.NEG, pb.ABS})  # ints or floats, not bool
BOOL_INTRINSICS = frozenset({pb.NOT})  # logical not

# Binary operators: both operands share one dtype.
ARITHMETIC_OPS = frozenset({pb.ADD, pb.SUB, pb.MUL, pb.DIV, pb.MIN, pb.MAX})  # result: operand
COMPARISON_OPS = frozenset({pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE})  # result: BOOL
LOGICAL_OPS = frozenset({pb.AND, pb.OR})  # BOOL operands and result
BITWISE_OPS = frozenset({pb.BIT_AND, pb.BIT_OR, pb.BIT_XOR, pb.SHL, pb.SHR})  # ints only
INT_ONLY_OPS = BITWISE_OPS | {pb.FLOOR_DIV, pb.FLOOR_MOD}
BINARY_OPS = ARITHMETIC_OPS | COMPARISON_OPS | LOGICAL_OPS | INT_ONLY_OPS

# Data types by family, and the value range of each integer dtype (BOOL holds 0 and 1).
INT_DTYPES = frozenset({pb.INT8, pb.INT16, pb.INT32, pb.INT64,
                        pb.UINT8, pb.UINT16, pb.UINT32, pb.UINT64})
FLOAT_DTYPES = frozenset({pb.FLOAT16, pb.BFLOAT16, pb.FLOAT32, pb.FLOAT64,
                          pb.FLOAT8_E4M3, pb.FLOAT8_E5M2})
DTYPES = INT_DTYPES | FLOAT_DTYPES | {pb.BOOL}
INT_RANGE: dict[int, tuple[int, int]] = {
    pb.BOOL: (0, 1),
    pb.INT8: (-(1 << 7), (1 << 7) - 1), pb.INT16: (-(1 << 15), (1 << 15) - 1),
    pb.INT32: (-(1 << 31), (1 << 31) - 1), pb.INT64: (-(1 << 63), (1 << 63) - 1),
    pb.UINT8: (0, (1 << 8) - 1), pb.UINT16: (0, (1 << 16) - 1),
    pb.UINT32: (0, (1 << 32) - 1), pb.UINT64: (0, (1 << 64) - 1),
}
# The largest finite value of each float dtype; a constant beyond it (other than inf) does
# not exist in that dtype (TVM refuses to build it).
FLOAT_MAX: dict[int, float] = {
    pb.FLOAT16: 65504.0, pb.BFLOAT16: 3.3895313892515355e38, pb.FLOAT32: 3.4028234663852886e38,
    pb.FLOAT64: 1.7976931348623157e308, pb.FLOAT8_E4M3: 448.0, pb.FLOAT8_E5M2: 57344.0,
}
UNSIGNED_DTYPES = frozenset({pb.UINT8, pb.UINT16, pb.UINT32, pb.UINT64})

SCOPES = frozenset({pb.GLOBAL, pb.SHARED, pb.FRAGMENT, pb.LOCAL, pb.BARRIER})
LOOP_KINDS = frozenset({pb.SERIAL, pb.PARALLEL, pb.PIPELINED, pb.UNROLL, pb.VECTORIZED})
REDUCE_KINDS = frozenset({pb.REDUCE_SUM, pb.REDUCE_MAX, pb.REDUCE_MIN, pb.REDUCE_ABSMAX})
ATOMIC_OPS = frozenset({pb.ATOMIC_ADD, pb.ATOMIC_MAX, pb.ATOMIC_MIN})
GEMM_POLICIES = frozenset({pb.POLICY_SQUARE, pb.POLICY_FULL_ROW, pb.POLICY_FULL_COL})

# Printer spellings (TileLang-like). Infix operators carry a precedence, higher binds tighter,
# as in Python; MIN and MAX print as calls.
BINARY_SYMBOL: dict[int, tuple[str, int]] = {
    pb.OR: ("or", 1), pb.AND: ("and", 2),
    pb.EQ: ("==", 4), pb.NE: ("!=", 4), pb.LT: ("<", 4), pb.LE: ("<=", 4), pb.GT: (">", 4),
    pb.GE: (">=", 4),
    pb.BIT_OR: ("|", 5), pb.BIT_XOR: ("^", 6), pb.BIT_AND: ("&", 7),
    pb.SHL: ("<<", 8), pb.SHR: (">>", 8),
    pb.ADD: ("+", 9), pb.SUB: ("-", 9),
    pb.MUL: ("*", 10), pb.DIV: ("/", 10), pb.FLOOR_DIV: ("//", 10), pb.FLOOR_MOD: ("%", 10),
}
BINARY_FUNCTION: dict[int, str] = {pb.MIN: "min", pb.MAX: "max"}
INTRINSIC_NAME: dict[int, str] = {
    pb.NEG: "neg", pb.NOT: "not_", pb.EXP: "exp", pb.EXP2: "exp2", pb.LOG: "log",
    pb.LOG2: "log2", pb.SQRT: "sqrt", pb.RSQRT: "rsqrt", pb.TANH: "tanh", pb.ABS: "abs",
    pb.SIGMOID: "sigmoid", pb.FLOOR: "floor", pb.CEIL: "ceil", pb.POW: "pow", pb.ERF: "erf",
    pb.SIN: "sin", pb.COS: "cos", pb.REINTERPRET: "reinterpret",
}
LOOP_KIND_NAME: dict[int, str] = {
    pb.SERIAL: "range", pb.PARALLEL: "Parallel", pb.PIPELINED: "Pipelined", pb.UNROLL: "unroll",
    pb.VECTORIZED: "vectorized",
}
REDUCE_NAME: dict[int, str] = {
    pb.REDUCE_SUM: "reduce_sum", pb.REDUCE_MAX: "reduce_max", pb.REDUCE_MIN: "reduce_min",
    pb.REDUCE_ABSMAX: "reduce_absmax",
}
ATOMIC_NAME: dict[int, str] = {
    pb.ATOMIC_ADD: "atomic_add", pb.ATOMIC_MAX: "atomic_max", pb.ATOMIC_MIN: "atomic_min",
}
# TileLang's spelling (T.GemmWarpPolicy.FullRow), printed as `policy=FullRow`.
GEMM_POLICY_NAME: dict[int, str] = {
    pb.POLICY_SQUARE: "Square", pb.POLICY_FULL_ROW: "FullRow", pb.POLICY_FULL_COL: "FullCol",
}
SCOPE_NAME: dict[int, str] = {
    pb.GLOBAL: "global", pb.SHARED: "shared", pb.FRAGMENT: "fragment", pb.LOCAL: "local",
    pb.BARRIER: "barrier",
}
MBARRIER_NAME: dict[int, str] = {
    pb.MBARRIER_ARRIVE: "mbarrier_arrive", pb.MBARRIER_WAIT_PARITY: "mbarrier_wait_parity",
    pb.MBARRIER_EXPECT_TX: "mbarrier_expect_tx",
}

# Identifiers that parameter and symbolic dim names may not take. Those names become C / CUDA
# identifiers of the generated kernel (tensor X: `X_ptr`, dim M: `int M`, scalar s: `s`), next
# to the keywords, builtins, types, macros and functions of TVM's generated code and tiled's
# headers: a parameter `uint` meets `#define uint unsigned int`, one named `expf` hides the
# function the body calls. Also reserved: names starting with `__` or `_` and a capital letter
# (C's reserved identifiers), and the prefixes of tiled's and TVM's own names.
RESERVED_PREFIXES = ("__", "tiled_", "TILED_", "tvm_", "TVM", "CUDA_", "fp8_", "make_")
_RESERVED_WORDS = """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef
    typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq main
    NULL std cuda tiled
    threadIdx blockIdx blockDim gridDim warpSize clusterDim dim3
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t ptrdiff_t
    intptr_t uintptr_t uint uchar ushort half half2 half4 half4_bfloat164 nv_bfloat16
    nv_bfloat162 nv_bfloat164 bfloat16
    min max abs fabs fabsf exp expf exp2 exp2f log logf log2 log2f sqrt sqrtf rsqrt rsqrtf
    tanh tanhf tan tanf atan atanf floor floorf ceil ceilf pow powf erf erff sin sinf cos
    cosf fmin fminf fmax fmaxf isnan isinf signbit hexp hexp2 hlog hlog2 hsqrt hrsqrt htanh
    htan hatan hfloor hceil hpow herf hsin hcos
"""
_VECTOR_TYPES = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "longlong",
                 "ulonglong", "float", "double")  # CUDA's int4, float2, ...
RESERVED_NAMES = frozenset(_RESERVED_WORDS.split()) | frozenset(
    f"{t}{n}" for t in _VECTOR_TYPES for n in "1234")
