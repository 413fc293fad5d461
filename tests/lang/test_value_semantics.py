"""`v = A[i]` in a kernel binds the value read there, as TileLang's let does: a later store to
A[i] does not change what `v` reads. The name stays the expression (inlined, as the
vectorizer wants it) unless a write to what it reads comes before a use (tiled/lang/binding.py)."""

import numpy as np

import tiled
import tiled.lang as T


def _run(kernel, *arrays):
    tiled.compile(kernel, target="cpu", cache=False)(*arrays)


def _locals(kernel) -> int:
    from tiled.v1 import tile_ir_pb2 as pb

    return sum(b.scope == pb.LOCAL for b in kernel.ir.proto.buffers)


@tiled.kernel
def read_then_store(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
    with T.Kernel(1, threads=8) as _:
        for i in T.Parallel(8):
            a = X[i]
            X[i] = a + 1.0
            Y[i] = a


@tiled.kernel
def read_then_store_in_a_branch(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
    with T.Kernel(1, threads=8) as _:
        for i in T.Parallel(8):
            a = T.cast(X[i], "float32") * 2.0
            if i % 2 == 0:
                X[i] = 0.0
            Y[i] = a


@tiled.kernel
def no_use_after_the_store(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
    with T.Kernel(1, threads=8) as _:
        for i in T.Parallel(8):
            a = X[i]
            Y[i] = a
            X[i] = a + 1.0


def test_an_assigned_load_keeps_the_value_read_before_a_store():
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    _run(read_then_store, x, y)
    np.testing.assert_array_equal(x, np.arange(8) + 1)
    np.testing.assert_array_equal(y, np.arange(8))  # TileLang's answer
    assert _locals(read_then_store) == 1


def test_a_store_in_a_nested_scope_also_keeps_the_value():
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    _run(read_then_store_in_a_branch, x, y)
    np.testing.assert_array_equal(y, 2 * np.arange(8))
    np.testing.assert_array_equal(x, np.where(np.arange(8) % 2 == 0, 0, np.arange(8)))


def test_a_binding_nothing_reads_after_the_store_stays_an_expression():
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    _run(no_use_after_the_store, x, y)
    np.testing.assert_array_equal(y, np.arange(8))
    assert _locals(no_use_after_the_store) == 0  # no variable: the code is as before


def test_an_alloc_var_keeps_the_value_read_before_a_store():
    @tiled.kernel
    def with_var(X: T.Tensor((8,), "float32"), Y: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=8) as _:
            for i in T.Parallel(8):
                a = T.alloc_var("float32")
                a = X[i]
                X[i] = a + 1.0
                Y[i] = a

    x, y = np.arange(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    _run(with_var, x, y)
    np.testing.assert_array_equal(y, np.arange(8))
