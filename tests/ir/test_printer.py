"""The text view: readable, stable, and total (it prints anything that decodes)."""

from __future__ import annotations

import textwrap

import pytest

from tiled.ir import Program
from tiled.ir.printer import format_program
from tiled.v1 import tile_ir_pb2 as pb

from . import programs as P
from .programs import F32, I32, add, binary, const, mul, node, var

GEMM_TEXT = textwrap.dedent("""\
    kernel gemm(A: Tensor[(M, 1024), float16], B: Tensor[(1024, 1024), float16], \
C: Tensor[(M, 1024), float16]):
      with Kernel(ceildiv(1024, 128), ceildiv(M, 128), threads=128) as (bx, by):
        A_shared = alloc_shared((128, 32), float16)
        B_shared = alloc_shared((32, 128), float16)
        C_local = alloc_fragment((128, 128), float32)
        clear(C_local)
        for k in Pipelined(ceildiv(1024, 32), num_stages=3):
          copy(A[by * 128 : +128, k * 32 : +32], A_shared)
          copy(B[k * 32 : +32, bx * 128 : +128], B_shared)
          gemm(A_shared, B_shared, C_local)
        copy(C_local, C[by * 128 : +128, bx * 128 : +128])""")


def test_gemm_text():
    assert format_program(Program(P.gemm())) == GEMM_TEXT
    assert str(Program(P.gemm())) == GEMM_TEXT


@pytest.mark.parametrize(("name", "lines"), [
    ("elementwise", ["kernel scale_exp(X: Tensor[(M,), float32], Y: Tensor[(M,), float16]):",
                     "  with Kernel(ceildiv(M, 1024), threads=256) as bx:",
                     "    for i in Parallel(1024):",
                     "      if bx * 1024 + i < M:",
                     "        Y[bx * 1024 + i] = float16(exp(X[bx * 1024 + i]) * 2.0)"]),
    ("softmax", ["    row_max = alloc_fragment((16,), float32)",
                 "    reduce_max(X_frag, row_max, dim=1, clear=True)",
                 "        X_frag[i, j] = exp(X_frag[i, j] - row_max[i])",
                 "        X_frag[i2, j2] = select(row_sum[i2] > 0.0, X_frag[i2, j2] / row_sum[i2],"
                 " 0.0)",
                 "    copy(X_frag, Y[bx * 16 : +16, 0 : +128])"]),
    ("scaled_sum", ["alpha: float32, n: int32):",
                    "    scratch = alloc_local((4,), float32)",
                    "        atomic_add(partial[0], X[bx * 128 + i] * alpha)",
                    "      else:",
                    "        for u in unroll(4):",
                    "    for t in Parallel(1):"]),
])
def test_sample_text(name, lines):
    text = format_program(Program(P.SAMPLES[name]()))
    for line in lines:
        assert line in text, f"{line!r} not in\n{text}"
    assert text == format_program(Program(P.SAMPLES[name]()))


def _value_text(expr: pb.Expr) -> str:
    p = P.gemm()
    node(p, "kernel.body.seq.stmts[0]").CopyFrom(P.store(105, [const(0), const(0)], expr))
    return format_program(Program(p)).splitlines()[5].strip().removeprefix("C_local[0, 0] = ")


A, B, C = var(1), var(2), var(3)  # M, bx, by


