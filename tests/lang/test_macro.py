"""`@T.prim_func` inside a factory, `@T.macro` helpers traced inline (with `if`s, nested macros,
buffers / values / Python constants, return values), and the annotations TileLang's
signatures use: T.Tensor / T.Buffer with list shapes, T.SharedBuffer / T.FragmentBuffer, dtype
objects."""

from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.v1 import tile_ir_pb2 as pb

from .test_kernel import _kinds


def softmax_rows(M, N, block_M=16, dtype=T.float32, accum_dtype=T.float32, scale_first=True):
    """Row softmax, TileLang-style: a factory of a @T.prim_func that calls macros."""

    @T.macro
    def row_max(tile: T.FragmentBuffer([block_M, N], accum_dtype), out):
        T.reduce_max(tile, out, dim=1)

    @T.macro
    def exp_and_sum(tile, m, s, scale: T.float32):
        for i, j in T.Parallel(block_M, N):
            tile[i, j] = T.exp(tile[i, j] - m[i]) * scale
        T.reduce_sum(tile, s, dim=1)
        return s

    @T.macro
    def normalize(tile: T.FragmentBuffer([block_M, N], accum_dtype), bx, limit):
        m = T.alloc_fragment([block_M], accum_dtype)
        s = T.alloc_fragment([block_M], accum_dtype)
        if scale_first:  # a Python constant: chosen at trace time
            row_max(tile, m)
        else:
            T.reduce_max(tile, m, dim=1)
        total = exp_and_sum(tile, m, s, 1.0)  # a nested macro that returns its buffer
        for i, j in T.Parallel(block_M, N):
            if bx * block_M + i < limit:  # traced: an IR conditional
                tile[i, j] = tile[i, j] / total[i]

    @T.prim_func
    def softmax(X: T.Tensor([M, N], dtype), Y: T.Buffer([M, N], dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            X_shared = T.alloc_shared([block_M, N], dtype)
            tile = T.alloc_fragment([block_M, N], accum_dtype)
            T.copy(X[bx * block_M:(bx + 1) * block_M, :], X_shared)
            T.copy(X_shared, tile)
            normalize(tile, bx, M)
            T.copy(tile, Y[bx * block_M:(bx + 1) * block_M, :])

    return softmax


def test_prim_func_in_a_factory_with_macros_matches_numpy():
    x = np.random.default_rng(0).standard_normal((48, 64)).astype("float32")
    y = np.zeros_like(x)
    k = softmax_rows(48, 64)
    assert isinstance(k, tiled.lang.KernelFunction)
    tiled.compile(k, "cpu")(x, y)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_macro_bodies_are_traced_inline_with_their_names_and_ifs():
    p = softmax_rows(48, 64).ir
    assert [b.name for b in p.proto.buffers] == ["X", "Y", "X_shared", "tile", "m", "s"]
    kinds = _kinds(p.proto.kernel.body)
    assert kinds.count("if_then_else") == 1 and kinds.count("reduce") == 2
    stmt = next(s for s in p.proto.kernel.body.seq.stmts if s.HasField("reduce"))
    assert stmt.reduce.kind == pb.REDUCE_MAX
    # A macro's statements carry the macro's own lines.
    source = Path(__file__).read_text().splitlines()
    assert (stmt.loc.file, source[stmt.loc.line - 1].strip()) == (
        __file__, "T.reduce_max(tile, out, dim=1)")


def test_a_python_constant_picks_the_macros_branch():
    a, b = softmax_rows(48, 64).ir, softmax_rows(48, 64, scale_first=False).ir
    assert a.digest == b.digest  # both branches reduce the same way
    assert a != b  # from different lines


def test_a_tile_annotation_checks_the_scope_at_the_call():
    @T.macro
    def accumulate(acc: T.FragmentBuffer([64], T.float32), src: T.SharedBuffer([64], T.float32)):
        for i in T.Parallel(64):
            acc[i] += src[i]

    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            acc_shared = T.alloc_shared([64], T.float32)
            src = T.alloc_shared([64], T.float32)
            accumulate(acc_shared, src)  # wrong-scope

    with pytest.raises(KernelDefinitionError, match=r"macro accumulate: parameter acc is "
                       r"annotated T\.FragmentBuffer \(fragment memory\), but acc_shared is a "
                       "shared buffer") as info:
        _ = k.ir
    assert "accumulate(acc_shared, src)  # wrong-scope" in info.value.source_line


def test_a_macro_outside_a_trace_is_refused():
    @T.macro
    def helper():
        pass

    with pytest.raises(KernelDefinitionError, match="can only be called inside a kernel"):
        helper()


def test_macro_arguments_bind_like_a_call():
    @T.macro
    def fill_with(buf, value=1.0):
        T.fill(buf, value)

    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared([64], T.float32)
            fill_with(s, vaule=2.0)

    with pytest.raises(KernelDefinitionError, match="macro fill_with: got an unexpected keyword"):
        _ = k.ir


def test_tensor_annotations_take_lists_tuples_and_dtype_objects():
    M = T.dyn("M")

    @T.prim_func
    def k(A: T.Tensor([M, 64], T.float16), B: T.Buffer((M, 64), "half"),
          C: T.Tensor([M, 64], T.float8_e4m3), D: T.Tensor((M, 64), T.float8_e5m2),
          n: T.int32, alpha: T.float32):
        with T.Kernel(T.ceildiv(M, 64), threads=128) as bx:
            tile = T.alloc_fragment([64, 64], T.float32)
            T.copy(A[bx * 64, 0], tile)
            for i, j in T.Parallel(64, 64):
                tile[i, j] = T.float32(tile[i, j]) * alpha + T.cast(n, T.float32)
            T.copy(tile, B[bx * 64, 0])
            for i, j in T.Parallel(64, 64):
                C[bx * 64 + i, j] = T.cast(tile[i, j], T.float8_e4m3)
                D[bx * 64 + i, j] = tile[i, j].astype(T.float8_e5m2)

    p = k.ir.proto
    got = [(b.name, b.dtype) for b in p.buffers if b.scope == pb.GLOBAL]
    assert got == [("A", pb.FLOAT16), ("B", pb.FLOAT16), ("C", pb.FLOAT8_E4M3),
                   ("D", pb.FLOAT8_E5M2)]


def test_dtype_objects_compare_and_convert_like_names():
    assert T.float16 == "float16" == T.dtype("half") and T.float == T.float32
    assert T.float8_e4m3fn == T.float8_e4m3 and str(T.bfloat16) == "bfloat16"
    assert len({T.float16, T.dtype(T.float16), T.half}) == 1
    assert repr(T.float8_e5m2) == "T.float8_e5m2"
    assert T.Tensor([4, 8], T.bfloat16).shape == (4, 8)
    with pytest.raises(KernelDefinitionError, match="unknown dtype"):
        T.dtype("float7")


def test_a_tile_annotation_on_a_kernel_parameter_is_refused():
    @T.prim_func
    def k(A: T.SharedBuffer([64], T.float32)):
        with T.Kernel(1, threads=64):
            pass

    with pytest.raises(KernelDefinitionError, match=r"annotates a tile a @T\.macro takes"):
        _ = k.ir


def test_tensor_views_are_a_located_unsupported_feature():
    with pytest.raises(KernelDefinitionError, match=r"TileLang feature T\.Tensor\(shape, dtype, "
                       r"data, \.\.\.\) .* is not supported by tiled") as info:
        T.Tensor((4, 4), T.float16, object())
    assert info.value.file == __file__
