"""Argument checks: every rule, on numpy arrays, interface objects and a stand-in torch."""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import numpy as np
import pytest

from tiled.errors import LaunchError
from tiled.runtime import Manifest, Param, TensorView, as_tensor, bind_args
from tiled.runtime.args import TORCH_DTYPES, FastBinder, is_c_contiguous


def params(*ps):
    return Manifest.from_dict({
        "manifest_version": 1, "name": "k", "program_digest": "0" * 64, "target": "cpu",
        "backend": "cpu", "arch": "x86_64", "artifact_format": "so",
        "artifact_sha256": "1" * 64, "symbol": "__tvm_ffi_k", "params": list(ps)}).params


def t(name, dtype, shape, align=None):
    d = {"name": name, "kind": "tensor", "dtype": dtype, "shape": shape}
    if align is not None:
        d["align"] = align
    return d


def s(name, dtype):
    return {"name": name, "kind": "scalar", "dtype": dtype}


GEMM = params(t("A", "float16", ["M", 64]), t("B", "float16", [64, "N"]),
              t("C", "float32", ["M", "N"]), s("alpha", "float32"))


def gemm_args(m=8, n=16):
    return [np.zeros((m, 64), np.float16), np.zeros((64, n), np.float16),
            np.zeros((m, n), np.float32), 1.0]


def fails(message, ps, args, device="cpu"):
    with pytest.raises(LaunchError, match=message):
        bind_args(ps, args, device)


def test_binds_dims_and_values():
    args = gemm_args()
    b = bind_args(GEMM, args, "cpu")
    assert b.dims == {"M": 8, "N": 16}
    assert isinstance(b.values[0], TensorView) and b.values[0].ptr == args[0].ctypes.data
    assert b.values[2].shape == (8, 16) and b.values[3] == 1.0
    assert b.device_index is None and not b.uses_torch


def test_count():
    fails(r"^expected 4 arguments \(A, B, C, alpha\), got 3$", GEMM, gemm_args()[:3])


def test_tensor_vs_scalar():
    a = gemm_args()
    fails(r"^A: expected a tensor, got float$", GEMM, [1.0, *a[1:]])
    fails(r"^alpha: expected a float32 scalar, got a tensor \(ndarray\)$", GEMM,
          [*a[:3], np.zeros(1, np.float32)])


def test_dtype():
    a = gemm_args()
    fails(r"^C: expected dtype float32, got float16$", GEMM, [*a[:2], a[2].astype(np.float16),
                                                             1.0])
    fails(r"^A: expected dtype float16, got complex64$", GEMM, [a[0].astype(np.complex64),
                                                               *a[1:]])


def test_rank_and_static_dims():
    a = gemm_args()
    fails(r"^A: expected 2 dims \[M, 64\], got 3 \(shape \(8, 64, 1\)\)$", GEMM,
          [a[0].reshape(8, 64, 1), *a[1:]])
    fails(r"^B: dim 0 must be 64, got 32$", GEMM, [a[0], np.zeros((32, 16), np.float16),
                                                   *a[2:]])


def test_symbolic_dims_are_consistent():
    a = gemm_args(m=1000, n=16)
    fails(r"^C: dim 0 is M=512 here but M=1000 from A$", GEMM,
          [*a[:2], np.zeros((512, 16), np.float32), 1.0])
    fails(r"^C: dim 1 is N=17 here but N=16 from B$", GEMM,
          [*a[:2], np.zeros((1000, 17), np.float32), 1.0])
    # the same dim twice in one tensor
    sq = params(t("X", "float32", ["n", "n"]))
    fails(r"^X: dim 1 is n=4 here but n=3 from X$", sq, [np.zeros((3, 4), np.float32)])
    assert bind_args(sq, [np.zeros((3, 3), np.float32)], "cpu").dims == {"n": 3}


def test_zero_sized_dims_bind():
    b = bind_args(GEMM, gemm_args(m=0), "cpu")
    assert b.dims == {"M": 0, "N": 16}


def test_contiguity():
    a = gemm_args()
    base = np.zeros((16, 8), np.float32)
    fails(r"^C: not contiguous \(strides \(1, 8\)\); pass numpy.ascontiguousarray", GEMM,
          [*a[:2], base.T, 1.0])
    fails(r"^C: not contiguous", GEMM, [*a[:2], np.zeros((8, 32), np.float32)[:, ::2], 1.0])
    fails(r"^C: not contiguous", GEMM, [*a[:2], np.zeros((8, 16), np.float32)[::-1], 1.0])
    # size-1 dims may have any stride; a sliced row block is still contiguous
    ok = np.zeros((8, 1, 16), np.float32)[:, 0, :]
    bind_args(GEMM, [*a[:2], ok, 1.0], "cpu")
    bind_args(GEMM, [*a[:2], np.zeros((20, 16), np.float32)[4:12], 1.0], "cpu")


