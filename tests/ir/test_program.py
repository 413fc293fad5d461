"""Program round trips and the digest: stable across processes, blind to spelling (names, ids,
locations, sequence nesting), sensitive to meaning (tile sizes, constants, loop extents)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tiled.errors import IRDecodeError
from tiled.ir import Program, verify_program
from tiled.ir.program import MAX_PROGRAM_BYTES
from tiled.v1 import tile_ir_pb2 as pb

from . import programs as P
from .programs import node

REPO = Path(__file__).resolve().parents[2]
GEMM_LOOP = "kernel.body.seq.stmts[1].for_"


def digest(p: pb.Program) -> str:
    return Program(p).digest


@pytest.mark.parametrize("name", sorted(P.SAMPLES))
def test_round_trip(name):
    program = Program(P.SAMPLES[name]())
    data = program.to_bytes()
    again = Program.from_bytes(data)
    assert again == program
    assert again.to_bytes() == data
    assert hash(again) == hash(program)
    assert again.digest == program.digest
    assert Program.from_bytes(bytearray(data)) == program
    assert Program.from_bytes(memoryview(data)) == program


def test_from_bytes_rejects():
    data = Program(P.gemm()).to_bytes()
    with pytest.raises(IRDecodeError, match="not a Tile IR program"):
        Program.from_bytes(data[:-3] + b"\xff\xff\xff")
    old = P.gemm()
    old.schema_version = 7
    with pytest.raises(IRDecodeError, match="schema version 7"):
        Program.from_bytes(Program(old).to_bytes())
    with pytest.raises(IRDecodeError, match="expected bytes"):
        Program.from_bytes("text")  # type: ignore[arg-type]
    with pytest.raises(IRDecodeError, match="the limit is"):
        Program.from_bytes(b"\0" * (MAX_PROGRAM_BYTES + 1))


def test_digest_is_stable_across_processes():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import programs; "
            "from tiled.ir import Program; "
            "print(' '.join(Program(f()).digest for _, f in sorted(programs.SAMPLES.items())))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], cwd=REPO,
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [digest(f()) for _, f in sorted(P.SAMPLES.items())]
    assert len(set(out)) == len(out)


# -- spelling does not change the digest ---------------------------------------------------------

_VAR_REFS = {("Expr", "var"), ("Dim", "var"), ("For", "var"), ("Param", "scalar"),
             ("Kernel", "block_vars"), ("Var", "id")}
_BUF_REFS = {("Load", "buffer"), ("Region", "buffer"), ("Store", "buffer"),
             ("AtomicAdd", "buffer"), ("Param", "buffer"), ("Gemm", "a"), ("Gemm", "b"),
             ("Gemm", "c"), ("Reduce", "src"), ("Reduce", "dst"), ("Buffer", "id")}


def _remap(msg, var_map: dict, buf_map: dict) -> None:
    """Rewrites every var and buffer id in place (an independent walker, not canonical's)."""
    kind = msg.DESCRIPTOR.name
    for field, value in msg.ListFields():
        key = (kind, field.name)
        table = var_map if key in _VAR_REFS else buf_map if key in _BUF_REFS else None
        if table is not None:
            if field.is_repeated:
                value[:] = [table[v] for v in value]
            else:
                setattr(msg, field.name, table[value])
        elif field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _remap(item, var_map, buf_map)


def _messages(msg):
    yield msg
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                yield from _messages(item)


@pytest.mark.parametrize("name", sorted(P.SAMPLES))
@pytest.mark.parametrize("seed", range(3))
def test_digest_ignores_ids_names_and_table_order(name, seed):
    rng = random.Random(seed)
    p = P.SAMPLES[name]()
    var_ids = [v.id for v in p.vars]
    buf_ids = [b.id for b in p.buffers]
    var_map = dict(zip(var_ids, rng.sample(range(1000, 2000), len(var_ids)), strict=True))
    buf_map = dict(zip(buf_ids, rng.sample(range(5000), len(buf_ids)), strict=True))
    q = pb.Program()
    q.CopyFrom(p)
    _remap(q, var_map, buf_map)
    for v in q.vars:
        v.name = f"renamed_{v.name}"
    for b in q.buffers:
        b.name = f"{b.name}_x"
    order = rng.sample(range(len(q.vars)), len(q.vars))
    shuffled = [q.vars[i] for i in order]
    q.ClearField("vars")
    q.vars.extend(shuffled)
    order = rng.sample(range(len(q.buffers)), len(q.buffers))
    shuffled_b = [q.buffers[i] for i in order]
    q.ClearField("buffers")
    q.buffers.extend(shuffled_b)
    verify_program(Program(q))
    assert q != p
    assert digest(q) == digest(p)


@pytest.mark.parametrize("name", sorted(P.SAMPLES))
def test_digest_ignores_locations(name):
    p = P.SAMPLES[name]()
    q = pb.Program()
    q.CopyFrom(p)
    for m in _messages(q):
        if m.DESCRIPTOR.name == "Location":
            m.file, m.line, m.column = "elsewhere.py", m.line + 100, 1
    assert digest(q) == digest(p)
    for m in _messages(q):
        if m.DESCRIPTOR.name in ("Stmt", "Kernel"):
            m.ClearField("loc")
    assert digest(q) == digest(p)


@pytest.mark.parametrize("path", ["kernel.body", "kernel.body.seq.stmts[0]", GEMM_LOOP + ".body",
                                  GEMM_LOOP + ".body.seq.stmts[2]"])
def test_digest_ignores_sequence_wrapping(path):
    p = P.gemm()
    q = pb.Program()
    q.CopyFrom(p)
    stmt = node(q, path)
    inner = pb.Stmt()
    inner.CopyFrom(stmt)
    stmt.ClearField("kind")
    stmt.seq.stmts.append(inner)
    verify_program(Program(q))
    assert digest(q) == digest(p)
    # Nested sequences flatten too: [a, [b, c]] is [a, b, c].
    r = P.gemm()
    loop_body = node(r, GEMM_LOOP + ".body.seq")
    tail = [pb.Stmt() for _ in range(2)]
    for t, s in zip(tail, loop_body.stmts[1:], strict=True):
        t.CopyFrom(s)
    del loop_body.stmts[1:]
    loop_body.stmts.add().seq.stmts.extend(tail)
    assert digest(r) == digest(p)


# -- meaning changes the digest ------------------------------------------------------------------

def _set(path: str, field: str, value):
    return lambda p: setattr(node(p, path), field, value)


SEMANTIC_EDITS = {
    "shared_shape": _set("buffers[3].shape[1]", "size", 64),
    "fragment_dtype": _set("buffers[5]", "dtype", pb.FLOAT16),
    "region_extent": lambda p: node(p, GEMM_LOOP + ".body.seq.stmts[0].copy.src").extents
    .__setitem__(1, 16),
    "loop_extent": _set(GEMM_LOOP + ".extent.binary.b", "int_value", 64),
    "num_stages": _set(GEMM_LOOP, "num_stages", 2),
    "loop_kind": _set(GEMM_LOOP, "kind", pb.SERIAL),
    "fill_constant": _set("kernel.body.seq.stmts[0].fill.value", "float_value", 1.0),
    "offset_constant": _set(GEMM_LOOP + ".body.seq.stmts[0].copy.src.offsets[0].binary.b",
                            "int_value", 64),
    "threads": _set("kernel", "threads", 256),
    "transpose": _set(GEMM_LOOP + ".body.seq.stmts[2].gemm", "transpose_b", True),
    "param_name": _set("params[0]", "name", "X"),
    "kernel_name": _set("", "name", "gemm2"),
    "swap_operands": lambda p: (setattr(node(p, GEMM_LOOP + ".body.seq.stmts[2].gemm"), "a",
                                        104),
                                setattr(node(p, GEMM_LOOP + ".body.seq.stmts[2].gemm"), "b",
                                        103)),
    "stmt_order": lambda p: node(p, GEMM_LOOP + ".body.seq.stmts").reverse(),
}


@pytest.mark.parametrize("edit", list(SEMANTIC_EDITS.values()), ids=list(SEMANTIC_EDITS))
def test_digest_changes_with_meaning(edit):
    p = P.gemm()
    q = P.gemm()
    edit(q)
    assert q != p
    assert digest(q) != digest(p)


def test_digest_changes_with_tile_sizes():
    digests = {digest(P.gemm(block_m=m, block_n=n, block_k=k, stages=s))
               for m, n, k, s in [(128, 128, 32, 3), (64, 128, 32, 3), (128, 64, 32, 3),
                                  (128, 128, 64, 3), (128, 128, 32, 2)]}
    assert len(digests) == 5


def test_canonical_form_is_valid_and_idempotent():
    for make in P.SAMPLES.values():
        program = Program(make())
        canon = program.canonical()
        verify_program(canon)
        assert canon.canonical() == canon
        assert canon.digest == program.digest
        assert all(v.name == "" for v in canon.proto.vars)