@pytest.mark.parametrize(("expr", "text"), [
    (mul(add(A, B), C), "(M + bx) * by"),
    (add(A, mul(B, C)), "M + bx * by"),
    (binary(pb.SUB, A, binary(pb.SUB, B, C)), "M - (bx - by)"),
    (binary(pb.SUB, binary(pb.SUB, A, B), C), "M - bx - by"),
    (binary(pb.FLOOR_MOD, binary(pb.FLOOR_DIV, A, const(4)), const(2)), "M // 4 % 2"),
    (binary(pb.MIN, A, const(-1)), "min(M, -1)"),
    (binary(pb.AND, binary(pb.LT, A, B), binary(pb.GE, B, C)), "M < bx and bx >= by"),
    (binary(pb.EQ, binary(pb.LT, A, B), binary(pb.LT, B, C)), "(M < bx) == (bx < by)"),
    (binary(pb.BIT_XOR, binary(pb.SHL, A, const(1)), B), "M << 1 ^ bx"),
    (binary(pb.SHL, A, binary(pb.BIT_AND, B, const(7))), "M << (bx & 7)"),
    (pb.Expr(dtype=pb.INT64, int_value=5), "int64(5)"),
    (pb.Expr(dtype=pb.BOOL, int_value=1), "True"),
    (const(float("inf"), F32), "inf"),
    (const(-0.5, pb.FLOAT16), "float16(-0.5)"),
    (pb.Expr(dtype=F32, cast=pb.Cast(value=A)), "float32(M)"),
    (P.call(pb.POW, const(2.0, F32), const(3.0, F32)), "pow(2.0, 3.0)"),
    (P.ceildiv(A, 64), "ceildiv(M, 64)"),
    (pb.Expr(dtype=I32, var=77), "?"),
    (pb.Expr(dtype=I32, binary=pb.Binary(op=99, a=A, b=B)), "M ? bx"),
    (pb.Expr(dtype=I32, call=pb.Call(op=99, args=[A])), "?(M)"),
    (pb.Expr(dtype=I32, load=pb.Load(buffer=999, indices=[A])), "?[M]"),
    (pb.Expr(), "?"),
])
def test_expression_text(expr, text):
    assert _value_text(expr) == text


def test_names_fall_back_to_ids():
    p = P.gemm()
    p.vars[1].name = "by"  # bx now shares a name with by: neither is used
    p.buffers[3].name = "not an identifier"
    p.buffers[4].name = ""
    text = format_program(Program(p))
    assert "as (v2, v3):" in text
    assert "b103 = alloc_shared((128, 32), float16)" in text
    assert "copy(A[v3 * 128 : +128, k * 32 : +32], b103)" in text
    assert "gemm(b103, b104, C_local)" in text


def test_prints_unverified_programs():
    assert format_program(Program(pb.Program())) == "kernel ():\n  pass  # no kernel"
    p = P.gemm()
    node(p, "kernel.body.seq.stmts[1].for_").ClearField("body")
    node(p, "kernel.body.seq.stmts[1].for_").kind = 42
    node(p, "kernel.body.seq.stmts[2]").ClearField("kind")
    p.kernel.block_vars.append(99)
    p.params.add(name="ghost", buffer=12345)
    p.params.add(name="nothing")
    text = format_program(Program(p))
    assert "for k in ?(ceildiv(1024, 32), num_stages=3):\n      pass  # no body" in text
    assert "pass  # empty statement" in text
    assert "as (bx, by, ?):" in text
    assert "ghost: ?, nothing: ?" in text


def test_deep_nesting_prints_ellipsis():
    p = P.gemm()
    e = node(p, "kernel.body.seq.stmts[0].fill.value")
    for _ in range(3000):
        e.dtype = F32
        e.binary.op = pb.ADD
        e.binary.a.CopyFrom(const(1.0, F32))
        e = e.binary.b
    stmt = p.kernel.body.seq.stmts.add()
    for _ in range(3000):
        stmt = stmt.seq.stmts.add()
    text = format_program(Program(p))
    assert "..." in text
    assert text.startswith("kernel gemm(")


def test_regions_show_offsets_and_extents():
    p = P.gemm()
    node(p, "kernel.body.seq.stmts[1].for_.body.seq.stmts[0].copy.dst.offsets[1]").int_value = 4
    node(p, "kernel.body.seq.stmts[0].fill.value").float_value = 1.5
    text = format_program(Program(p))
    assert "copy(A[by * 128 : +128, k * 32 : +32], A_shared[0 : +128, 4 : +32])" in text
    assert "fill(C_local, 1.5)" in text
    node(p, "kernel.body.seq.stmts[0].fill.dst").extents.pop()
    assert "fill(C_local[0 : +128, 0 : +?], 1.5)" in format_program(Program(p))


def test_flags_and_reduce():
    p = P.gemm()
    g = node(p, "kernel.body.seq.stmts[1].for_.body.seq.stmts[2].gemm")
    g.transpose_b = g.clear_accum = True
    assert "gemm(A_shared, B_shared, C_local, transpose_b=True, clear_accum=True)" in \
        format_program(Program(p))
    node(p, "kernel.body.seq.stmts[1].for_").kind = pb.SERIAL
    assert "for k in range(ceildiv(1024, 32), num_stages=3):" in format_program(Program(p))
    q = P.softmax()
    node(q, "kernel.body.seq.stmts[1].reduce").kind = 0
    assert "reduce_?(X_frag, row_max, dim=1, clear=True)" in format_program(Program(q))
