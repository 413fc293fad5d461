"""T.reinterpret(dtype, value): a value's bits read as another dtype of the same width (the
Tile IR's REINTERPRET intrinsic), on the `cpu` target against numpy's views, in scalar code and
in vectorized T.Parallel nests, for cuda:sm_90a through nvcc, and the errors that name what is
wrong (DSL and verifier). float8 values are not reinterpreted yet (tiled computes float8 through
float32), which both say."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.ir.printer import format_program
from tiled.ir.verifier import verify_program
from tiled.v1 import tile_ir_pb2 as pb

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("src,dst", [("int32", "float32"), ("float32", "int32"),
                                     ("uint32", "float32"), ("int16", "float16"),
                                     ("uint16", "bfloat16"), ("float16", "int16"),
                                     ("int64", "float64")])
def test_bits_read_as_another_dtype_on_cpu(src, dst):
    np_src = np.dtype(src)
    np_dst = ml_dtypes.bfloat16 if dst == "bfloat16" else np.dtype(dst)

    @tiled.kernel
    def k(X: T.Tensor((64,), src), Y: T.Tensor((64,), dst)):
        with T.Kernel(1, threads=32):
            for i in T.Parallel(64):
                Y[i] = T.reinterpret(dst, X[i])
    rng = np.random.default_rng(0)
    if np_src.kind == "f":
        x = rng.standard_normal(64).astype(np_src)
    else:  # random bits, the exponent's top bit clear: no inf / NaN among the floats read
        bits = np_src.itemsize * 8
        raw = rng.integers(0, 1 << 62, 64, dtype=np.uint64) & np.uint64((1 << bits) - 1)
        raw &= np.uint64(~(1 << (bits - 2)) & ((1 << bits) - 1))
        x = raw.astype(np.dtype(f"uint{bits}")).view(np_src)
    y = np.zeros(64, np_dst)
    tiled.compile(k, "cpu")(x, y)
    np.testing.assert_array_equal(y.view(np_src), x)


def test_the_magic_number_dequantization_of_four_bit_weights():
    """q = (w >> 4 i) & 15 as the float 2^23 + q, minus 2^23 (+ 8): q - 8 without an
    int-to-float conversion, the weight-only GEMV's inner step."""

    @tiled.kernel
    def dq(W: T.Tensor((32,), "int32"), Y: T.Tensor((32, 8), "float32")):
        with T.Kernel(1, threads=32):
            for j in T.Parallel(32):
                word = W[j]
                for i in range(8):
                    bits = ((word >> (4 * i)) & 15) | 0x4B000000
                    Y[j, i] = T.reinterpret("float32", bits) - 8388616.0
    w = np.random.default_rng(1).integers(-2**31, 2**31 - 1, 32, dtype=np.int64).astype(np.int32)
    y = np.zeros((32, 8), np.float32)
    tiled.compile(dq, "cpu")(w, y)
    want = ((w.astype(np.uint32)[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15)
    np.testing.assert_array_equal(y, want.astype(np.float32) - 8)


def test_it_prints_as_tilelang_writes_it_and_vectorizes_for_cuda():
    @tiled.kernel
    def k(X: T.Tensor((1024,), "int32"), Y: T.Tensor((1024,), "float32")):
        with T.Kernel(4, threads=64) as bx:
            for i in T.Parallel(256):
                Y[bx * 256 + i] = T.reinterpret("float32", X[bx * 256 + i] | 0x4B000000)
    assert 'reinterpret("float32", ' in format_program(k.ir)
    compiled = tiled.compile(k, "cuda:sm_90a", cache=False)  # through nvcc
    assert compiled.artifact and "int4" in compiled.source  # 4-lane vectors


def test_the_dsl_names_a_wrong_width_or_argument_order():
    with pytest.raises(tiled.KernelDefinitionError, match="int32 cannot be read as float16"):
        @tiled.kernel
        def k(X: T.Tensor((4,), "int32"), Y: T.Tensor((4,), "float16")):
            with T.Kernel(1):
                Y[0] = T.reinterpret("float16", X[0])
        k.ir  # traced here
    with pytest.raises(tiled.KernelDefinitionError, match=r"takes \(dtype, value\)"):
        @tiled.kernel
        def k2(X: T.Tensor((4,), "int32"), Y: T.Tensor((4,), "float32")):
            with T.Kernel(1):
                Y[0] = T.reinterpret(X[0], "float32")
        k2.ir
    with pytest.raises(tiled.KernelDefinitionError, match="float8 values"):
        @tiled.kernel
        def k3(X: T.Tensor((4,), "uint8"), Y: T.Tensor((4,), "float8_e4m3")):
            with T.Kernel(1):
                Y[0] = T.reinterpret("float8_e4m3", X[0])
        k3.ir


def test_the_verifier_rejects_a_reinterpret_of_another_width():
    @tiled.kernel
    def k(X: T.Tensor((4,), "int32"), Y: T.Tensor((4,), "float32")):
        with T.Kernel(1):
            Y[0] = T.reinterpret("float32", X[0])
    prog = pb.Program()
    prog.CopyFrom(k.ir.proto)
    calls = [e for e in _exprs(prog) if e.WhichOneof("kind") == "call"]
    assert len(calls) == 1
    calls[0].dtype = pb.FLOAT16  # as a hand-written request could send it
    with pytest.raises(tiled.VerifyError, match="reinterpret of int32 as float16"):
        verify_program(prog)


def _exprs(msg):
    """Every Expr message inside `msg`."""
    for field, value in msg.ListFields():
        if hasattr(value, "ListFields"):
            items = [value]
        elif isinstance(value, (int, float, str, bytes)):
            continue
        else:
            items = value
        for v in items:
            if hasattr(v, "ListFields"):
                if isinstance(v, pb.Expr):
                    yield v
                yield from _exprs(v)
