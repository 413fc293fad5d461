"""Shared pieces of lowering Tile IR to TVM TIR: dtypes, expressions, parameters.

Every backend walks the Tile IR itself and emits TIR through TVM's IR builder (never text).
`ExprLowering` converts expressions given the backend's current binding of variables and
buffers; backends rebind as they go (a loop var becomes a TIR loop var, a block var becomes an
expression over a fused loop, a fragment load becomes a register access).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler import bf16, fp8
from tiled.compiler.manifest import dim_names
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.verify_params import c_name_problem
from tiled.ir.walk import subexprs
from tiled.v1 import tile_ir_pb2 as pb

TVM_DTYPE = {"float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}


def tvm_dtype(dtype: int | str) -> str:
    name = dtypes.canonical_name(dtype)
    return TVM_DTYPE.get(name, name)


_BINARY: dict[int, Callable] = {
    pb.ADD: lambda a, b: a + b,
    pb.SUB: lambda a, b: a - b,
    pb.MUL: lambda a, b: a * b,
    pb.FLOOR_DIV: tirx.floordiv,
    pb.FLOOR_MOD: tirx.floormod,
    pb.MIN: tirx.Min,
    pb.MAX: tirx.Max,
    pb.EQ: tirx.EQ, pb.NE: tirx.NE, pb.LT: tirx.LT, pb.LE: tirx.LE, pb.GT: tirx.GT, pb.GE: tirx.GE,
    pb.AND: tirx.And, pb.OR: tirx.Or,
    pb.BIT_AND: tirx.bitwise_and, pb.BIT_OR: tirx.bitwise_or, pb.BIT_XOR: tirx.bitwise_xor,
    pb.SHL: tirx.shift_left, pb.SHR: tirx.shift_right,
}

_CALL: dict[int, Callable] = {
    pb.NEG: lambda a: tirx.const(0, str(a.ty)) - a,
    pb.NOT: tirx.Not,
    pb.EXP: tirx.exp, pb.EXP2: tirx.exp2, pb.LOG: tirx.log, pb.LOG2: tirx.log2,
    pb.SQRT: tirx.sqrt, pb.RSQRT: tirx.rsqrt, pb.TANH: tirx.tanh, pb.ABS: tirx.abs,
    pb.SIGMOID: tirx.sigmoid, pb.FLOOR: tirx.floor, pb.CEIL: tirx.ceil, pb.POW: tirx.power,
    pb.ERF: tirx.erf, pb.SIN: tirx.sin, pb.COS: tirx.cos,
}
# TVM marks every math op above vectorizable except erf, and its VectorizeLoop scalarizes a
# whole loop over one call it may not widen: a nest calling T.erf (exact GELU) moved its
# bfloat16 values 2 bytes at a time on CUDA where SiLU's moved 8. Each backend's codegen
# takes a vector erf as it takes a vector exp (one call per lane on CUDA / ROCm / Metal,
# TVM's LLVM erf expansion on cpu).
if tvm.ir.Op.get("tirx.erf").get_attr("TVectorizable") is None:
    tvm.ir.register_op_attr("tirx.erf", "TVectorizable", True)


_UNSIGNED = frozenset({pb.UINT8, pb.UINT16, pb.UINT32, pb.UINT64})
FP8_DTYPES = frozenset(TVM_DTYPE.values())
# Floats a backend may keep as their bits: TVM dtype -> (storage dtype, bits -> float32,
# float32 -> bits).
_BITS_FLOATS = {
    "bfloat16": ("uint16", bf16.to_float32, bf16.from_float32),
    **{k: ("uint8", lambda b, k=k: fp8.to_float32(b, k), lambda v, k=k: fp8.from_float32(v, k))
       for k in FP8_DTYPES},
}
_COMPARISONS = frozenset({pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE})
# Operators whose result is >= 0 when both operands are (FLOOR_MOD: the divisor is not 0).
_SIGN_KEEPING = frozenset({pb.ADD, pb.MUL, pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD, pb.MIN, pb.MAX,
                           pb.BIT_AND, pb.BIT_OR, pb.SHR})


def loc_of(stmt: pb.Stmt) -> str:
    return f"{stmt.loc.file}:{stmt.loc.line}" if stmt.HasField("loc") and stmt.loc.file else ""


class ExprLowering:
    """Converts Tile IR expressions to TIR. `vars` maps var id -> PrimExpr; `load` builds a
    load of buffer id at TIR indices (backends decide what a fragment load means).
    `exact_fp8`: float8 values are their bits (uint8 PrimExprs, in uint8 buffers: `tir_dtype`)
    converted by tiled.compiler.fp8, never TVM's float8 (set by backends whose TVM lowering
    of float8 is not exact: cpu). `exact_bf16` does the same for bfloat16 (uint16 bits,
    tiled.compiler.bf16). Then a PrimExpr's dtype no longer says whether it is such a float,
    so conversions name the Tile IR dtype of their operand (`cast(..., src=)`); arithmetic on
    them runs in float32, rounded back once per operation."""

    exact_fp8 = False
    exact_bf16 = False
    # Whether a select of a loaded value (a guarded load) lowers to TIR's if_then_else (set
    # by CUDA: TVM's CUDA codegen of a vectorized Select declares its condition vector with
    # the value's type, which nvcc rejects, `nv_bfloat164 c = make_ushort4(...)`;
    # if_then_else keeps one scalar condition over the vector values).
    select_as_if = False

    def __init__(self, program: Program):
        self.program = program.proto
        self.vars: dict[int, tirx.PrimExpr] = {}
        self.var_dtype = {v.id: self.tir_dtype(v.dtype) for v in self.program.vars}
        self.buffers = {b.id: b for b in self.program.buffers}
        # Scalar parameters may hold anything; loop, block and dim vars are never negative.
        self.scalars = {prm.scalar for prm in self.program.params
                        if prm.WhichOneof("kind") == "scalar"}

    def load(self, bid: int, indices: list) -> tirx.PrimExpr:
        raise NotImplementedError

    def bits_float(self, dt: str) -> bool:
        """Whether values of TVM dtype `dt` are lowered as their bits (exact_fp8, exact_bf16)."""
        return (self.exact_fp8 and dt in FP8_DTYPES) or (self.exact_bf16 and dt == "bfloat16")

    def tir_dtype(self, dtype: int | str) -> str:
        """The TIR dtype that holds values of Tile IR `dtype` (uint8 for float8 when
        `exact_fp8`, uint16 for bfloat16 when `exact_bf16`)."""
        dt = tvm_dtype(dtype)
        return _BITS_FLOATS[dt][0] if self.bits_float(dt) else dt

    def region_index(self, region: pb.Region, tile_coords: list) -> tuple[list, list]:
        """TIR indices of a region's element at squeezed tile coordinates (one per extent
        other than 1), and its in-bounds conditions (global buffers only: below the dim, and
        not below 0 unless the offset is provably non-negative)."""
        buf = self.buffers[region.buffer]
        it = iter(tile_coords)
        idx, conds = [], []
        for d, (off, ext) in enumerate(zip(region.offsets, region.extents, strict=True)):
            i = self.expr(off) + (next(it) if ext != 1 else 0)
            idx.append(i)
            if buf.scope == pb.GLOBAL:
                if not self.nonnegative(off):
                    conds.append(i >= 0)
                conds.append(i < global_extent(self, buf, d))
        return idx, conds

    def nonnegative(self, e: pb.Expr) -> bool:
        """Whether the integer expression `e` is >= 0 whatever the inputs: built from
        non-negative constants, loop / block / dim vars and operators that keep the sign."""
        kind = e.WhichOneof("kind")
        if e.dtype in _UNSIGNED:
            return True
        if kind == "int_value":
            return e.int_value >= 0
        if kind == "var":
            return e.var not in self.scalars
        if kind == "binary" and e.binary.op in _SIGN_KEEPING:
            return self.nonnegative(e.binary.a) and self.nonnegative(e.binary.b)
        if kind == "cast":
            src = e.cast.value.dtype
            return src in _UNSIGNED or (dtypes.nbytes(e.dtype) >= dtypes.nbytes(src)
                                        and self.nonnegative(e.cast.value))
        if kind == "select":
            return self.nonnegative(e.select.true_value) and \
                self.nonnegative(e.select.false_value)
        return False

    def expr(self, e: pb.Expr) -> tirx.PrimExpr:
        kind = e.WhichOneof("kind")
        dt = tvm_dtype(e.dtype)
        if kind in ("int_value", "float_value") and self.bits_float(dt):
            return self.cast(tirx.const(float(getattr(e, kind)), "float32"), dt, "float32")
        if kind == "int_value":
            return tirx.const(bool(e.int_value) if dt == "bool" else e.int_value, dt)
        if kind == "float_value":
            return tirx.const(e.float_value, dt)
        if kind == "var":
            return self.vars[e.var]
        if kind == "binary":
            return self.binary(e.binary, dt)
        if kind == "call":
            args = [self.expr(a) for a in e.call.args]
            if e.call.op == pb.REINTERPRET:  # a bits float is its bits already
                return tirx.reinterpret(self.tir_dtype(dt), args[0])
            if dt in FP8_DTYPES or self.bits_float(dt):  # no arithmetic of its own: in float32
                f32 = [self.cast(a, "float32", tvm_dtype(x.dtype))
                       for a, x in zip(args, e.call.args, strict=True)]
                return self.cast(self.call(e.call.op, f32, "float32"), dt)
            return self.call(e.call.op, args, dt)
        if kind == "cast":
            return self.cast(self.expr(e.cast.value), dt, tvm_dtype(e.cast.value.dtype))
        if kind == "select":
            loads = self.select_as_if and any(
                sub.WhichOneof("kind") == "load"
                for v in (e.select.true_value, e.select.false_value) for sub in subexprs(v))
            pick = tirx.if_then_else if loads else tirx.Select
            return pick(self.expr(e.select.cond), self.expr(e.select.true_value),
                        self.expr(e.select.false_value))
        if kind == "load":
            return self.load(e.load.buffer, [self.expr(i) for i in e.load.indices])
        raise CompileError(f"expression kind {kind} cannot be lowered")

    def call(self, op: int, args: list, dt: str) -> tirx.PrimExpr:
        """Math intrinsic `op` (pb.EXP, ...) of lowered `args`, of TVM dtype `dt`; a backend
        overrides it to lower some itself."""
        return _CALL[op](*args)

    def cast(self, value: tirx.PrimExpr, dt: str, src: str | None = None) -> tirx.PrimExpr:
        """`value`, of TVM dtype `src` (default: its own), converted to `dt` (bits floats
        exactly, through float32: `bits_float`)."""
        src = src or str(value.ty)
        if src == dt:
            return value
        if not (self.bits_float(dt) or self.bits_float(src)):
            return tirx.Cast(dt, value)
        f32 = value if src == "float32" else _BITS_FLOATS[src][1](value) \
            if self.bits_float(src) else tirx.Cast("float32", value)
        if self.bits_float(dt):
            return self.bits_of_float32(f32, dt)
        return f32 if dt == "float32" else tirx.Cast(dt, f32)

    def bits_of_float32(self, f32: tirx.PrimExpr, dt: str) -> tirx.PrimExpr:
        """The bits of float32 `f32` rounded to bits float `dt` (a backend may override)."""
        return _BITS_FLOATS[dt][2](f32)

    def binary(self, b: pb.Binary, dt: str) -> tirx.PrimExpr:
        """A binary expression with every result defined (the verifier refuses what is wrong
        on every execution; these are the cases that are wrong only on some):
        - integer division and modulo by a divisor that may be 0 divide by 1 instead (no trap,
          no undefined behaviour); constant negative divisors are rewritten onto positive ones
          (floor(a / -c) = floor(-a / c)), which TVM's simplifier handles;
        - a shift amount is taken modulo the operand's width (`x << 33` is `x << 1` in int32);
        - fp8 operands (and bits floats) are computed in float32 and the result rounded back."""
        op = b.op
        a, y = self.expr(b.a), self.expr(b.b)
        operand = tvm_dtype(b.a.dtype)
        if operand in FP8_DTYPES or self.bits_float(operand):
            a, y = self.cast(a, "float32", operand), self.cast(y, "float32", operand)
            if op in _COMPARISONS:
                return _BINARY[op](a, y)
            out = a / y if op == pb.DIV else _BINARY[op](a, y)
            return self.cast(out, dt)
        if op == pb.DIV and dtypes.is_float(b.a.dtype):
            return a / y
        if op in (pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD):
            c = b.b.int_value if b.b.WhichOneof("kind") == "int_value" else None
            if c is not None and c < 0 and op != pb.DIV:
                neg_c, neg_a = tirx.const(-c, operand), tirx.const(0, operand) - a
                if op == pb.FLOOR_DIV:
                    return tirx.floordiv(neg_a, neg_c)
                return tirx.const(0, operand) - tirx.floormod(neg_a, neg_c)
            if c is None:  # a dim may be 0 too (an empty tensor)
                y = tirx.Select(y == tirx.const(0, operand), tirx.const(1, operand), y)
            return tirx.truncdiv(a, y) if op == pb.DIV else _BINARY[op](a, y)
        if op in (pb.SHL, pb.SHR) and not (b.b.WhichOneof("kind") == "int_value"
                                           and 0 <= b.b.int_value < dtypes.nbytes(b.a.dtype) * 8):
            y = tirx.bitwise_and(y, tirx.const(dtypes.nbytes(b.a.dtype) * 8 - 1, operand))
        return _BINARY[op](a, y)


def steps_along(lower: ExprLowering, exprs, var: int) -> list[int | None]:
    """How far each of `exprs` moves when variable `var` grows by one, proved for every value
    of the variables `lower` binds to symbolic vars (TVM's arithmetic analyzer, not
    sampled), or None where that is not one constant. `var` must be bound to an expression;
    its binding is restored."""
    from tvm.sym import Analyzer

    at = lower.vars[var]
    try:
        here = [lower.expr(e) for e in exprs]
        lower.vars[var] = at + 1
        there = [lower.expr(e) for e in exprs]
    finally:
        lower.vars[var] = at
    ana = Analyzer()
    steps = [ana.simplify(b - a) for a, b in zip(here, there, strict=True)]
    return [int(s.value) if isinstance(s, tirx.IntImm) else None for s in steps]


def declare_params(program: Program, lower: ExprLowering,
                   align: int | None = None) -> dict[int, tirx.Buffer]:
    """Declares the PrimFunc's parameters (inside `T.prim_func()`) in program order; binds the
    symbolic dims and scalar params in `lower.vars`. Returns buffer id -> TIR buffer.
    `align` is the data alignment TVM may assume (bytes); None: the element size, since
    callers pass arbitrary arrays (TVM's own default of 64 would be undefined behaviour)."""
    p = program.proto
    names = dim_names(p)
    dims: dict[int, tirx.Var] = {}
    out: dict[int, tirx.Buffer] = {}
    for param in p.params:
        if param.WhichOneof("kind") == "buffer":
            b = lower.buffers[param.buffer]
            shape = []
            for d in b.shape:
                if d.WhichOneof("kind") == "var":
                    if d.var not in dims:
                        dims[d.var] = tirx.Var(names[d.var], "int32")
                        lower.vars[d.var] = dims[d.var]
                    shape.append(dims[d.var])
                else:
                    shape.append(d.size)
            arg = T.arg(param.name, T.Buffer(shape, tvm_dtype(b.dtype),
                                             align=align or dtypes.nbytes(b.dtype)))
            out[b.id] = arg
        else:
            v = tirx.Var(param.name, lower.var_dtype[param.scalar])
            lower.vars[param.scalar] = T.arg(param.name, v)
    for bid, arg in out.items():
        storage = lower.tir_dtype(lower.buffers[bid].dtype)
        if storage != str(arg.dtype):
            # The caller passes a float8 / bfloat16 array (and the entry checks that); the
            # body reads and writes its bits through an unsigned view of the same data,
            # declared after the parameters (TVM wants those first).
            out[bid] = T.decl_buffer(arg.shape, storage, data=arg.data,
                                     align=align or dtypes.nbytes(lower.buffers[bid].dtype))
    return out


def scan_acc_dtype(dtype: int | str) -> str:
    """The TVM dtype of T.cumsum's running sum over `dtype`, as every backend sums: float32 for
    16- and 8-bit floats (each output rounded once), else the dtype itself."""
    dt = tvm_dtype(dtype)
    return "float32" if dt in ("float16", "bfloat16") or dt in FP8_DTYPES else dt


def saturating_abs(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """|x| in x's dtype, saturating for signed integers: the most negative value, whose
    negation does not fit, counts as the largest positive one (no signed overflow). bfloat16
    goes through float32, where |x| is exact (TVM has no abs of it)."""
    dt = str(x.ty)
    if dt.startswith("uint"):
        return x
    if dt.startswith("int"):
        zero, floor = tirx.const(0, dt), tirx.const(-tirx.max_value(dt).value, dt)
        return tirx.Select(x < zero, zero - tirx.Max(x, floor), x)
    if dt not in ("float16", "float32", "float64"):
        return tirx.Cast(dt, tirx.abs(tirx.Cast("float32", x)))
    return tirx.abs(x)


def source_name(b: pb.Buffer, buf: tirx.Buffer) -> tirx.Buffer:
    """`buf` (a TIR allocation of Tile IR buffer `b`) named as the author named `b`, so the
    generated source reads `acc_o[...]`; a name the C code cannot take keeps TVM's."""
    if b.name and c_name_problem(b.name) is None:
        IRBuilder.name(b.name, buf)
    return buf


def static_shape(buf: pb.Buffer) -> list[int]:
    return [d.size for d in buf.shape]


def global_extent(lower: ExprLowering, buf: pb.Buffer, dim: int) -> tirx.PrimExpr:
    d = buf.shape[dim]
    return lower.vars[d.var] if d.WhichOneof("kind") == "var" else tirx.const(d.size, "int32")


def grid_exprs(program: Program, lower: ExprLowering) -> list[tirx.PrimExpr]:
    return [lower.expr(g) for g in program.proto.kernel.grid]


def build_module(func: tirx.PrimFunc, name: str) -> tvm.IRModule:
    return tvm.IRModule({name: func})


def and_all(conds):
    out = None
    for c in conds:
        if c is None:
            continue
        out = c if out is None else tirx.And(out, c)
    return out


def unravel_dyn(flat, extents):
    out = []
    for e in reversed(extents):
        out.append(tirx.floormod(flat, e))
        flat = tirx.floordiv(flat, e)
    return list(reversed(out))
