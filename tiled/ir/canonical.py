"""Canonical form and digest of a program.

Canonicalization keeps meaning and drops spelling: variables and buffers are renumbered in order
of first appearance (parameters first, then the kernel in field order), their names and all
source locations are cleared, and nested or single-statement sequences are flattened. Parameter
names and the kernel's name stay: they are its interface (the manifest and the symbol).
The digest is the sha256 of the deterministic encoding of that form, under a domain prefix.
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import Message

from tiled.ir.program import Program
from tiled.v1 import tile_ir_pb2 as pb

DIGEST_DOMAIN = b"tiled.ir.v1\0"

# (message type, field) pairs that refer to a variable or a buffer by id.
_VAR_FIELDS = {("Expr", "var"), ("Dim", "var"), ("For", "var"), ("Param", "scalar"),
               ("Kernel", "block_vars")}
_BUFFER_FIELDS = {("Load", "buffer"), ("Region", "buffer"), ("Store", "buffer"),
                  ("AtomicAdd", "buffer"), ("Param", "buffer"), ("Gemm", "a"), ("Gemm", "b"),
                  ("Gemm", "c"), ("Reduce", "src"), ("Reduce", "dst"), ("Scan", "src"),
                  ("Scan", "dst"), ("BarrierRef", "barrier")}


class _Renumber:
    def __init__(self, program: pb.Program):
        self.var_map: dict[int, int] = {}
        self.buf_map: dict[int, int] = {}
        self.buffers = {b.id: b for b in program.buffers}

    def var(self, old: int) -> int:
        return self.var_map.setdefault(old, len(self.var_map))

    def buffer(self, old: int) -> int:
        if old not in self.buf_map:
            self.buf_map[old] = len(self.buf_map)
            # A buffer's symbolic dims are numbered where the buffer first appears.
            if old in self.buffers:
                for d in self.buffers[old].shape:
                    if d.WhichOneof("kind") == "var":
                        self.var(d.var)
        return self.buf_map[old]

    def walk(self, msg: Message) -> None:
        kind = msg.DESCRIPTOR.name
        for field, value in msg.ListFields():
            key = (kind, field.name)
            if key in _VAR_FIELDS:
                if field.is_repeated:
                    value[:] = [self.var(v) for v in value]
                else:
                    setattr(msg, field.name, self.var(value))
            elif key in _BUFFER_FIELDS:
                setattr(msg, field.name, self.buffer(value))
            elif field.type == field.TYPE_MESSAGE:
                if field.is_repeated:
                    for item in value:
                        self.walk(item)
                else:
                    self.walk(value)


def _flatten(stmt: pb.Stmt) -> None:
    """Flattens nested sequences in place and unwraps a one-statement sequence."""
    kind = stmt.WhichOneof("kind")
    if kind == "seq":
        flat: list[pb.Stmt] = []
        for s in stmt.seq.stmts:
            _flatten(s)
            if s.WhichOneof("kind") == "seq":
                flat.extend(s.seq.stmts)
            else:
                flat.append(s)
        if len(flat) == 1:
            stmt.CopyFrom(flat[0])
        else:
            del stmt.seq.stmts[:]
            stmt.seq.stmts.extend(flat)
    elif kind == "for_":
        _flatten(stmt.for_.body)
    elif kind == "warp_group":
        _flatten(stmt.warp_group.body)
    elif kind == "if_then_else":
        _flatten(stmt.if_then_else.then_body)
        if stmt.if_then_else.HasField("else_body"):
            _flatten(stmt.if_then_else.else_body)
            # An empty `else` means no `else`.
            els = stmt.if_then_else.else_body
            if els.WhichOneof("kind") is None or (els.WhichOneof("kind") == "seq"
                                                  and not els.seq.stmts):
                stmt.if_then_else.ClearField("else_body")


def _clear_locations(msg: Message) -> None:
    for field, value in msg.ListFields():
        if field.name == "loc" and field.type == field.TYPE_MESSAGE:
            msg.ClearField("loc")
        elif field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _clear_locations(item)


def canonicalize(program: Program) -> Program:
    """Returns a new program in canonical form; `program` is not modified. Expects a program
    that passed `verify` (ids that resolve)."""
    src = program.proto
    out = pb.Program()
    out.CopyFrom(src)
    if out.kernel.HasField("body"):
        _flatten(out.kernel.body)
    _clear_locations(out)
    r = _Renumber(src)
    for p in out.params:
        r.walk(p)
    r.walk(out.kernel)
    # Buffer shapes may name vars (symbolic dims of allocations); renumber them too.
    new_buffers = []
    for b in sorted(src.buffers, key=lambda b: r.buffer(b.id)):
        nb = pb.Buffer()
        nb.CopyFrom(b)
        nb.id = r.buffer(b.id)
        nb.name = ""
        nb.ClearField("loc")
        for d in nb.shape:
            if d.WhichOneof("kind") == "var":
                d.var = r.var(d.var)
        new_buffers.append(nb)
    new_vars = []
    for v in sorted(src.vars, key=lambda v: r.var(v.id)):
        nv = pb.Var(id=r.var(v.id), dtype=v.dtype)
        new_vars.append(nv)
    del out.buffers[:]
    out.buffers.extend(new_buffers)
    del out.vars[:]
    out.vars.extend(new_vars)
    return Program(out)


def program_digest(program: Program) -> str:
    data = canonicalize(program).to_bytes()
    return hashlib.sha256(DIGEST_DOMAIN + data).hexdigest()
