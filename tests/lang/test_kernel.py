"""The DSL tracer: what a kernel definition becomes, and how mistakes are reported."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.v1 import tile_ir_pb2 as pb


def _kinds(stmt):
    kind = stmt.WhichOneof("kind")
    out = [kind]
    if kind == "seq":
        for s in stmt.seq.stmts:
            out += _kinds(s)
    elif kind == "for_":
        out += _kinds(stmt.for_.body)
    elif kind == "if_then_else":
        out += _kinds(stmt.if_then_else.then_body)
        if stmt.if_then_else.HasField("else_body"):
            out += _kinds(stmt.if_then_else.else_body)
    return out


def make_gemm(block_K=32, stages=3):
    M = T.dyn("M")

    @tiled.kernel
    def gemm(A: T.Tensor((M, 256), "float16"), B: T.Tensor((256, 128), "float16"),
             C: T.Tensor((M, 128), "float32")):
        with T.Kernel(T.ceildiv(128, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((64, block_K), "float16")
            B_s = T.alloc_shared((block_K, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(256, block_K), num_stages=stages):
                T.copy(A[by * 64, k * block_K], A_s)
                T.copy(B[k * block_K, bx * 64], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 64, bx * 64])

    return gemm


def test_gemm_traces_to_expected_structure():
    p = make_gemm().ir.proto
    assert [x.name for x in p.params] == ["A", "B", "C"]
    assert p.kernel.threads == 128 and len(p.kernel.grid) == 2
    assert _kinds(p.kernel.body) == ["seq", "fill", "for_", "seq", "copy", "copy", "gemm", "copy"]
    loop = p.kernel.body.seq.stmts[1].for_
    assert loop.kind == pb.PIPELINED and loop.num_stages == 3 and loop.extent.int_value == 8
    # The copy's corner is (by * 64, k * 32) and its extents come from the shared tile.
    cp = loop.body.seq.stmts[0].copy
    assert list(cp.src.extents) == [64, 32] and list(cp.dst.extents) == [64, 32]
    # M is a symbolic dim shared by A and C.
    dims = {d.var for b in p.buffers if b.scope == pb.GLOBAL for d in b.shape
            if d.WhichOneof("kind") == "var"}
    assert len(dims) == 1


def test_digest_tracks_closure_values():
    assert make_gemm().ir.digest == make_gemm().ir.digest
    assert make_gemm(block_K=32).ir.digest != make_gemm(block_K=64).ir.digest
    assert make_gemm(stages=2).ir.digest != make_gemm(stages=3).ir.digest


def test_statements_carry_source_locations():
    p = make_gemm().ir.proto
    fill = p.kernel.body.seq.stmts[0]
    assert fill.loc.file == __file__ and fill.loc.line > 0


def test_python_if_on_traced_value_becomes_ir_conditional():
    N = T.dyn("N")

    @tiled.kernel
    def clamp(X: T.Tensor((N,), "float32"), limit: T.float32):
        with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
            for i in T.Parallel(128):
                idx = bx * 128 + i
                if idx < N:
                    if X[idx] > limit:
                        X[idx] = limit
                    else:
                        X[idx] = X[idx] * 2.0

    kinds = _kinds(clamp.ir.proto.kernel.body)
    assert kinds.count("if_then_else") == 2
    inner = clamp.ir.proto.kernel.body.for_.body.if_then_else.then_body.if_then_else
    assert inner.HasField("else_body")


def test_python_if_on_python_value_is_static():
    def make(flag):
        @tiled.kernel
        def k(X: T.Tensor((128,), "float32")):
            with T.Kernel(1, threads=128):
                for i in T.Parallel(128):
                    if flag:
                        X[i] = 1.0
                    else:
                        X[i] = 2.0

        return k

    for flag, value in ((True, 1.0), (False, 2.0)):
        body = make(flag).ir.proto.kernel.body
        assert "if_then_else" not in _kinds(body)
        assert body.for_.body.store.value.float_value == value


def test_scalar_params_and_math():
    @tiled.kernel
    def k(X: T.Tensor((64,), "float16"), n: T.int32, alpha: T.float32):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                X[i] = T.if_then_else(i < n, T.exp(X[i].astype("float32") * alpha), 0.0)

    p = k.ir.proto
    assert [prm.WhichOneof("kind") for prm in p.params] == ["buffer", "scalar", "scalar"]
    store = p.kernel.body.for_.body.store
    assert store.value.WhichOneof("kind") == "cast"  # float32 select stored to float16


def _raises_at(fn, match):
    with pytest.raises(KernelDefinitionError, match=match) as info:
        fn()
    err = info.value
    assert err.file == __file__, err
    assert err.line and err.line > 0
    assert __file__ in str(err) and f":{err.line}" in str(err)
    return err


def test_error_names_file_and_line_for_bad_gemm_shapes():
    @tiled.kernel
    def bad(A: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((16, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.gemm(A_s, B_s, C_l)

    err = _raises_at(lambda: bad.ir, "shapes do not chain")
    assert "T.gemm(A_s, B_s, C_l)" in str(err)


def test_error_for_wrong_index_count():
    @tiled.kernel
    def bad(A: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A[bx] = 1.0

    _raises_at(lambda: bad.ir, "2 dims but was indexed with 1")


def test_error_for_missing_annotation():
    @tiled.kernel
    def bad(A):
        with T.Kernel(1, threads=128):
            pass

    _raises_at(lambda: bad.ir, "needs an annotation")


def test_error_for_copy_shape_mismatch():
    @tiled.kernel
    def bad(A: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((32, 32), "float32")
            f = T.alloc_fragment((16, 32), "float32")
            T.copy(s, f)

    _raises_at(lambda: bad.ir, "different shapes")


def test_error_for_bool_of_traced_value_in_helper():
    def helper(x):
        return 1 if x > 0 else 2  # Python `if` on a traced value, outside the kernel body

    @tiled.kernel
    def bad(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                A[i] = helper(A[i])

    with pytest.raises(KernelDefinitionError, match="no Python truth value"):
        bad.ir


def test_error_for_verifier_problem_is_located():
    @tiled.kernel
    def bad(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64,), "float32")
            for i in T.Parallel(64):
                s[i + 64] = A[i]

    _raises_at(lambda: bad.ir, "out of bounds")


def test_error_for_missing_kernel_block():
    @tiled.kernel
    def bad(A: T.Tensor((64,), "float32")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"no `with T\.Kernel"):
        bad.ir


def test_program_round_trips_through_bytes():
    prog = make_gemm().ir
    again = tiled.ir.Program.from_bytes(prog.to_bytes())
    assert again == prog and again.digest == prog.digest


def test_kernel_location_is_the_with_statement():
    p = make_gemm().ir.proto
    assert p.kernel.loc.file == __file__
    import inspect
    src = inspect.getsource(make_gemm).splitlines()
    first = make_gemm.__code__.co_firstlineno
    line = first + next(i for i, s in enumerate(src) if "with T.Kernel(" in s)
    assert p.kernel.loc.line == line


def test_statements_under_a_python_if_report_their_own_line():
    def make(flag):
        @tiled.kernel
        def k(A: T.Tensor((256,), "float16")):
            with T.Kernel(1, threads=128):
                if flag:
                    if flag:
                        T.copy(A[0:8], A[0:8])
        return k

    with pytest.raises(KernelDefinitionError) as info:
        _ = make(True).ir
    assert info.value.line == make.__code__.co_firstlineno + 6


def test_reflected_bitwise_operators():
    """A Python int on the left of <<, >>, ^ and % traces like one on the right."""

    @tiled.kernel
    def bits(X: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=64):
            for i in T.Parallel(64):
                X[i] = (255 << (i % 8)) ^ (3 >> (i % 2)) ^ (7 ^ i) ^ (100 % (i + 1))

    k = tiled.compile(bits, "cpu")
    x = np.zeros(64, "int32")
    k(x)
    i = np.arange(64)
    np.testing.assert_array_equal(x, (255 << (i % 8)) ^ (3 >> (i % 2)) ^ (7 ^ i) ^ (100 % (i + 1)))


def test_a_definition_error_prints_its_located_message_through_traceback():
    """KernelDefinitionError is a SyntaxError, which the traceback module (pytest, IDEs)
    prints from its `msg`: that is the located message, not "<no detail available>"."""
    import traceback

    @tiled.kernel
    def bad(X: T.Tensor((8,), "float32"), alpha: T.bfloat16):
        with T.Kernel(1, threads=8):
            for i in T.Parallel(8):
                X[i] = alpha

    with pytest.raises(KernelDefinitionError) as info:
        bad.ir
    shown = "".join(traceback.format_exception_only(info.type, info.value))
    assert "scalar parameter alpha is bfloat16" in shown and "test_kernel.py:" in shown
    assert "no detail available" not in shown
