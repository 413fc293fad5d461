"""Robustness: whatever bytes arrive, decoding and verifying raise only IRDecodeError or
VerifyError (with a message and a path), the printer never raises, and a program that verifies
has a digest and a canonical form that verifies too."""

from __future__ import annotations

import re

from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiled.errors import IRDecodeError, VerifyError
from tiled.ir import Limits, Program, verify_program
from tiled.ir.printer import format_program
from tiled.v1 import tile_ir_pb2 as pb

from . import programs as P
from .programs import node

settings.register_profile(
    "tiled-ir-fuzz", deadline=None, database=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ = settings.get_profile("tiled-ir-fuzz")
SAMPLE_BYTES = [Program(make()).to_bytes() for _, make in sorted(P.SAMPLES.items())]


def check_program(program: Program) -> None:
    try:
        verify_program(program)
    except VerifyError as e:
        assert e.message, e
        assert e.path or e.loc, e
        node(program.proto, e.path)  # the path names a field of this very program
        assert str(e)
    else:
        canon = program.canonical()
        verify_program(canon)
        assert len(program.digest) == 64
        assert canon.digest == program.digest
    assert format_program(program).startswith("kernel ")


def check_bytes(data: bytes) -> None:
    try:
        program = Program.from_bytes(data)
    except IRDecodeError as e:
        assert str(e)
        return
    check_program(program)


@settings(FUZZ, max_examples=3000)
@given(st.binary(max_size=300))
def test_random_bytes(data):
    check_bytes(data)


@settings(FUZZ, max_examples=1000)
@given(st.sampled_from(SAMPLE_BYTES), st.data())
def test_truncated_and_flipped_bytes(sample, data):
    raw = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[pos] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del raw[pos:]
        elif op == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw:
            del raw[pos:pos + data.draw(st.integers(1, 8))]
    check_bytes(bytes(raw))


# -- structural mutations of valid programs -------------------------------------------------------

_INTS = {
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
}


def _slots(msg, out):
    """Every (message, field) in the tree, set or not, so a mutation may also add fields."""
    for field in msg.DESCRIPTOR.fields:
        out.append((msg, field))
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _slots(item, out)
    return out


def _scalar(data, field):
    t = field.type
    if t == field.TYPE_BOOL:
        return data.draw(st.booleans())
    if t == field.TYPE_STRING:
        return data.draw(st.one_of(st.sampled_from(["", "x", "A", "M", "1a", "a b"]),
                                   st.text(st.characters(codec="utf-8"), max_size=6)))
    if t == field.TYPE_DOUBLE:
        return data.draw(st.floats(allow_nan=True, allow_infinity=True))
    if t == field.TYPE_ENUM:
        return data.draw(st.integers(-3, 25))
    lo, hi = _INTS[t]
    small = st.integers(max(lo, -4), 300)  # near the ids and sizes the samples use
    return data.draw(st.one_of(small, st.sampled_from([lo, hi, 0, 1, 100, 101, 128]),
                               st.integers(lo, hi)))


def _mutate(program: pb.Program, data) -> None:
    msg, field = data.draw(st.sampled_from(_slots(program, [])))
    if not field.is_repeated:
        if field.type == field.TYPE_MESSAGE:
            op = data.draw(st.sampled_from(["clear", "empty", "copy"]))
            if op == "clear":
                msg.ClearField(field.name)
            elif op == "empty":
                getattr(msg, field.name).SetInParent()
            else:  # graft another node of the same type: ids and shapes out of context
                same = [m for m, _ in _slots(program, [])
                        if m.DESCRIPTOR is field.message_type]
                if same:
                    donor = type(same[0])()
                    donor.CopyFrom(data.draw(st.sampled_from(same)))
                    getattr(msg, field.name).CopyFrom(donor)
        elif data.draw(st.booleans()) and field.has_presence:
            msg.ClearField(field.name)
        else:
            setattr(msg, field.name, _scalar(data, field))
        return
    items = getattr(msg, field.name)
    op = data.draw(st.sampled_from(["delete", "duplicate", "swap", "add"]))
    n = len(items)
    if op == "delete" and n:
        del items[data.draw(st.integers(0, n - 1))]
    elif op == "duplicate" and n:
        item = items[data.draw(st.integers(0, n - 1))]
        if field.type == field.TYPE_MESSAGE:
            items.add().CopyFrom(item)
        else:
            items.append(item)
    elif op == "swap" and n >= 2:
        i, j = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
        if field.type == field.TYPE_MESSAGE:
            a, b = type(items[i])(), type(items[j])()
            a.CopyFrom(items[i])
            b.CopyFrom(items[j])
            items[i].CopyFrom(b)
            items[j].CopyFrom(a)
        else:
            items[i], items[j] = items[j], items[i]
    elif field.type == field.TYPE_MESSAGE:
        items.add()
    else:
        items.append(_scalar(data, field))


@settings(FUZZ, max_examples=2500)
@given(st.sampled_from(sorted(P.SAMPLES)), st.data())
def test_mutated_programs(name, data):
    program = P.SAMPLES[name]()
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(program, data)
    check_program(Program(program))
    check_bytes(program.SerializeToString())


@settings(FUZZ, max_examples=500)
@given(st.sampled_from(sorted(P.SAMPLES)), st.data())
def test_mutated_programs_with_small_limits(name, data):
    """The same mutations under tight limits: the limit checks fire mid-walk."""
    program = P.SAMPLES[name]()
    _mutate(program, data)
    limits = Limits(max_nodes=data.draw(st.integers(1, 120)),
                    max_depth=data.draw(st.integers(1, 12)),
                    max_shared_bytes=data.draw(st.integers(0, 1 << 15)))
    try:
        verify_program(Program(program), limits)
    except VerifyError as e:
        assert e.message and (e.path or e.loc)
        node(program, e.path)


# -- the bounds check never rejects an access that stays in bounds --------------------------------

_INT_OPS = [pb.ADD, pb.SUB, pb.MUL, pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD, pb.MIN, pb.MAX,
            pb.SHL, pb.SHR, pb.BIT_AND, pb.BIT_OR, pb.BIT_XOR]
_CMP_OPS = [pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE]
_LEAVES = st.one_of(st.integers(-20, 40).map(lambda c: ("const", c)),
                    st.sampled_from([("var", 1), ("var", 2)]))


@st.composite
def _index(draw, depth: int = 3):
    """An int32 expression tree over i (var 1), j (var 2) and constants, as nested tuples."""
    kind = draw(st.sampled_from(["leaf", "bin", "bin", "neg", "select"])) if depth else "leaf"
    if kind == "leaf":
        return draw(_LEAVES)
    if kind == "bin":
        return ("bin", draw(st.sampled_from(_INT_OPS)), draw(_index(depth - 1)),
                draw(_index(depth - 1)))
    if kind == "neg":
        return ("neg", draw(_index(depth - 1)))
    return ("select", draw(_cond(depth - 1)), draw(_index(depth - 1)), draw(_index(depth - 1)))


@st.composite
def _cond(draw, depth: int = 2):
    kind = draw(st.sampled_from(["cmp", "cmp", "and", "or", "not"])) if depth else "cmp"
    if kind == "cmp":
        return ("cmp", draw(st.sampled_from(_CMP_OPS)), draw(_index(min(depth, 1))),
                draw(_index(min(depth, 1))))
    if kind == "not":
        return ("not", draw(_cond(depth - 1)))
    return (kind, draw(_cond(depth - 1)), draw(_cond(depth - 1)))


class _Undefined(Exception):
    """Division by zero, a shift out of range or a signed overflow: the program means nothing
    there."""


def _wrap(x: int) -> int:
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


def _eval(t, env, seen=None):
    if seen is not None:
        seen.add(id(t))
    tag = t[0]
    if tag == "const":
        return t[1]
    if tag == "var":
        return env[t[1]]
    if tag == "neg":
        return _wrap(-_eval(t[1], env, seen))
    if tag == "select":
        return _eval(t[2] if _eval(t[1], env, seen) else t[3], env, seen)
    if tag == "cmp":
        a, b = _eval(t[2], env, seen), _eval(t[3], env, seen)
        return {pb.EQ: a == b, pb.NE: a != b, pb.LT: a < b, pb.LE: a <= b, pb.GT: a > b,
                pb.GE: a >= b}[t[1]]
    if tag in ("and", "or"):
        a, b = _eval(t[1], env, seen), _eval(t[2], env, seen)
        return (a and b) if tag == "and" else (a or b)
    if tag == "not":
        return not _eval(t[1], env, seen)
    op, a, b = t[1], _eval(t[2], env, seen), _eval(t[3], env, seen)
    if op in (pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD) and b == 0:
        raise _Undefined
    if op in (pb.SHL, pb.SHR) and not 0 <= b < 32:
        raise _Undefined
    exact = {
        pb.ADD: lambda: a + b, pb.SUB: lambda: a - b, pb.MUL: lambda: a * b,
        pb.DIV: lambda: abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1),
        pb.FLOOR_DIV: lambda: a // b, pb.FLOOR_MOD: lambda: a % b, pb.MIN: lambda: min(a, b),
        pb.MAX: lambda: max(a, b), pb.SHL: lambda: a << b, pb.SHR: lambda: a >> b,
        pb.BIT_AND: lambda: a & b, pb.BIT_OR: lambda: a | b, pb.BIT_XOR: lambda: a ^ b,
    }[op]()
    if _wrap(exact) != exact:  # signed overflow
        raise _Undefined
    return exact


