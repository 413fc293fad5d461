"""Argument checks against a manifest's params, for every backend. Pure Python; torch is used
only when the caller already imported it (a torch tensor cannot exist otherwise).

Accepted tensors: numpy arrays (cpu), torch tensors (cpu or cuda), objects exposing
`__cuda_array_interface__` (cuda, e.g. cupy) or `__array_interface__` (cpu).
Every failure raises LaunchError naming the parameter and the problem, before any launch.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime.manifest import Param

# Framework dtype names -> manifest dtype names. e4m3 means the finite "fn" variant everywhere
# in tiled; ml_dtypes' IEEE-style float8_e4m3 is a different type and is not accepted.
_COMMON = {n: n for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                          "uint64", "float16", "bfloat16", "float32", "float64", "float8_e5m2")}
NUMPY_DTYPES = {**_COMMON, "float8_e4m3fn": "float8_e4m3"}
TORCH_DTYPES = {**_COMMON, "float8_e4m3fn": "float8_e4m3"}
# __array_interface__ / __cuda_array_interface__ typestr (little-endian or byte) -> dtype.
TYPESTR_DTYPES = {"|b1": "bool", "|i1": "int8", "<i2": "int16", "<i4": "int32", "<i8": "int64",
                  "|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<u8": "uint64",
                  "<f2": "float16", "<f4": "float32", "<f8": "float64"}

# Kernels compute element offsets in int32 (TVM's index type here): a larger tensor would wrap
# an offset past its end, so the runtime refuses it.
MAX_ELEMENTS = (1 << 31) - 1

_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
              "float32": 3.4028234663852886e38, "float64": math.inf,
              "float8_e4m3": 448.0, "float8_e5m2": 57344.0}


@dataclass(slots=True)
class TensorView:
    """What the checks and the launchers need from a tensor argument. `strides` are in elements
    (None: C-contiguous by construction); `dtype` is a manifest dtype name or None when the
    framework's dtype has none (`dtype_text` then says what it was)."""

    obj: object
    framework: str  # "numpy" | "torch" | "cuda_array_interface" | "array_interface"
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: str | None
    dtype_text: str
    device: str  # "cpu" | "cuda" | another torch device type
    device_index: int | None  # cuda: the ordinal, None when the object does not say

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def where(self) -> str:
        return self.device if self.device_index is None else f"{self.device}:{self.device_index}"


@dataclass(slots=True)
class BoundArgs:
    """The checked arguments: `values[i]` is a TensorView or a Python int / float / bool for
    params[i]; `dims` maps each symbolic dim to its value; `device_index` is the first tensor's
    device ordinal (cuda) or None."""

    values: list[TensorView | int | float | bool] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    device_index: int | None = None
    uses_torch: bool = False


def _torch_view(t) -> TensorView:
    name = str(t.dtype).removeprefix("torch.")
    dev = t.device
    return TensorView(t, "torch", int(t.data_ptr()), tuple(int(s) for s in t.shape),
                      tuple(int(s) for s in t.stride()), TORCH_DTYPES.get(name), name,
                      dev.type, dev.index if dev.type == "cuda" else None)


