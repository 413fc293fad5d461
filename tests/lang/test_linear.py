"""Tile slices: an extent the linear-form simplifier proves constant (`bx * 64:(bx + 1) * 64`),
full-dimension `:`, int bounds; the error for any other slice prints it as source and says
what to write. Expressions print as source in messages."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.lang.builder import Builder, tracing
from tiled.lang.expr import Expr, as_expr
from tiled.lang.linear import constant_difference, constant_value
from tiled.v1 import tile_ir_pb2 as pb


@pytest.fixture
def vars_():
    """(builder, x, y): two int32 vars of a trace in progress."""
    b = Builder("t")
    with tracing(b):
        x, y = (Expr(pb.Expr(dtype=pb.INT32, var=b.new_var(n)), "int32") for n in "xy")
        yield b, x, y


@pytest.mark.parametrize(("stop", "start", "want"), [
    (lambda x, y: (x + 1) * 64, lambda x, y: x * 64, 64),
    (lambda x, y: x * 64 + 64, lambda x, y: 64 * x, 64),
    (lambda x, y: 128 + x * 32 - y, lambda x, y: 32 * x - y, 128),
    (lambda x, y: (x // 2 + 1) * 16, lambda x, y: (x // 2) * 16, 16),   # x // 2 is a term
    (lambda x, y: (x * 4 + 8) // 4, lambda x, y: x, 2),                 # exact division
    (lambda x, y: (x << 3) + 8, lambda x, y: x * 8, 8),
    (lambda x, y: -(-x - 4), lambda x, y: x, 4),
    (lambda x, y: x * y + 5, lambda x, y: x * y, 5),                    # x * y is a term
    (lambda x, y: (x + 1) * y, lambda x, y: x * y, None),               # not linear in y
    (lambda x, y: x * 2 // 4 + 1, lambda x, y: x * 2 // 4, 1),
    (lambda x, y: (x + 1) * 64, lambda x, y: y * 64, None),
])
def test_constant_difference(vars_, stop, start, want):
    _, x, y = vars_
    assert constant_difference(as_expr(stop(x, y)).node, as_expr(start(x, y)).node) == want


def test_constant_value(vars_):
    _, x, _ = vars_
    assert constant_value((x * 0 + 3).node) == 3
    assert constant_value((x - x + 7).node) == 7
    assert constant_value(x.node) is None


def test_expressions_print_as_source(vars_):
    _, x, y = vars_
    assert repr(x * 128 + y) == "x * 128 + y"
    assert str((x + 1) * 64) == "(x + 1) * 64"
    assert f"{T.exp(y.astype('float32'))}" == "exp(float32(y))"


def tile_kernel(key):
    """A copy of one tile of A (4, 256, 2, 64) through shared memory, written with `key`."""
    N = T.dyn("N")

    @T.prim_func
    def k(Q: T.Tensor([4, 256, 2, 64], T.float32), Out: T.Tensor([4, 256, 2, 64], T.float32),
          X: T.Tensor([N, 64], T.float32)):
        with T.Kernel(256 // 64, 2, 4, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared([64, 64], T.float32)
            T.copy(key(Q, X, bx, by, bz), Q_shared)
            T.copy(Q_shared, Out[bz, bx * 64:(bx + 1) * 64, by, :])

    return k


def test_tilelang_slices_copy_tiles():
    k = tile_kernel(lambda Q, X, bx, by, bz: Q[bz, bx * 64:(bx + 1) * 64, by, :])
    cp = k.ir.proto.kernel.body.seq.stmts[0].copy
    assert list(cp.src.extents) == [1, 64, 1, 64]
    assert "copy(Q[bz : +1, bx * 64 : +64, by : +1, 0 : +64], Q_shared)" in str(k.ir)
    q = np.random.default_rng(0).standard_normal((4, 256, 2, 64)).astype("float32")
    o = np.zeros_like(q)
    tiled.compile(k, "cpu")(q, o, np.zeros((5, 64), "float32"))
    np.testing.assert_array_equal(o, q)


@pytest.mark.parametrize(("key", "extents"), [
    (lambda Q, X, bx, by, bz: Q[0, 0:64, 1, 0:64], [1, 64, 1, 64]),
    (lambda Q, X, bx, by, bz: Q[bz, bx * 64:bx * 64 + 64, by, :], [1, 64, 1, 64]),
    (lambda Q, X, bx, by, bz: Q[bz, 64 * bx:64 * (bx + 1), by, 0:], [1, 64, 1, 64]),
    (lambda Q, X, bx, by, bz: X[bx * 64:(bx + 1) * 64, :], [64, 64]),  # `:` on a static dim
])
def test_slice_forms(key, extents):
    cp = tile_kernel(key).ir.proto.kernel.body.seq.stmts[0].copy
    assert list(cp.src.extents) == extents


@pytest.mark.parametrize(("key", "message"), [
    (lambda Q, X, bx, by, bz: Q[bz, bx * 64:by * 64, by, :],
     r"Q\[bz, bx \* 64:by \* 64, by, :\]: the slice bx \* 64:by \* 64 has no constant extent: "
     r"\(by \* 64\) - \(bx \* 64\) depends on the values of the kernel; a tile slice needs a "
     r"constant one: write `bx \* 64:bx \* 64 \+ n` with an int n"),
    (lambda Q, X, bx, by, bz: X[:, 0:64],
     r"X\[:, 0:64\]: the slice : spans dim 0 of X, whose size N is only known at launch; .*"
     r"write `start:start \+ n`"),
    (lambda Q, X, bx, by, bz: Q[bz, bx * 64:bx * 64, by, :], "has extent 0; a tile slice needs "
                                                             "a positive extent"),
    (lambda Q, X, bx, by, bz: Q[bz, 0:64:2, by, :], "has a step; tile slices have step 1"),
])
def test_slice_errors_print_the_slice_as_source(key, message):
    with pytest.raises(KernelDefinitionError, match=message) as info:
        _ = tile_kernel(key).ir
    assert "<tiled.lang.expr" not in str(info.value)
    assert info.value.file == __file__


def test_expressions_keep_their_names_after_the_trace():
    kept = []

    @tiled.kernel
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(2, threads=64) as bx:
            for col in T.Parallel(32):
                kept.append(A[bx * 32 + col] * 2.0)
                A[bx * 32 + col] = kept[-1]

    _ = k.ir
    assert repr(kept[0]) == "A[bx * 32 + col] * 2.0"