def _to_expr(t) -> pb.Expr:
    tag = t[0]
    if tag == "const":
        return P.const(t[1])
    if tag == "var":
        return P.var(t[1])
    if tag == "neg":
        return P.call(pb.NEG, _to_expr(t[1]))
    if tag == "select":
        return P.select(_to_expr(t[1]), _to_expr(t[2]), _to_expr(t[3]))
    if tag == "cmp":
        return P.binary(t[1], _to_expr(t[2]), _to_expr(t[3]))
    if tag in ("and", "or"):
        return P.binary(pb.AND if tag == "and" else pb.OR, _to_expr(t[1]), _to_expr(t[2]))
    if tag == "not":
        e = _to_expr(t[1])
        return pb.Expr(dtype=pb.BOOL, call=pb.Call(op=pb.NOT, args=[e]))
    return P.binary(t[1], _to_expr(t[2]), _to_expr(t[3]))


def _node_at(t, path: str):
    """The operator node of tree `t` that a verifier path inside its expression names
    (`.select.true_value.binary.b` -> the binary node under the select's true side)."""
    tokens = [x for x in path.split(".") if x]
    node = t
    for kind, child in zip(tokens[::2], [*tokens[1::2], None], strict=False):
        node = t
        if child is None or kind not in ("binary", "call", "select"):
            break
        if kind == "select":
            t = t[{"cond": 1, "true_value": 2, "false_value": 3}[child]]
        elif kind == "call":
            t = t[1]
        else:
            t = t[(1 if t[0] in ("and", "or") else 2) + (child == "b")]
        if t[0] in ("const", "var"):
            break
    return node


