"""The per-entry records of a launch manifest: `Param` (one argument of the kernel's
Python-level signature) and `KernelArg` (one C parameter of a CUDA kernel, TMA descriptors
included), each checked on its own as it is read, and `_check_tensor_map`, the TMA rules
between a tensor_map entry and its tensor. Separate from tiled.runtime.manifest, which keeps
the rules that span the whole manifest and its (de)serialization; the JSON form of both
records is documented there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiled.ir import dtypes
from tiled.runtime.manifest_base import _dtype, _fail, _ident, _is_int

KERNEL_ARG_KINDS = ("tensor", "scalar", "dim", "tensor_map")
TMA_SWIZZLES = (0, 32, 64, 128)  # tensor_map swizzle spans in bytes; 0: none
TMA_MAX_BOX = 256  # elements per box dim (cuTensorMapEncodeTiled)
TMA_MAX_RANK = 5  # dims of a tensor_map


@dataclass(frozen=True)
class Param:
    """One parameter of the kernel's Python-level signature."""

    name: str
    kind: str  # "tensor" | "scalar"
    dtype: str
    shape: tuple[int | str, ...] | None = None  # tensors only
    align: int | None = None  # tensors only; bytes; None: the element size

    @property
    def alignment(self) -> int:
        """Required data pointer alignment in bytes."""
        return self.align if self.align is not None else dtypes.nbytes(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "dtype": self.dtype}
        if self.shape is not None:
            d["shape"] = list(self.shape)
        if self.align is not None:
            d["align"] = self.align
        return d

    @classmethod
    def from_dict(cls, d: object, where: str) -> Param:
        if not isinstance(d, dict):
            raise _fail(where, f"expected an object, got {type(d).__name__}")
        kind = d.get("kind")
        allowed = {"tensor": {"name", "kind", "dtype", "shape", "align"},
                   "scalar": {"name", "kind", "dtype"}}.get(kind) if isinstance(kind, str) \
            else None
        if allowed is None:
            raise _fail(f"{where}.kind", f"expected 'tensor' or 'scalar', got {kind!r}")
        extra = set(d) - allowed
        if extra:
            raise _fail(where, f"unexpected field(s) {sorted(extra)} for a {kind}")
        for key in ("name", "dtype"):
            if key not in d:
                raise _fail(where, f"missing field {key!r}")
        name = _ident(d["name"], f"{where}.name")
        dtype = _dtype(d["dtype"], f"{where}.dtype")
        if kind == "scalar":
            return cls(name, kind, dtype)
        if "shape" not in d:
            raise _fail(where, "missing field 'shape'")
        shape = d["shape"]
        if not isinstance(shape, list | tuple):
            raise _fail(f"{where}.shape", f"expected a list, got {shape!r}")
        for i, s in enumerate(shape):
            if not ((_is_int(s) and s >= 0) or isinstance(s, str)):
                raise _fail(f"{where}.shape[{i}]", f"expected an int >= 0 or a dim name, got {s!r}")
            if isinstance(s, str):
                _ident(s, f"{where}.shape[{i}]")
        align = d.get("align")
        if align is not None and not (_is_int(align) and align > 0 and align & (align - 1) == 0):
            raise _fail(f"{where}.align", f"expected a power of two, got {align!r}")
        return cls(name, kind, dtype, tuple(shape), align)


