"""Hand-built valid Tile IR programs, as `pb.Program` messages, and the small builder that
makes them. Every function returns a fresh message, so tests may edit it freely."""

from __future__ import annotations

import re

from tiled.ir import SCHEMA_VERSION
from tiled.v1 import tile_ir_pb2 as pb

I32, F16, F32, BOOL = pb.INT32, pb.FLOAT16, pb.FLOAT32, pb.BOOL


# -- expressions -------------------------------------------------------------------------------

def const(value, dtype=I32) -> pb.Expr:
    if dtype in (pb.FLOAT16, pb.BFLOAT16, pb.FLOAT32, pb.FLOAT64):
        return pb.Expr(dtype=dtype, float_value=value)
    return pb.Expr(dtype=dtype, int_value=value)


def var(vid: int, dtype=I32) -> pb.Expr:
    return pb.Expr(dtype=dtype, var=vid)


def binary(op, a: pb.Expr, b: pb.Expr) -> pb.Expr:
    cmp = op in (pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE)
    return pb.Expr(dtype=BOOL if cmp else a.dtype, binary=pb.Binary(op=op, a=a, b=b))


def add(a, b):
    return binary(pb.ADD, a, b)


def mul(a, b):
    return binary(pb.MUL, a, b)


def ceildiv(a: pb.Expr, n: int) -> pb.Expr:
    return binary(pb.FLOOR_DIV, add(a, const(n - 1, a.dtype)), const(n, a.dtype))


def call(op, *args: pb.Expr) -> pb.Expr:
    return pb.Expr(dtype=args[0].dtype, call=pb.Call(op=op, args=args))


def cast(value: pb.Expr, dtype) -> pb.Expr:
    return pb.Expr(dtype=dtype, cast=pb.Cast(value=value))


def select(cond, t, f) -> pb.Expr:
    return pb.Expr(dtype=t.dtype, select=pb.Select(cond=cond, true_value=t, false_value=f))


def load(buf: int, dtype, *indices: pb.Expr) -> pb.Expr:
    return pb.Expr(dtype=dtype, load=pb.Load(buffer=buf, indices=indices))


# -- statements --------------------------------------------------------------------------------

def at(stmt: pb.Stmt, line: int, file: str = "kernels.py") -> pb.Stmt:
    stmt.loc.CopyFrom(pb.Location(file=file, line=line, column=5))
    return stmt


def seq(*stmts: pb.Stmt) -> pb.Stmt:
    return pb.Stmt(seq=pb.Seq(stmts=stmts))


def loop(vid: int, extent, body: pb.Stmt, kind=pb.SERIAL, stages: int = 0) -> pb.Stmt:
    extent = const(extent) if isinstance(extent, int) else extent
    return pb.Stmt(for_=pb.For(var=vid, extent=extent, kind=kind, num_stages=stages, body=body))


def region(buf: int, offsets, extents) -> pb.Region:
    offsets = [const(o) if isinstance(o, int) else o for o in offsets]
    return pb.Region(buffer=buf, offsets=offsets, extents=extents)


def copy(src: pb.Region, dst: pb.Region) -> pb.Stmt:
    return pb.Stmt(copy=pb.Copy(src=src, dst=dst))


def store(buf: int, indices, value: pb.Expr) -> pb.Stmt:
    return pb.Stmt(store=pb.Store(buffer=buf, indices=indices, value=value))


def if_(cond, then, otherwise=None) -> pb.Stmt:
    s = pb.IfThenElse(cond=cond, then_body=then)
    if otherwise is not None:
        s.else_body.CopyFrom(otherwise)
    return pb.Stmt(if_then_else=s)