@settings(FUZZ, max_examples=1200)
@given(index=_index(), guard=st.one_of(st.none(), _cond()), n_i=st.integers(0, 9),
       n_j=st.integers(1, 9), extent=st.integers(1, 24), kind=st.sampled_from([pb.FRAGMENT,
                                                                               pb.GLOBAL]))
def test_bounds_check_is_sound(index, guard, n_i, n_j, extent, kind):
    """for i < n_i, j < n_j: [if guard:] S[index] = 0. Whenever the verifier calls an index
    out of bounds and the store runs at all, some iteration really is out of bounds, and for
    a GLOBAL S (whose accesses the compiler guards) every iteration is. A store that never
    runs may be rejected: its index would be out of bounds whenever it ran. A shift, a
    division or a signed overflow the verifier rejects is undefined on an iteration that
    evaluates it, or is never evaluated (its code would be undefined whenever it ran)."""
    b = P.Builder("bounds")
    i, j, bx = b.var("i"), b.var("j"), b.var("bx")
    s = b.tensor("S", [extent], P.F32) if kind == pb.GLOBAL else \
        b.buffer("S", [extent], P.F32, kind)
    st_ = P.store(s, [_to_expr(index)], P.const(0.0, P.F32))
    body = st_ if guard is None else P.if_(_to_expr(guard), st_)
    program = b.kernel([P.const(1)], [bx], 32, P.loop(i, n_i, P.loop(j, n_j, body)))
    reached, seen = [], set()  # seen: the nodes some iteration evaluates
    try:
        for vi in range(n_i):
            for vj in range(n_j):
                env = {i: vi, j: vj}
                if guard is None or _eval(guard, env, seen):
                    reached.append(_eval(index, env, seen))
    except _Undefined:
        return
    try:
        verify_program(Program(program))
    except VerifyError as e:
        if "out of bounds" not in e.message:  # an iteration that ran it raised _Undefined
            assert re.search("shift|division by zero|overflows", e.message), e
            tree, where = (guard, "if_then_else.cond") if "if_then_else.cond" in e.path else \
                (index, "store.indices[0]")
            assert id(_node_at(tree, e.path.split(where, 1)[1])) not in seen, e
            return
        outside = [not 0 <= x < extent for x in reached]
        assert not reached or (all(outside) if kind == pb.GLOBAL else any(outside)), \
            (e.message, reached)
