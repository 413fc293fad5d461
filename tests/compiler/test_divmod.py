"""passes/divmod.py: `(base + v) // K`, `% K`, `< K`, `>= K` with v a loop variable below
base's grain, rewritten free of v; exact (floor semantics, negative bases too), and what it
buys TileLang's convolution as written (a gather of whole channel vectors)."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tests.conformance.cases import load_all
from tiled.compiler.passes.divmod import split_aligned_divmod
from tiled.ir.program import as_program
from tiled.ir.walk import expr_vars, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

E = 8


def _forms(K: int, shift: int, width: int = E):
    """Y[a, j, :] = the four forms of t = (a + shift) * E + j, a over 6 rows, j over width."""
    @tiled.kernel
    def forms(Y: T.Tensor((6, width, 4), "int32")):
        with T.Kernel(1, threads=32):
            for a, j in T.Parallel(6, width):
                t = (a + shift) * E + j
                Y[a, j, 0] = t // K
                Y[a, j, 1] = t % K
                Y[a, j, 2] = T.if_then_else(t < K, 1, 0)
                Y[a, j, 3] = T.if_then_else(t >= K, 1, 0)
    return forms


def _want(K: int, shift: int, width: int = E):
    t = (np.arange(6)[:, None] + shift) * E + np.arange(width)[None, :]
    return np.stack([t // K, t % K, t < K, t >= K], -1).astype(np.int32)


def _rewritten(kernel) -> int:
    """How many stored values `(sum) // K` or `(sum) % K` the pass rewrote."""
    def count(p):
        values = [st.store.value for st in walk(p.proto.kernel.body)
                  if st.WhichOneof("kind") == "store"]
        return sum(1 for v in values if v.WhichOneof("kind") == "binary"
                   and v.binary.op in (pb.FLOOR_DIV, pb.FLOOR_MOD)
                   and v.binary.a.WhichOneof("kind") == "binary"
                   and v.binary.a.binary.op == pb.ADD)
    return count(as_program(kernel)) - count(split_aligned_divmod(as_program(kernel)))


@pytest.mark.parametrize("K", [8, 16, 24, 64])
@pytest.mark.parametrize("shift", [0, -3, -7])
def test_rewrites_are_exact(K, shift):
    k = _forms(K, shift)
    assert _rewritten(k) == 2  # the div and the mod
    y = np.zeros((6, E, 4), np.int32)
    tiled.compile(k, target="cpu", cache=False)(y)
    np.testing.assert_array_equal(y, _want(K, shift))


@pytest.mark.parametrize("K,width", [(12, E), (16, 2 * E)])
def test_what_may_cross_a_multiple_is_left_alone(K, width):
    """K not a multiple of the grain, or v running past it: not rewritten (and still right)."""
    k = _forms(K, -2, width)
    assert _rewritten(k) == 0
    y = np.zeros((6, width, 4), np.int32)
    tiled.compile(k, target="cpu", cache=False)(y)
    np.testing.assert_array_equal(y, _want(K, -2, width))


def test_tilelang_convolution_gathers_whole_channel_vectors():
    """The conformance suite's conv2d_nhwc, TileLang's example as written (k = k_iter *
    block_K + j; k // (K * C), k // C % K, k % C, k < taps): after the pass the tap, the
    bounds test and the channel base are free of j, so on CUDA the tile is gathered by
    16-byte cp.async (it was an element loop: 0.22x F.conv2d on the H200)."""
    case = load_all()["conv2d_nhwc"]
    kernel = case.factory(**{**case.cpu, **case.gpu}).kernel
    p = split_aligned_divmod(as_program(kernel))
    data = next(b.id for b in p.proto.buffers if b.name == "data")
    loops = {st.for_.var: st for st in walk(p.proto.kernel.body)
             if st.WhichOneof("kind") == "for_"}
    stores = [st.store for st in walk(p.proto.kernel.body) if st.WhichOneof("kind") == "store"
              and any(x.WhichOneof("kind") == "load" and x.load.buffer == data
                      for x in subexprs(st.store.value))]
    (store,) = stores
    j = store.indices[1].var
    assert j in loops
    load = next(x.load for x in subexprs(store.value) if x.WhichOneof("kind") == "load")
    assert j not in expr_vars(list(load.indices)[:-1])
    c = tiled.compile(kernel, target="cuda:sm_90a", cache=False)
    assert "cp_async<16>" in c.source and "= data_ptr[" not in c.source