@dataclass(frozen=True)
class KernelArg:
    """One C parameter of a CUDA kernel: a param's device pointer, a param's scalar value, the
    value of a symbolic dim, or a TMA descriptor of a tensor param (see the schema in
    tiled.runtime.manifest)."""

    kind: str  # "tensor" | "scalar" | "dim" | "tensor_map"
    param: int | None = None  # tensor / scalar / tensor_map: index into params
    name: str | None = None  # dim: the dim's name
    dtype: str | None = None  # dim: int32 | int64
    box: tuple[int, ...] | None = None  # tensor_map: elements per dim, innermost first
    swizzle: int | None = None  # tensor_map: bytes, one of TMA_SWIZZLES

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "dim":
            return {"kind": "dim", "name": self.name, "dtype": self.dtype}
        if self.kind == "tensor_map":
            return {"kind": "tensor_map", "param": self.param, "box": list(self.box or ()),
                    "swizzle": self.swizzle}
        return {"kind": self.kind, "param": self.param}

    @classmethod
    def from_dict(cls, d: object, where: str) -> KernelArg:
        if not isinstance(d, dict):
            raise _fail(where, f"expected an object, got {type(d).__name__}")
        kind = d.get("kind")
        if kind == "dim":
            if set(d) != {"kind", "name", "dtype"}:
                raise _fail(where, "a dim entry has exactly the fields kind, name, dtype")
            if d["dtype"] not in ("int32", "int64", "uint32", "uint64"):
                raise _fail(f"{where}.dtype", f"expected int32 or int64, got {d['dtype']!r}")
            return cls("dim", name=_ident(d["name"], f"{where}.name"), dtype=d["dtype"])
        if kind in ("tensor", "scalar"):
            if set(d) != {"kind", "param"} or not _is_int(d["param"]):
                raise _fail(where, f"a {kind} entry has exactly the fields kind, param (an int)")
            return cls(kind, param=d["param"])
        if kind == "tensor_map":
            if set(d) != {"kind", "param", "box", "swizzle"}:
                raise _fail(where, "a tensor_map entry has exactly the fields kind, param, box, "
                            f"swizzle; got {sorted(d)}")
            if not _is_int(d["param"]):
                raise _fail(f"{where}.param", f"expected an int, got {d['param']!r}")
            box = d["box"]
            if not isinstance(box, list | tuple) or not 1 <= len(box) <= TMA_MAX_RANK:
                raise _fail(f"{where}.box", f"expected [inner, ..., outer] (1 to {TMA_MAX_RANK} "
                            f"ints, one per dim), got {box!r}")
            for j, b in enumerate(box):
                if not (_is_int(b) and 1 <= b <= TMA_MAX_BOX):
                    raise _fail(f"{where}.box[{j}]", f"expected an int in 1..{TMA_MAX_BOX} "
                                f"(TMA box limit), got {b!r}")
            if not _is_int(d["swizzle"]) or d["swizzle"] not in TMA_SWIZZLES:
                raise _fail(f"{where}.swizzle", f"expected one of "
                            f"{', '.join(map(str, TMA_SWIZZLES))} (bytes), got {d['swizzle']!r}")
            return cls("tensor_map", param=d["param"], box=tuple(box), swizzle=d["swizzle"])
        raise _fail(f"{where}.kind", f"expected one of {', '.join(map(repr, KERNEL_ARG_KINDS))}, "
                    f"got {kind!r}")


def _check_tensor_map(ka: KernelArg, p: Param, k: int, where: str) -> None:
    """The TMA rules a manifest alone decides: a box for each of the tensor's dims, and one its
    dtype can encode."""
    if p.kind != "tensor":
        raise _fail(f"{where}.param", f"a tensor_map needs a tensor, but params[{k}] ({p.name}) "
                    f"is a {p.kind}")
    shape = list(p.shape or ())
    box = ka.box or ()
    if len(shape) != len(box):
        raise _fail(f"{where}.box", f"params[{k}] ({p.name}) has shape {shape} ({len(shape)}-D) "
                    f"but the box has {len(box)} entries; a tensor_map needs one per dim")
    size = dtypes.nbytes(p.dtype)
    inner, swizzle = box[0], ka.swizzle or 0
    if inner * size % 16:
        raise _fail(f"{where}.box[0]", f"{inner} {p.dtype} elements are {inner * size} bytes; "
                    f"TMA needs the box's inner extent to be a multiple of 16 bytes "
                    f"(a multiple of {max(1, 16 // size)} elements)")
    if swizzle and inner * size > swizzle:
        raise _fail(f"{where}.box[0]", f"{inner} {p.dtype} elements are {inner * size} bytes, "
                    f"more than the {swizzle}-byte swizzle span; use box[0] <= "
                    f"{swizzle // size} or a wider swizzle")
