"""Two 16-bit fragment slots stored as one 32-bit pair, where the program computes both from
the two halves of one 32-bit value.

A dequantizing kernel unpacks 4-bit weights two at a time with one integer instruction: the
nibbles at bits 0 and 16 of `w & 0x000F000F`, or-ed with 0x64006400, read as the float16
pair (1024 + q0, 1024 + q1). Written element by element, as a T.Parallel nest over the
fragment must be,

    t = ((word >> 4 * e) & 0x000F000F) | 0x64006400
    ws[n, k] = T.reinterpret("float16", T.cast(t >> 16 * (k % 2), "int16")) - 1032.0

the two slots of a register pair (wgmma's operands and accumulators keep slots 2r and 2r + 1
side by side in one 32-bit register) are two expressions that differ only in which half of
`t` they cast: `cast(int16, t)` and `cast(int16, t >> 16)`. nvcc narrows each to its 16
bits before it sees that they are the halves of one value, then packs them again (two
masks, two ors, a shift and a PRMT a pair where one LOP3 does). Here, when both slots'
lowered values have that shape, with the same tree above the two casts (elementwise
reinterprets and arithmetic whose other operands are the same in both slots), the pair is
stored as one two-lane value: the casts become `reinterpret(int16x2, t)` and everything
above them runs on both lanes (HADD2 / HFMA2), so the pair costs one LOP3 and one HADD2.

`fuse(a, b)` decides from the lowered TIR of the two slots; `lower_halves` lowers a nest
whose body is one store to the anchor's fragment that way, or declines (returns False)
before it has emitted anything.
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir import Range
from tvm.ir.expr import Call
from tvm.ir.prim import expr as E
from tvm.script.ir_builder import tirx as T
from tvm.sym import Analyzer
from tvm_ffi import structural_equal

from tiled.compiler.passes.stmts import is_identity
from tiled.ir import dtypes
from tiled.ir.walk import element_accesses, subexprs
from tiled.v1 import tile_ir_pb2 as pb

_HALVES = {"int16": "int16x2", "uint16": "uint16x2"}
_HALF_INTS = {pb.INT16, pb.UINT16}
_ARITH = (E.Add, E.Sub, E.Mul)
MAX_SLOTS = 256  # pairs are lowered one statement each (unrolled); larger fragments are not


def _dtype(e) -> str:
    return str(e.ty)


def _int(e) -> int | None:
    """The value of a constant shift amount: an integer, or the lowering's `c & 31` of one
    (shift amounts are masked to the word, and TVM's simplifier keeps the mask)."""
    if isinstance(e, E.IntImm):
        return e.value
    if isinstance(e, E.BitwiseAnd):
        a, b = _int(e.a), _int(e.b)
        return None if a is None or b is None else a & b
    return None


def _shifted(e) -> tuple:
    """(x, s) for `e` = x >> s with s constant; (e, 0) otherwise."""
    if isinstance(e, E.RShift):
        s = _int(e.b)
        if s is not None:
            return e.a, s
    return e, 0


def _halves(a, b):
    """reinterpret(int16x2, t) when a = cast(int16, t) and b = cast(int16, t >> 16) with t a
    32-bit integer (the low half, then the high one: lane order is memory order)."""
    if not (isinstance(a, E.Cast) and isinstance(b, E.Cast)):
        return None
    dt = _dtype(a)
    if dt not in _HALVES or _dtype(b) != dt or _dtype(a.value) not in ("int32", "uint32") or \
            _dtype(b.value) != _dtype(a.value):
        return None
    (lo, s0), (hi, s1) = _shifted(a.value), _shifted(b.value)
    if s0 != 0 or s1 != 16 or not structural_equal(lo, hi):
        return None
    return tirx.reinterpret(_HALVES[dt], lo)


def _lanes(dt: str) -> str:
    return f"{dt}x2"


def fuse(a, b):
    """The two-lane expression whose lanes are `a` and `b`, or None where the pair has no
    shared 32-bit value to start from (two lanes that merely compute alike gain nothing)."""
    fused = _fuse(a, b)
    return None if fused is None or isinstance(fused, E.Broadcast) else fused


def _fuse(a, b):
    if structural_equal(a, b):
        return tirx.Broadcast(a, 2)
    halves = _halves(a, b)
    if halves is not None:
        return halves
    if isinstance(a, Call) and isinstance(b, Call) and a.op.name == "tirx.reinterpret" \
            and b.op.name == "tirx.reinterpret" and _dtype(a) == _dtype(b):
        inner = _fuse(a.args[0], b.args[0])
        if inner is None or isinstance(inner, E.Broadcast):
            return None
        if isinstance(inner, Call) and inner.op.name == "tirx.reinterpret":  # of the word
            inner = inner.args[0]
        return tirx.reinterpret(_lanes(_dtype(a)), inner)
    if type(a) is type(b) and isinstance(a, _ARITH) and _dtype(a) == _dtype(b):
        x, y = _fuse(a.a, b.a), _fuse(a.b, b.b)
        if x is None or y is None or (isinstance(x, E.Broadcast) and isinstance(y, E.Broadcast)):
            return None
        return type(a)(x, y)
    return None


def lower_halves(low, anchor, body: pb.Stmt, loop_vars: list[int], ident: list) -> bool:
    """Lowers the nest as register pairs (module docstring) and returns True, or returns
    False having emitted nothing: the body is not one store of a 16-bit value to the anchor's
    fragment at the nest's own element, reading nothing of that fragment; the anchor has an
    odd or large slot count or slots it masks; or some pair is not two halves of one value."""
    st = body
    while st.WhichOneof("kind") == "seq" and len(st.seq.stmts) == 1:
        st = st.seq.stmts[0]
    if st.WhichOneof("kind") != "store":
        return False
    store = st.store
    bid = store.buffer
    if bid not in ident or not is_identity(list(store.indices), loop_vars) or \
            dtypes.nbytes(low.buffers[bid].dtype) != 2:
        return False
    if any(b == bid for b, _ in element_accesses(store.value)):
        return False
    if not any(e.WhichOneof("kind") == "cast" and e.dtype in _HALF_INTS
               for e in subexprs(store.value)):
        return False  # no 16-bit half of anything: nothing to fuse (and nothing evaluated)
    size = anchor.local_size
    if size % 2 or size > MAX_SLOTS:
        return False
    ana = Analyzer()
    if isinstance(low.tx, tirx.Var):
        ana.bind(low.tx, Range(0, low.threads))
    outer = low.nest_vars
    fused = []
    try:  # the nest's context as parallel.lower_parallel sets it for one slot
        low.nest_vars = loop_vars
        low.replica = anchor.leader(low.tx) if hasattr(anchor, "leader") else None
        for r in range(size // 2):
            lanes = []
            for slot in (2 * r, 2 * r + 1):
                idx = tirx.const(slot, "int32")
                coords, valid = anchor.coords(low.tx, idx)
                if valid is not None:
                    return False
                for v, c in zip(loop_vars, coords, strict=True):
                    low.vars[v] = c
                low.frag_bind = {b: idx for b in ident}
                low.frag_row = (anchor, idx) if hasattr(anchor, "row_slot") else None
                low.nest_slot = (anchor, idx)
                lanes.append(ana.simplify(low.expr(store.value)))
            pair = fuse(*lanes)
            if pair is None:
                return False
            fused.append(pair)
    finally:
        low.frag_bind, low.nest_vars, low.frag_row = {}, outer, None
        low.replica, low.nest_slot = None, None
    buf = low.tir[bid]
    for r, pair in enumerate(fused):
        if str(pair.ty) != f"{buf.dtype}x2":  # as CudaLowering.store casts a scalar
            pair = tirx.Cast(f"{buf.dtype}x2", pair)
        T.buffer_store(buf, pair, [tirx.Ramp(tirx.const(2 * r, "int32"), 1, 2)])
    return True
