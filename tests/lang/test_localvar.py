"""`T.alloc_var`: a per-thread scalar assigned with plain `x = ...` / `x += ...`; and in-place
operators on buffer elements (`acc[i, j] *= s[i]`), checked by running on `cpu`."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.v1 import tile_ir_pb2 as pb


def run(kernel, *arrays):
    tiled.compile(kernel, "cpu")(*arrays)
    return arrays


def test_assignments_to_a_var_are_stores():
    """TileLang's grouped-offset idiom: a running offset accumulated over a serial loop."""

    @T.prim_func
    def offsets(sizes: T.Tensor([8], T.int32), out: T.Tensor([8], T.int32),
                best: T.Tensor([8], T.float32), x: T.Tensor([8, 16], T.float32)):
        with T.Kernel(8, threads=32) as bx:
            row_offset = T.alloc_var(T.int32)
            row_offset = 0
            for i in T.serial(bx):
                row_offset += sizes[i]
            out[bx] = row_offset
            m = T.alloc_var(T.float32, init=-T.infinity(T.float32))
            for j in T.serial(16):
                m = T.max(m, x[bx, j])
            best[bx] = m

    p = offsets.ir.proto
    assert [b.name for b in p.buffers if b.scope == pb.LOCAL] == ["row_offset", "m"]
    sizes = np.arange(1, 9, dtype="int32")
    x = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    out, best = np.zeros(8, "int32"), np.zeros(8, "float32")
    run(offsets, sizes, out, best, x)
    np.testing.assert_array_equal(out, np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    np.testing.assert_array_equal(best, x.max(1))


@pytest.mark.parametrize(("op", "ref"), [
    ("+=", lambda a, b: a + b), ("-=", lambda a, b: a - b), ("*=", lambda a, b: a * b),
    ("/=", lambda a, b: a / b),
])
def test_augmented_assignment_to_a_var(op, ref):
    src = f"""
@T.prim_func
def k(A: T.Tensor([64], T.float32), B: T.Tensor([64], T.float32)):
    with T.Kernel(64, threads=32) as bx:
        acc = T.alloc_var(T.float32, init=A[bx])
        acc {op} B[bx]
        A[bx] = acc
"""
    k = _define(src)
    a = np.linspace(1, 2, 64, dtype="float32")
    b = np.linspace(2, 3, 64, dtype="float32")
    want = ref(a, b)
    run(k, a, b)
    np.testing.assert_allclose(a, want, rtol=1e-6)


@pytest.mark.parametrize(("op", "ref"), [
    ("+=", lambda a, s: a + s[:, None]), ("-=", lambda a, s: a - s[:, None]),
    ("*=", lambda a, s: a * s[:, None]), ("/=", lambda a, s: a / s[:, None]),
])
def test_in_place_operators_on_buffer_elements(op, ref):
    src = f"""
@T.prim_func
def k(A: T.Tensor([32, 64], T.float32), S: T.Tensor([32], T.float32)):
    with T.Kernel(2, threads=128) as bx:
        acc_o = T.alloc_fragment([16, 64], T.float32)
        scale = T.alloc_fragment([16], T.float32)
        T.copy(A[bx * 16:(bx + 1) * 16, :], acc_o)
        T.copy(S[bx * 16:(bx + 1) * 16], scale)
        for i, j in T.Parallel(16, 64):
            acc_o[i, j] {op} scale[i]
        T.copy(acc_o, A[bx * 16:(bx + 1) * 16, :])
"""
    k = _define(src)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 64)).astype("float32")
    s = rng.uniform(1, 2, 32).astype("float32")
    want = ref(a, s)
    run(k, a, s)
    np.testing.assert_allclose(a, want, rtol=1e-6)


def test_a_var_is_a_buffer_to_tile_operations_and_reads_like_a_value():
    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            total = T.alloc_var(T.float32)
            T.clear(total)
            for i in T.serial(64):
                total += A[i]
            scaled = total * 0.5  # an expression that reads the var
            A[0] = scaled + total[0]

    a = np.arange(64, dtype="float32")
    want = a.sum() * 1.5
    run(k, a)
    assert a[0] == want


def test_binding_another_name_to_a_var_takes_its_value_now():
    """`prev = m` snapshots m (TileLang binds prev = m[0]); m's later stores do not show."""

    @T.prim_func
    def k(A: T.Tensor([4], T.float32)):
        with T.Kernel(1, threads=32):
            m = T.alloc_var(T.float32, init=1.0)
            prev = m
            m = 5.0
            A[0] = prev
            A[1] = m
            prev = 7.0  # prev is a var now: a store
            A[2] = prev

    a = np.zeros(4, "float32")
    run(k, a)
    np.testing.assert_array_equal(a, [1, 5, 7, 0])
    assert [b.name for b in k.ir.proto.buffers][1:] == ["m", "prev"]


def test_a_var_rebound_to_a_new_allocation_is_a_new_var():
    @T.prim_func
    def k(A: T.Tensor([2], T.int32)):
        with T.Kernel(1, threads=32):
            x = T.alloc_var(T.int32, 3)
            A[0] = x
            x = T.alloc_var(T.int32, init=4)
            A[1] = x

    a = np.zeros(2, "int32")
    run(k, a)
    np.testing.assert_array_equal(a, [3, 4])
    assert [b.name for b in k.ir.proto.buffers][1:] == ["x", "x_1"]


def test_a_var_assigned_under_a_traced_if_stores_conditionally():
    @T.prim_func
    def k(A: T.Tensor([64], T.int32)):
        with T.Kernel(64, threads=32) as bx:
            flag = T.alloc_var(T.int32, init=0)
            if bx % 2 == 1:
                flag = 1
            A[bx] = flag

    a = np.full(64, 9, "int32")
    run(k, a)
    np.testing.assert_array_equal(a, np.arange(64) % 2)


def test_alloc_var_errors():
    @T.prim_func
    def k(A: T.Tensor([4], T.float32)):
        with T.Kernel(1, threads=32):
            T.alloc_var(T.float32, "shared")

    with pytest.raises(KernelDefinitionError, match="scope 'shared' is not supported"):
        _ = k.ir


def _define(src: str):
    import linecache

    filename = f"<tiled-test-{abs(hash(src))}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    env = {"T": T}
    exec(compile(src, filename, "exec"), env)
    return env["k"]