class Builder:
    """Declares vars and buffers of one program; ids start at 1 (vars) and 100 (buffers) so a
    mix-up between the tables shows."""

    def __init__(self, name: str):
        self.p = pb.Program(schema_version=SCHEMA_VERSION, name=name)

    def var(self, name: str, dtype=I32) -> int:
        vid = len(self.p.vars) + 1
        self.p.vars.add(id=vid, name=name, dtype=dtype)
        return vid

    def buffer(self, name: str, shape, dtype, scope=pb.SHARED) -> int:
        bid = len(self.p.buffers) + 100
        dims = [pb.Dim(size=d) if isinstance(d, int) else pb.Dim(var=d[1]) for d in shape]
        self.p.buffers.add(id=bid, name=name, dtype=dtype, shape=dims, scope=scope)
        return bid

    def tensor(self, name: str, shape, dtype) -> int:
        """A GLOBAL tensor parameter; a symbolic dim is written ("sym", var_id)."""
        bid = self.buffer(name, shape, dtype, pb.GLOBAL)
        self.p.params.add(name=name, buffer=bid)
        return bid

    def scalar(self, name: str, dtype) -> int:
        vid = self.var(name, dtype)
        self.p.params.add(name=name, scalar=vid)
        return vid

    def kernel(self, grid, block_vars, threads: int, body: pb.Stmt, line: int = 1) -> pb.Program:
        k = self.p.kernel
        k.grid.extend(grid)
        k.block_vars.extend(block_vars)
        k.threads = threads
        k.body.CopyFrom(body)
        k.loc.CopyFrom(pb.Location(file="kernels.py", line=line))
        return self.p


# -- the samples -------------------------------------------------------------------------------

def gemm(block_m: int = 128, block_n: int = 128, block_k: int = 32, stages: int = 3,
         n: int = 1024, k_dim: int = 1024) -> pb.Program:
    """C[M, N] = A[M, K] @ B[K, N] with a pipelined K loop (TileLang's GEMM example)."""
    b = Builder("gemm")
    m = b.var("M")
    a_g = b.tensor("A", [("sym", m), k_dim], F16)
    b_g = b.tensor("B", [k_dim, n], F16)
    c_g = b.tensor("C", [("sym", m), n], F16)
    bx, by, k = b.var("bx"), b.var("by"), b.var("k")
    a_s = b.buffer("A_shared", [block_m, block_k], F16)
    b_s = b.buffer("B_shared", [block_k, block_n], F16)
    c_l = b.buffer("C_local", [block_m, block_n], F32, pb.FRAGMENT)
    row, col = mul(var(by), const(block_m)), mul(var(bx), const(block_n))
    kk = mul(var(k), const(block_k))
    body = seq(
        at(pb.Stmt(fill=pb.Fill(dst=region(c_l, [0, 0], [block_m, block_n]),
                                value=const(0.0, F32))), 10),
        at(loop(k, ceildiv(const(k_dim), block_k), seq(
            at(copy(region(a_g, [row, kk], [block_m, block_k]),
                    region(a_s, [0, 0], [block_m, block_k])), 12),
            at(copy(region(b_g, [kk, col], [block_k, block_n]),
                    region(b_s, [0, 0], [block_k, block_n])), 13),
            at(pb.Stmt(gemm=pb.Gemm(a=a_s, b=b_s, c=c_l)), 14),
        ), pb.PIPELINED, stages), 11),
        at(copy(region(c_l, [0, 0], [block_m, block_n]),
                region(c_g, [row, col], [block_m, block_n])), 15),
    )
    grid = [ceildiv(const(n), block_n), ceildiv(var(m), block_m)]
    return b.kernel(grid, [bx, by], 128, body, line=9)


def elementwise(block: int = 1024) -> pb.Program:
    """Y[i] = float16(exp(X[i]) * 2) over a symbolic length M, guarded at the ragged tail."""
    b = Builder("scale_exp")
    m = b.var("M")
    x = b.tensor("X", [("sym", m)], F32)
    y = b.tensor("Y", [("sym", m)], F16)
    bx, i = b.var("bx"), b.var("i")
    gi = add(mul(var(bx), const(block)), var(i))
    value = cast(mul(call(pb.EXP, load(x, F32, gi)), const(2.0, F32)), F16)
    body = at(loop(i, block, at(if_(binary(pb.LT, gi, var(m)), store(y, [gi], value)), 22),
                   pb.PARALLEL), 21)
    return b.kernel([ceildiv(var(m), block)], [bx], 256, body, line=20)