def test_is_c_contiguous():
    assert is_c_contiguous((2, 3), (3, 1))
    assert is_c_contiguous((2, 3), None)
    assert is_c_contiguous((1, 3), (99, 1))
    assert is_c_contiguous((0, 3), (1, 5))
    assert not is_c_contiguous((2, 3), (1, 2))
    assert not is_c_contiguous((2, 3), (3, -1))


def test_alignment():
    ps = params(t("X", "float32", ["n"], align=16), t("Y", "float32", ["n"]))
    raw = np.zeros(64, np.float32)
    off = (-raw.ctypes.data % 16) // 4
    x = raw[off:off + 8]
    bind_args(ps, [x, x], "cpu")
    fails(r"^X: data pointer 0x[0-9a-f]+ is not aligned to 16 bytes", ps, [x[1:], x[1:]])
    bind_args(ps, [x[:7], x[1:]], "cpu")  # default alignment: the element size
    odd = np.frombuffer(bytearray(64), np.uint8)[1:33].view(np.float32)
    fails(r"^Y: data pointer 0x[0-9a-f]+ is not aligned to 4 bytes", ps, [x, odd])


def test_scalars():
    ps = params(s("i", "int8"), s("u", "uint32"), s("f", "float16"), s("flag", "bool"),
                s("d", "float64"))
    assert bind_args(ps, [-128, 2**32 - 1, 2, True, 1e300], "cpu").values == \
        [-128, 2**32 - 1, 2.0, True, 1e300]
    assert bind_args(ps, [np.int8(3), np.uint32(7), np.float16(0.5), np.bool_(False),
                          float("nan")], "cpu").values[:4] == [3, 7, 0.5, False]
    fails(r"^i: 128 is out of range for int8 \[-128, 127\]$", ps, [128, 0, 0.0, True, 0.0])
    fails(r"^u: -1 is out of range for uint32", ps, [0, -1, 0.0, True, 0.0])
    fails(r"^i: expected an int for int8, got float$", ps, [1.0, 0, 0.0, True, 0.0])
    fails(r"^i: expected an int for int8, got bool$", ps, [True, 0, 0.0, True, 0.0])
    fails(r"^f: 70000.0 is out of range for float16", ps, [0, 0, 70000, True, 0.0])
    fails(r"^f: expected a float or int for float16, got str$", ps, [0, 0, "1", True, 0.0])
    fails(r"^flag: expected a bool, got int$", ps, [0, 0, 0.0, 1, 0.0])
    assert bind_args(ps, [0, 0, float("inf"), True, 0.0], "cpu").values[2] == float("inf")


def test_device_mismatch_cpu_kernel():
    a = gemm_args()
    fails(r"^A: on cuda but the kernel runs on cpu$", GEMM, [cai((8, 64), "<f2"), *a[1:]])


def test_device_mismatch_cuda_kernel():
    fails(r"^A: on cpu but the kernel runs on cuda$", GEMM, gemm_args(), device="cuda")


def cai(shape, typestr, ptr=1 << 20, strides=None, device_id=None):
    obj = types.SimpleNamespace(__cuda_array_interface__={
        "shape": shape, "typestr": typestr, "data": (ptr, False), "strides": strides,
        "version": 3})
    if device_id is not None:
        obj.device = types.SimpleNamespace(id=device_id)
    return obj


def test_cuda_array_interface_objects():
    a = cai((8, 64), "<f2", device_id=1)
    b = cai((64, 16), "<f2", device_id=1)
    c = cai((8, 16), "<f4", device_id=1)
    bound = bind_args(GEMM, [a, b, c, 2.0], "cuda")
    assert bound.device_index == 1 and bound.dims == {"M": 8, "N": 16}
    assert bound.values[0].framework == "cuda_array_interface"
    fails(r"^C: on cuda:0 but A is on cuda:1$", GEMM,
          [a, b, cai((8, 16), "<f4", device_id=0), 2.0], "cuda")
    fails(r"^C: expected dtype float32, got <f8$", GEMM, [a, b, cai((8, 16), "<f8"), 2.0],
          "cuda")
    fails(r"^C: not contiguous \(strides \(1, 8\)\)", GEMM,
          [a, b, cai((8, 16), "<f4", strides=(4, 32)), 2.0], "cuda")
    fails(r"^A: data pointer 0x100001 is not aligned to 2 bytes", GEMM,
          [cai((8, 64), "<f2", ptr=(1 << 20) + 1), b, c, 2.0], "cuda")


def test_array_interface_objects():
    arr = np.zeros((8, 16), np.float32)
    holder = types.SimpleNamespace(__array_interface__=arr.__array_interface__)
    view = as_tensor(holder)
    assert view is not None and view.framework == "array_interface"
    assert view.ptr == arr.ctypes.data and view.dtype == "float32" and view.device == "cpu"
    a = gemm_args()
    assert bind_args(GEMM, [*a[:2], holder, 1.0], "cpu").dims == {"M": 8, "N": 16}


