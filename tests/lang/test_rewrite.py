"""The source rewrite itself: what the rebuilt function sees (globals, closures, defaults),
where its statements are located, and the statements it reads as TileLang's parser does
(`range` with a traced bound)."""

import numpy as np

import tiled
import tiled.lang as T
from tiled.lang.rewrite import rewrite_function
from tiled.v1 import tile_ir_pb2 as pb

SCALE = 2.0


def test_the_rebuilt_function_shares_globals_closures_and_defaults():
    offset = [1.0]

    def f(x, y=10, *, z=100):
        if x:
            total = x + y + z
        else:
            total = -1
        return total * SCALE + offset[0]

    g = rewrite_function(f)
    assert g is not f and g.__code__ is not f.__code__
    assert g(1) == f(1) == 223.0 and g(0) == f(0)
    offset[0] = 5.0  # the same closure cell
    assert g(1) == 227.0
    assert rewrite_function(f).__code__ is g.__code__  # rewritten once per code object


def test_a_function_without_source_is_used_as_it_is():
    env: dict = {}
    exec("def f(x):\n    return x + 1\n", env)
    assert rewrite_function(env["f"]) is env["f"]
    lam = lambda x: x  # noqa: E731
    assert rewrite_function(lam) is lam


def test_range_with_a_traced_bound_is_a_serial_loop():
    @T.prim_func
    def k(A: T.Tensor([16], T.int32), n: T.int32):
        with T.Kernel(1, threads=32):
            for i in range(n):
                A[i] = i
            for s in range(2):  # a Python range: unrolled at trace time
                A[s + 8] = 100

    body = k.ir.proto.kernel.body.seq.stmts
    assert body[0].for_.kind == pb.SERIAL and k.ir.proto.vars[body[0].for_.var].name == "i"
    assert [s.WhichOneof("kind") for s in body[1:]] == ["store", "store"]
    a = np.zeros(16, "int32")
    tiled.compile(k, "cpu")(a, 5)
    np.testing.assert_array_equal(a[:10], [0, 1, 2, 3, 4, 0, 0, 0, 100, 100])


def test_statements_keep_their_lines_through_the_rewrite():
    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64) as bx:
            s = T.alloc_shared([64], T.float32)
            if bx == 0:
                T.copy(A[0:64], s)  # copy-line
            for i in T.Parallel(64):
                A[i] = s[i]

    p = k.ir.proto
    first = k.fn.__code__.co_firstlineno
    copy = p.kernel.body.seq.stmts[0].if_then_else.then_body
    assert copy.HasField("copy") and copy.loc.line == first + 5
    assert p.buffers[1].loc.line == first + 3


def test_and_or_not_chains_and_conditional_expressions_on_traced_values():
    """TileLang's parser reads `and` / `or` / `not`, `lo <= i < hi` and `a if c else b` on
    traced values as IR logic and selects; the kernel computes what numpy does."""

    @T.prim_func
    def k(X: T.Tensor([8, 8], T.float32), Y: T.Tensor([8, 8], T.float32), lo: T.int32,
          hi: T.int32):
        with T.Kernel(1, threads=64):
            for i, j in T.Parallel(8, 8):
                inside = i >= 1 and j >= 1 and i < 7 and j < 7
                band = lo <= i - j < hi
                edge = not inside or i == j
                Y[i, j] = (X[i, j] if inside and band else -1.0) + (100.0 if edge else 0.0)

    x = np.arange(64, dtype="float32").reshape(8, 8)
    y = np.zeros_like(x)
    tiled.compile(k, "cpu")(x, y, -1, 2)
    i, j = np.indices((8, 8))
    inside = (i >= 1) & (j >= 1) & (i < 7) & (j < 7)
    band = (-1 <= i - j) & (i - j < 2)
    edge = ~inside | (i == j)
    np.testing.assert_array_equal(y, np.where(inside & band, x, -1.0) + np.where(edge, 100, 0))


def test_python_operands_keep_their_short_circuit():
    calls = []

    def probe(v):
        calls.append(v)
        return v

    def f(flag):
        a = flag and probe("and")
        b = flag or probe("or")
        c = 1 < 0 < probe("chain")
        d = probe("then") if flag else probe("else")
        return a, b, c, d, not flag

    g = rewrite_function(f)
    assert g(False) == f(False) and g(True) == f(True)
    assert calls == ["or", "else"] * 2 + ["and", "then"] * 2  # g, then f, each time


def test_clamp_limits_to_the_range_on_cpu():
    @tiled.kernel
    def k(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                Y[i] = T.clamp(X[i], -1.0, 0.5)

    x = np.linspace(-3, 3, 64).astype(np.float32)
    y = np.zeros(64, np.float32)
    tiled.compile(k, "cpu")(x, y)
    np.testing.assert_array_equal(y, np.clip(x, -1.0, 0.5))
    assert T.clamp(7, 0, 5) == 5  # on Python numbers, Python's