def _numpy_view(a) -> TensorView:
    name = a.dtype.name
    itemsize = a.dtype.itemsize
    strides = tuple(s // itemsize if s % itemsize == 0 else -1 for s in a.strides)
    return TensorView(a, "numpy", int(a.ctypes.data), tuple(a.shape), strides,
                      NUMPY_DTYPES.get(name), name, "cpu", None)


def _interface_view(obj, iface: dict, device: str) -> TensorView:
    typestr = iface.get("typestr", "?")
    shape = tuple(int(s) for s in iface["shape"])
    strides = None
    if iface.get("strides") is not None:
        itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
        strides = tuple(s // itemsize if s % itemsize == 0 else -1 for s in iface["strides"])
    index = None
    if device == "cuda":
        dev = getattr(obj, "device", None)
        index = getattr(dev, "id", None)  # cupy; other producers: resolved by the launcher
    data = iface.get("data") or (0, False)
    return TensorView(obj, f"{'cuda_' if device == 'cuda' else ''}array_interface", int(data[0]),
                      shape, strides, TYPESTR_DTYPES.get(typestr), typestr, device, index)


def as_tensor(obj: object) -> TensorView | None:
    """A TensorView for a tensor-like object, or None when `obj` is not one."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_view(obj)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_view(obj)
    iface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(iface, dict):
        return _interface_view(obj, iface, "cuda")
    iface = getattr(obj, "__array_interface__", None)
    if isinstance(iface, dict):
        return _interface_view(obj, iface, "cpu")
    return None


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    """C-contiguity in elements; dims of extent 1 may carry any stride (as torch and numpy
    agree), and an empty tensor is contiguous."""
    if strides is None or 0 in shape:
        return True
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _type_name(obj: object) -> str:
    return type(obj).__name__


def _check_scalar(p: Param, value: object) -> int | float | bool:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if as_tensor(value) is not None:
        raise LaunchError(f"{p.name}: expected a {p.dtype} scalar, got a tensor "
                          f"({_type_name(value)})")
    if dtypes.is_bool(p.dtype):
        if not isinstance(value, bool):
            raise LaunchError(f"{p.name}: expected a bool, got {_type_name(value)}")
        return value
    if dtypes.is_int(p.dtype):
        if not isinstance(value, int) or isinstance(value, bool):
            raise LaunchError(f"{p.name}: expected an int for {p.dtype}, got {_type_name(value)}")
        bits = dtypes.bits(p.dtype)
        lo, hi = (0, (1 << bits) - 1) if p.dtype.startswith("u") else \
            (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if not lo <= value <= hi:
            raise LaunchError(f"{p.name}: {value} is out of range for {p.dtype} [{lo}, {hi}]")
        return value
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise LaunchError(f"{p.name}: expected a float or int for {p.dtype}, got "
                          f"{_type_name(value)}")
    value = float(value)
    if math.isfinite(value) and abs(value) > _FLOAT_MAX[p.dtype]:
        raise LaunchError(f"{p.name}: {value!r} is out of range for {p.dtype} "
                          f"(largest finite value {_FLOAT_MAX[p.dtype]!r})")
    return value


def _contiguity_hint(t: TensorView) -> str:
    if t.framework == "torch":
        return "call .contiguous()"
    if t.framework == "numpy":
        return "pass numpy.ascontiguousarray(...)"
    return "pass a C-contiguous copy"


def _check_tensor(p: Param, value: object, device: str, bound: BoundArgs,
                  first: dict[str, tuple[str, int]], device_of: list[tuple[str, TensorView]]
                  ) -> TensorView:
    t = as_tensor(value)
    if t is None:
        raise LaunchError(f"{p.name}: expected a tensor, got {_type_name(value)}")
    if t.device != device:
        raise LaunchError(f"{p.name}: on {t.where} but the kernel runs on {device}")
    if t.device_index is not None:
        known = [(n, o) for n, o in device_of if o.device_index is not None]
        if not known:
            bound.device_index = t.device_index
        elif known[0][1].device_index != t.device_index:
            raise LaunchError(f"{p.name}: on {t.where} but {known[0][0]} is on "
                              f"{known[0][1].where}")
    device_of.append((p.name, t))
    if t.dtype != p.dtype:
        raise LaunchError(f"{p.name}: expected dtype {p.dtype}, got {t.dtype_text}")
    shape = p.shape or ()
    if len(t.shape) != len(shape):
        want = ", ".join(str(s) for s in shape)
        raise LaunchError(f"{p.name}: expected {len(shape)} dims [{want}], got {len(t.shape)} "
                          f"(shape {t.shape})")
    for i, (want, got) in enumerate(zip(shape, t.shape, strict=True)):
        if isinstance(want, int):
            if got != want:
                raise LaunchError(f"{p.name}: dim {i} must be {want}, got {got}")
        elif want in bound.dims:
            if got != bound.dims[want]:
                src, _ = first[want]
                raise LaunchError(f"{p.name}: dim {i} is {want}={got} here but "
                                  f"{want}={bound.dims[want]} from {src}")
        else:
            bound.dims[want] = got
            first[want] = (p.name, i)
    if t.numel > MAX_ELEMENTS:
        raise LaunchError(f"{p.name}: {t.numel} elements; tiled kernels index tensors with "
                          f"32-bit integers, so a tensor holds at most {MAX_ELEMENTS} (split it)")
    if not is_c_contiguous(t.shape, t.strides):
        raise LaunchError(f"{p.name}: not contiguous (strides {t.strides}); "
                          f"{_contiguity_hint(t)}")
    if t.numel and t.ptr % p.alignment:
        raise LaunchError(f"{p.name}: data pointer {t.ptr:#x} is not aligned to {p.alignment} "
                          f"bytes, as the kernel requires")

    if t.framework == "torch":
        bound.uses_torch = True
    return t


def bind_args(params: Sequence[Param], args: Sequence[object], device: str) -> BoundArgs:
    """Checks `args` against `params` for a kernel running on `device` ("cpu" or "cuda") and
    binds the symbolic dims (each bound by its first use, then checked everywhere else)."""
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise LaunchError(f"expected {len(params)} arguments ({names}), got {len(args)}")
    bound = BoundArgs()
    first: dict[str, tuple[str, int]] = {}
    device_of: list[tuple[str, TensorView]] = []
    for p, value in zip(params, args, strict=True):
        if p.kind == "tensor":
            bound.values.append(_check_tensor(p, value, device, bound, first, device_of))
        else:
            bound.values.append(_check_scalar(p, value))
    return bound


class FastBinder:
    """bind_args for the common case, specialised to one kernel's params: torch tensors, numpy
    arrays and Python scalars that pass every check. It answers None for anything else (other
    objects, any failed check), and the caller then asks bind_args for the verdict and its
    message: it never accepts what bind_args rejects. Thread-safe."""

    def __init__(self, params: Sequence[Param], device: str):
        self.params, self.device = tuple(params), device
        # per param: ("t", dtype, shape, alignment) or ("b",) / ("i", lo, hi) / ("f", max)
        self._plan: list[tuple] = []
        for p in self.params:
            if p.kind == "tensor":
                self._plan.append(("t", p.dtype, p.shape, p.alignment))
            elif dtypes.is_bool(p.dtype):
                self._plan.append(("b",))
            elif dtypes.is_int(p.dtype):
                bits = dtypes.bits(p.dtype)
                self._plan.append(("i", 0, (1 << bits) - 1) if p.dtype[0] == "u" else
                                  ("i", -(1 << (bits - 1)), (1 << (bits - 1)) - 1))
            else:
                self._plan.append(("f", _FLOAT_MAX[p.dtype]))
        self._torch_table: dict[str, object] | None = None

    def _torch_dtypes(self, torch) -> dict[str, object]:
        table = self._torch_table
        if table is None:
            table = {ours: getattr(torch, name) for name, ours in TORCH_DTYPES.items()
                     if hasattr(torch, name)}  # an older torch lacks some
            self._torch_table = table
        return table

    def bind(self, args: Sequence[object]) -> BoundArgs | None:
        if len(args) != len(self._plan):
            return None
        torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
        torch_tensor = torch.Tensor if torch is not None else ()
        ndarray = np.ndarray if np is not None and self.device == "cpu" else ()
        cuda = self.device == "cuda"
        bound = BoundArgs()
        values, dims = bound.values, bound.dims
        torch_dtypes = None
        for plan, a in zip(self._plan, args, strict=True):
            kind, cls = plan[0], a.__class__
            if kind == "f":
                if (cls is not float and cls is not int) or not abs(a) <= plan[1]:
                    return None
                values.append(float(a))
                continue
            if kind == "i":
                if cls is not int or not plan[1] <= a <= plan[2]:
                    return None
                values.append(a)
                continue
            if kind == "b":
                if cls is not bool:
                    return None
                values.append(a)
                continue
            _, dtype, want, align = plan
            if isinstance(a, torch_tensor):
                torch_dtypes = torch_dtypes or self._torch_dtypes(torch)
                if a.dtype is not torch_dtypes.get(dtype) or \
                        a.is_cuda != cuda or not a.is_contiguous():
                    return None
                index = None
                if cuda:
                    index = a.get_device()
                    if bound.device_index is None:
                        bound.device_index = index
                    elif index != bound.device_index:
                        return None
                elif a.device.type != "cpu":
                    return None
                shape, ptr = a.shape, a.data_ptr()  # torch.Size is a tuple
                view = TensorView(a, "torch", ptr, shape, None, dtype, dtype, self.device, index)
                bound.uses_torch = True
            elif isinstance(a, ndarray):
                if _numpy_dtype(a.dtype) != dtype or not a.flags.c_contiguous:
                    return None
                shape, ptr = a.shape, a.__array_interface__["data"][0]
                view = TensorView(a, "numpy", ptr, shape, None, dtype, dtype, "cpu", None)
            else:
                return None
            if len(shape) != len(want):
                return None
            numel = 1
            for w, g in zip(want, shape, strict=True):
                numel *= g
                if w.__class__ is int:
                    if g != w:
                        return None
                elif dims.setdefault(w, g) != g:
                    return None
            if (numel and ptr % align) or numel > MAX_ELEMENTS:
                return None
            values.append(view)
        return bound


# numpy dtype object -> tiled dtype name (or None). A dtype's `.name` is computed in Python on
# every read (about 2 us); the objects are few and hashable.
_NUMPY_DTYPE_CACHE: dict[object, str | None] = {}


def _numpy_dtype(dt) -> str | None:
    try:
        return _NUMPY_DTYPE_CACHE[dt]
    except KeyError:
        name = _NUMPY_DTYPE_CACHE[dt] = NUMPY_DTYPES.get(dt.name)
        return name


def bind_fast(binder: FastBinder, args: Sequence[object]) -> BoundArgs:
    """The binder's answer, or bind_args' (which raises the LaunchError) when it has none."""
    bound = binder.bind(args)
    return bound if bound is not None else bind_args(binder.params, args, binder.device)


def bf16_bits(x: float) -> int:
    """float -> bfloat16 bits, rounding to nearest even (NaN stays NaN)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def scalar_bits(value: int | float | bool, dtype: str) -> int | float | bool:
    """A scalar parameter's value as a kernel argument holds it: 16-bit floats as their
    bits, everything else as it is."""
    if dtype == "float16":
        return struct.unpack("<H", struct.pack("<e", value))[0]
    if dtype == "bfloat16":
        return bf16_bits(float(value))
    return value


def dim_arg(kernel: str, name: str, value: int, fmt: str, dtype: str) -> int:
    """Dim `name`'s value for a kernel argument of struct format `fmt` (little-endian, e.g.
    "<i"); LaunchError naming `kernel` when the value does not fit."""
    bits = struct.calcsize(fmt) * 8
    lo, hi = (0, 2**bits - 1) if fmt in ("<I", "<Q") else \
        (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not lo <= value <= hi:
        raise LaunchError(f"{kernel}: dim {name}={value} does not fit the kernel's {dtype} "
                          "argument")
    return value