def test_numpy_extension_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ps = params(t("X", "bfloat16", ["n"]), t("Y", "float8_e4m3", ["n"]),
                t("Z", "float8_e5m2", ["n"]))
    bind_args(ps, [np.zeros(4, ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.float8_e4m3fn),
                   np.zeros(4, ml_dtypes.float8_e5m2)], "cpu")
    # ml_dtypes' IEEE-style e4m3 (with infinities) is a different type
    fails(r"^Y: expected dtype float8_e4m3, got float8_e4m3$", ps,
          [np.zeros(4, ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.float8_e4m3),
           np.zeros(4, ml_dtypes.float8_e5m2)])


# --- a stand-in for torch: as_tensor only needs sys.modules["torch"].Tensor -------------------


class _Device:
    def __init__(self, kind, index=None):
        self.type, self.index = kind, index


class _Dtype:
    _interned: ClassVar[dict] = {}

    def __init__(self, name):
        self.name = name

    @classmethod
    def of(cls, name):
        return cls._interned.setdefault(name, cls(name))

    def __str__(self):
        return f"torch.{self.name}"


class FakeTensor:
    def __init__(self, shape, dtype, device=("cpu", None), strides=None, ptr=1 << 24):
        self.shape, self.dtype, self.device = shape, _Dtype.of(dtype), _Device(*device)
        self._strides = strides or tuple(
            int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self._ptr = ptr

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def is_contiguous(self):
        return is_c_contiguous(self.shape, self._strides)


@pytest.fixture
def fake_torch(monkeypatch):
    mod = types.ModuleType("torch")
    mod.Tensor = FakeTensor
    for name in TORCH_DTYPES:  # dtypes are singletons in torch; the fake interns them too
        setattr(mod, name, _Dtype.of(name))
    monkeypatch.setitem(sys.modules, "torch", mod)
    return mod


def test_torch_tensors(fake_torch):
    cuda0 = ("cuda", 0)
    a = FakeTensor((8, 64), "float16", cuda0)
    b = FakeTensor((64, 16), "float16", cuda0)
    c = FakeTensor((8, 16), "float32", cuda0)
    bound = bind_args(GEMM, [a, b, c, 1.0], "cuda")
    assert bound.uses_torch and bound.device_index == 0
    fails(r"^A: on cpu but the kernel runs on cuda$", GEMM,
          [FakeTensor((8, 64), "float16"), b, c, 1.0], "cuda")
    fails(r"^B: on cuda:1 but A is on cuda:0$", GEMM,
          [a, FakeTensor((64, 16), "float16", ("cuda", 1)), c, 1.0], "cuda")
    fails(r"^C: expected dtype float32, got bfloat16$", GEMM,
          [a, b, FakeTensor((8, 16), "bfloat16", cuda0), 1.0], "cuda")
    fails(r"^A: not contiguous \(strides \(1, 8\)\); call .contiguous\(\)$", GEMM,
          [FakeTensor((8, 64), "float16", cuda0, strides=(1, 8)), b, c, 1.0], "cuda")
    fails(r"^A: on meta but the kernel runs on cuda$", GEMM,
          [FakeTensor((8, 64), "float16", ("meta", None)), b, c, 1.0], "cuda")
    fp8 = params(t("X", "float8_e4m3", ["n"]))
    bind_args(fp8, [FakeTensor((4,), "float8_e4m3fn")], "cpu")
    fails(r"^X: expected dtype float8_e4m3, got float8_e4m3fnuz$", fp8,
          [FakeTensor((4,), "float8_e4m3fnuz")], "cpu")


def test_empty_torch_tensor_skips_alignment(fake_torch):
    ps = params(t("X", "float32", ["n"], align=64))
    bind_args(ps, [FakeTensor((0,), "float32", ptr=0)], "cpu")
    fails(r"X: data pointer 0x4 is not aligned to 64", ps, [FakeTensor((1,), "float32", ptr=4)])


def test_real_torch_if_installed():
    torch = pytest.importorskip("torch")
    ps = params(t("X", "bfloat16", ["n", 4]))
    x = torch.zeros((3, 4), dtype=torch.bfloat16)
    b = bind_args(ps, [x], "cpu")
    assert b.dims == {"n": 3} and b.values[0].ptr == x.data_ptr() and b.uses_torch
    fails(r"^X: not contiguous \(strides \(1, 3\)\); call .contiguous\(\)$", ps,
          [torch.zeros((4, 3), dtype=torch.bfloat16).T])


# --- FastBinder: never more permissive than bind_args, and equal when it answers --------------


def _summary(b):
    return (b.dims, b.device_index, b.uses_torch,
            [(v.ptr, tuple(v.shape), v.dtype) if isinstance(v, TensorView) else (type(v), v)
             for v in b.values])


def _agree(ps, args, device):
    fast = FastBinder(ps, device).bind(args)
    try:
        ref = bind_args(ps, args, device)
    except LaunchError:
        assert fast is None, args
        return "rejected"
    if fast is None:
        return "fallback"
    assert _summary(fast) == _summary(ref)
    return "fast"


def test_fast_binder_numpy():
    a = gemm_args()
    cases = {
        "fast": [a, [a[0], a[1], a[2], 2], [np.zeros((0, 64), np.float16), a[1],
                                            np.zeros((0, 16), np.float32), 1.0]],
        "rejected": [a[:3], [a[0].astype(np.float32), *a[1:]], [*a[:2], a[2][:4, :8], 1.0],
                     [a[0], a[1], np.zeros((9, 16), np.float32), 1.0], [*a[:3], 1e39],
                     [*a[:3], "x"], [a[0].T.copy().T, *a[1:]], [a[0][:, ::2], *a[1:]]],
        "fallback": [[*a[:3], np.float32(1.0)], [*a[:3], float("inf")]],
    }
    for want, arg_lists in cases.items():
        for args in arg_lists:
            assert _agree(GEMM, args, "cpu") == want, (want, args)
    ints = params(s("i", "int8"), s("u", "uint64"), s("flag", "bool"))
    assert _agree(ints, [-128, 2**64 - 1, False], "cpu") == "fast"
    assert _agree(ints, [128, 0, False], "cpu") == "rejected"
    assert _agree(ints, [True, 0, False], "cpu") == "rejected"
    assert _agree(ints, [0, 0, 1], "cpu") == "rejected"
    assert _agree(ints, [np.int8(1), 0, np.bool_(True)], "cpu") == "fallback"


def test_fast_binder_alignment_and_dims():
    ps = params(t("X", "float32", ["n", "n"], align=64))
    raw = np.zeros(200, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    good = raw[off:off + 9].reshape(3, 3)
    assert _agree(ps, [good], "cpu") == "fast"
    assert _agree(ps, [raw[off + 1:off + 10].reshape(3, 3)], "cpu") == "rejected"
    assert _agree(ps, [raw[off:off + 12].reshape(3, 4)], "cpu") == "rejected"


def test_fast_binder_torch(fake_torch):
    c0, c1 = ("cuda", 0), ("cuda", 1)
    a = FakeTensor((8, 64), "float16", c0)
    b = FakeTensor((64, 16), "float16", c0)
    c = FakeTensor((8, 16), "float32", c0)
    assert _agree(GEMM, [a, b, c, 1.0], "cuda") == "fast"
    assert _agree(GEMM, [a, b, c, 1.0], "cpu") == "rejected"
    assert _agree(GEMM, [a, FakeTensor((64, 16), "float16", c1), c, 1.0], "cuda") == "rejected"
    assert _agree(GEMM, [a, b, FakeTensor((8, 16), "float32", c0, strides=(1, 8)), 1.0],
                  "cuda") == "rejected"
    assert _agree(GEMM, [a, b, FakeTensor((8, 16), "float16", c0), 1.0], "cuda") == "rejected"
    assert _agree(GEMM, [a, b, FakeTensor((8, 16), "float32", c0, ptr=(1 << 24) + 2), 1.0],
                  "cuda") == "rejected"
    cpu = [FakeTensor((8, 64), "float16"), FakeTensor((64, 16), "float16"),
           FakeTensor((8, 16), "float32"), 1.0]
    assert _agree(GEMM, cpu, "cpu") == "fast"
    assert _agree(GEMM, [*cpu[:3], cai((8, 16), "<f4")], "cuda") == "rejected"


def test_fast_binder_extension_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ps = params(t("X", "bfloat16", ["n"]), t("Y", "float8_e4m3", ["n"]))
    assert _agree(ps, [np.zeros(4, ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.float8_e4m3fn)],
                  "cpu") == "fast"
    assert _agree(ps, [np.zeros(4, ml_dtypes.bfloat16), np.zeros(4, ml_dtypes.float8_e4m3)],
                  "cpu") == "rejected"


def test_tensors_past_32_bit_indexing_are_refused():
    """Kernels index with int32: a tensor of 2^31 elements would wrap an offset past its end.
    (A broadcast view costs no memory; it is refused before the contiguity check reads it.)"""
    from tiled.runtime.args import MAX_ELEMENTS

    p = Param("X", "tensor", "uint8", ("N",))
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (MAX_ELEMENTS + 1,), (0,))
    with pytest.raises(LaunchError, match=r"X: 2147483648 elements; tiled kernels index"):
        bind_args([p], [big], "cpu")