def softmax(rows: int = 16, cols: int = 128) -> pb.Program:
    """Row softmax of X[M, cols] one tile of `rows` rows per block: Reduce, Select, exp."""
    b = Builder("softmax")
    m = b.var("M")
    x = b.tensor("X", [("sym", m), cols], F32)
    y = b.tensor("Y", [("sym", m), cols], F32)
    bx, i, j, i2, j2 = b.var("bx"), b.var("i"), b.var("j"), b.var("i2"), b.var("j2")
    tile = b.buffer("X_frag", [rows, cols], F32, pb.FRAGMENT)
    row_max = b.buffer("row_max", [rows], F32, pb.FRAGMENT)
    row_sum = b.buffer("row_sum", [rows], F32, pb.FRAGMENT)
    row0 = mul(var(bx), const(rows))
    shifted = call(pb.EXP, binary(pb.SUB, load(tile, F32, var(i), var(j)),
                                  load(row_max, F32, var(i))))
    s = load(row_sum, F32, var(i2))
    normalized = select(binary(pb.GT, s, const(0.0, F32)),
                        binary(pb.DIV, load(tile, F32, var(i2), var(j2)), s), const(0.0, F32))
    body = seq(
        at(copy(region(x, [row0, 0], [rows, cols]), region(tile, [0, 0], [rows, cols])), 31),
        at(pb.Stmt(reduce=pb.Reduce(kind=pb.REDUCE_MAX, src=tile, dst=row_max, dim=1,
                                    clear=True)), 32),
        at(loop(i, rows, loop(j, cols, store(tile, [var(i), var(j)], shifted), pb.PARALLEL),
                pb.PARALLEL), 33),
        at(pb.Stmt(reduce=pb.Reduce(kind=pb.REDUCE_SUM, src=tile, dst=row_sum, dim=1,
                                    clear=True)), 34),
        at(loop(i2, rows, loop(j2, cols, store(tile, [var(i2), var(j2)], normalized),
                               pb.PARALLEL), pb.PARALLEL), 35),
        at(copy(region(tile, [0, 0], [rows, cols]), region(y, [row0, 0], [rows, cols])), 36),
    )
    return b.kernel([ceildiv(var(m), rows)], [bx], 128, body, line=30)


def scaled_sum(blocks: int = 32, threads: int = 128) -> pb.Program:
    """out[0] += alpha * sum(X[:n]): a scalar param, IfThenElse, atomics in shared and global."""
    b = Builder("scaled_sum")
    n_el = blocks * threads
    x = b.tensor("X", [n_el], F32)
    out = b.tensor("out", [1], F32)
    alpha, n = b.scalar("alpha", F32), b.scalar("n", I32)
    bx, i, t, u = b.var("bx"), b.var("i"), b.var("t"), b.var("u")
    partial = b.buffer("partial", [1], F32)
    scratch = b.buffer("scratch", [4], F32, pb.LOCAL)
    gi = add(mul(var(bx), const(threads)), var(i))
    contrib = mul(load(x, F32, gi), var(alpha, F32))
    body = seq(
        at(pb.Stmt(fill=pb.Fill(dst=region(partial, [0], [1]), value=const(0.0, F32))), 41),
        at(loop(i, threads, at(if_(
            binary(pb.LT, gi, var(n)),
            pb.Stmt(atomic_add=pb.AtomicAdd(buffer=partial, indices=[const(0)], value=contrib)),
            loop(u, 4, store(scratch, [var(u)], const(0.0, F32)), pb.UNROLL),
        ), 43), pb.PARALLEL), 42),
        at(loop(t, 1, pb.Stmt(atomic_add=pb.AtomicAdd(
            buffer=out, indices=[var(t)], value=load(partial, F32, var(t)))), pb.PARALLEL), 44),
    )
    return b.kernel([const(blocks)], [bx], threads, body, line=40)


SAMPLES = {"gemm": gemm, "elementwise": elementwise, "softmax": softmax,
           "scaled_sum": scaled_sum}


_SEGMENT = re.compile(r"([a-z_]+)(?:\[(\d+)\])?")


def node(msg, path: str):
    """The field at a verifier path such as `kernel.body.seq.stmts[1].for_.extent`; raises
    (AttributeError, IndexError) when the path does not name a field of `msg`."""
    for part in path.split(".") if path else []:
        m = _SEGMENT.fullmatch(part)
        if m is None:
            raise AttributeError(f"bad path segment {part!r}")
        msg = getattr(msg, m[1])
        if m[2] is not None:
            msg = msg[int(m[2])]
    return msg
