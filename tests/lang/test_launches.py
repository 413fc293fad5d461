"""A kernel function of several `with T.Kernel` blocks (TileLang's split-KV decode and its
combine step): one traced program per block (`launches`), compiled to a CompiledSequence
that launches them in order, called through tiled.jit; `.ir` and nested blocks refused."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.sequence import CompiledSequence
from tiled.v1 import tile_ir_pb2 as pb

N = 1000


@T.prim_func
def two_steps(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"),
              Z: T.Tensor((N,), "float32")):
    with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
        tile = T.alloc_shared((128,), "float32")
        T.copy(X[bx * 128], tile)
        for i in T.Parallel(128):
            Y[bx * 128 + i] = tile[i] + 1.0
    with T.Kernel(T.ceildiv(N, 256), threads=64) as block:
        for i in T.Parallel(256):  # reads what the first launch wrote, across its blocks
            Z[block * 256 + i] = Y[N - 1 - (block * 256 + i)] * 2.0


def test_each_block_is_a_program_of_its_own():
    first, second = two_steps.launches
    assert (first.proto.name, second.proto.name) == ("two_steps", "two_steps_1")
    for p in (first, second):
        assert [prm.name for prm in p.proto.params] == ["X", "Y", "Z"]
    assert [b.name for b in first.proto.buffers if b.scope == pb.SHARED] == ["tile"]
    assert not [b for b in second.proto.buffers if b.scope != pb.GLOBAL]
    assert second.proto.kernel.threads == 64
    assert second.proto.vars[second.proto.kernel.block_vars[0]].name == "block"


def test_ir_names_the_launches_instead_of_answering_with_one():
    with pytest.raises(KernelDefinitionError, match="launches 2 kernels"):
        _ = two_steps.ir


def test_compiled_launches_run_in_order_on_cpu():
    k = tiled.compile(two_steps, "cpu", cache=False)
    assert isinstance(k, CompiledSequence) and len(k.kernels) == 2
    x = np.arange(N, dtype=np.float32)
    y, z = np.zeros(N, np.float32), np.zeros(N, np.float32)
    k(x, y, z)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(z, (x[::-1] + 1) * 2)


def test_jit_calls_the_launches_as_one_kernel():
    jk = tiled.jit(two_steps, out_idx=[1, 2])
    y, z = jk(np.ones(N, np.float32))
    np.testing.assert_array_equal(y, np.full(N, 2.0, np.float32))
    np.testing.assert_array_equal(z, np.full(N, 4.0, np.float32))


def test_nested_kernel_blocks_are_refused():
    @T.prim_func
    def nested(X: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=32):
            with T.Kernel(1, threads=32):
                X[0] = 1.0

    with pytest.raises(KernelDefinitionError, match="do not nest"):
        _ = nested.launches
