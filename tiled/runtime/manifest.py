"""The launch manifest: the thin side's whole contract with the compiler. A manifest is plain
JSON; a client launches a kernel from the manifest and the artifact bytes alone.

    {"manifest_version": 1, "name": "gemm", "program_digest": <sha256 hex>,
     "target": "cuda:sm_90a", "backend": "cuda", "arch": "sm_90a",
     "artifact_format": "cubin", "artifact_sha256": <sha256 hex>, "symbol": "gemm_kernel",
     "params": [{"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["M", 1024],
                 "align": 16},
                {"name": "alpha", "kind": "scalar", "dtype": "float32"}],
     "kernel_args": [{"kind": "tensor", "param": 0}, {"kind": "scalar", "param": 1},
                     {"kind": "dim", "name": "M", "dtype": "int32"},
                     {"kind": "tensor_map", "param": 0, "box": [64, 128], "swizzle": 128}],
     "grid": [["ceildiv", "M", 128], 1, 1], "block": [128, 1, 1],
     "dynamic_smem_bytes": 49152, "cluster": [1, 1, 1],
     "requires": [["floormod", ["mul", 2, "K"], 16]],
     "fallback": {"symbol": "gemm_fallback_kernel", "kernel_args": [...], "grid": [...],
                  "block": [128, 1, 1], "dynamic_smem_bytes": 40960, "cluster": [1, 1, 1]},
     "action": {"v": 1, "program": <sha256 hex>, "target": {...}, "options": {...},
                "toolchain": <sha256 hex>, "namespace": ""}}

`requires` (optional) lists launch preconditions, expressions over the dims that must each
evaluate to 0 (a TMA descriptor's row stride that depends on a symbolic dim must be a multiple
of 16 bytes); a launch that fails one runs `fallback`, another kernel of the same artifact
with its own launch fields, or is refused when there is none. `action` (optional) is the
action record the cache key digests (tiled.cache.keys); the launch never reads it.

Shape entries are ints (static) or dim names (symbolic, bound by the arguments). Grid and block
entries are expressions: an int, a dim name, or `[op, a, b]` with op one of `OPS`.
`kernel_args` (cuda only) lists the kernel's C parameters in order, one of four kinds:

    tensor      {"kind": "tensor", "param": i}            the tensor's device pointer (8 bytes)
    scalar      {"kind": "scalar", "param": i}            the scalar's value, in its dtype
    dim         {"kind": "dim", "name": n, "dtype": t}    a symbolic dim; int32|int64|uint32|uint64
    tensor_map  {"kind": "tensor_map", "param": i,        a CUtensorMap (TMA descriptor, 128
                 "box": [inner, ..., outer],              bytes) passed by value to a
                 "swizzle": b}                            `const __grid_constant__ CUtensorMap`

A tensor_map's param is a tensor of 1 to 5 dims with a contiguous last dim; the runtime encodes
the descriptor at launch (cuTensorMapEncodeTiled: globalDim = the shape innermost first,
globalStrides = the byte strides of the outer dims, boxDim `box` in elements, one entry per dim
innermost first, swizzle `b` in {0, 32, 64, 128} bytes, out-of-bounds elements read as zeros).
Checked here: one box entry per dim, each in 1..256, box[0] times the element size a multiple
of 16 bytes and, when swizzled, at most `b` bytes.

Validation happens on construction; every problem raises ManifestError naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime.code_object import check_code_object
from tiled.runtime.metal_abi import check_metal

MANIFEST_VERSION = 1
KERNEL_ARG_KINDS = ("tensor", "scalar", "dim", "tensor_map")
TMA_SWIZZLES = (0, 32, 64, 128)  # tensor_map swizzle spans in bytes; 0: none
TMA_MAX_BOX = 256  # elements per box dim (cuTensorMapEncodeTiled)
TMA_MAX_RANK = 5  # dims of a tensor_map
DTYPES = tuple(dtypes.NAME_TO_ENUM)
OPS = ("add", "sub", "mul", "floordiv", "floormod", "ceildiv", "min", "max")
# backend -> the artifact format its loader takes; other backends are accepted by the manifest
# and refused by tiled.runtime.load until a loader exists.
FORMATS = {"cpu": "so", "cuda": "cubin", "rocm": "hsaco", "metal": "msl"}

Expr = int | str | tuple  # an int, a dim name, or (op, a, b); lists in JSON

_HEX64 = re.compile(r"[0-9a-f]{64}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ManifestError(LaunchError):
    """A manifest that does not follow the schema; the message names the field."""


def _fail(where: str, problem: str) -> ManifestError:
    return ManifestError(f"manifest {where}: {problem}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ident(v: object, where: str) -> str:
    if not isinstance(v, str) or not _IDENT.fullmatch(v):
        raise _fail(where, f"expected an identifier, got {v!r}")
    return v


def _dtype(v: object, where: str) -> str:
    if v not in DTYPES:
        raise _fail(where, f"unknown dtype {v!r}; known: {', '.join(DTYPES)}")
    return v  # type: ignore[return-value]


def expr_names(expr: Expr) -> set[str]:
    """The dim names an expression reads."""
    if isinstance(expr, str):
        return {expr}
    if isinstance(expr, list | tuple) and len(expr) == 3:
        return expr_names(expr[1]) | expr_names(expr[2])
    return set()


# A name a manifest expression may use besides the dims: the CUDA runtime binds it to the
# device's multiprocessor count (a persistent kernel's grid is min(blocks, k x the SM count),
# k its blocks per SM).
SM_COUNT_DIM = "tiled_sm_count"


def check_expr(expr: object, where: str) -> Expr:
    """Checks the expression's form (not its names); returns it with nodes as tuples."""
    if _is_int(expr):
        return expr  # type: ignore[return-value]
    if isinstance(expr, str):
        return _ident(expr, where)
    if isinstance(expr, list | tuple) and len(expr) == 3:
        if expr[0] not in OPS:
            raise _fail(where, f"unknown operator {expr[0]!r}; known: {', '.join(OPS)}")
        return (expr[0], check_expr(expr[1], where), check_expr(expr[2], where))
    raise _fail(where, f"expected an int, a dim name or [op, a, b], got {expr!r}")


def eval_expr(expr: Expr, dims: dict[str, int]) -> int:
    """Evaluates a manifest expression with the dims bound by a call. floordiv / floormod round
    toward negative infinity (Python's // and %), ceildiv up. Raises LaunchError on an unknown
    operator or name, a malformed node, or a division by zero."""
    if _is_int(expr):
        return expr  # type: ignore[return-value]
    if isinstance(expr, str):
        if expr not in dims:
            known = ", ".join(sorted(dims)) or "none"
            raise LaunchError(f"expression uses dim {expr!r}, which no argument binds "
                              f"(bound: {known})")
        return dims[expr]
    if not (isinstance(expr, list | tuple) and len(expr) == 3):
        raise LaunchError(f"malformed expression {expr!r}: expected int, name or [op, a, b]")
    op, a, b = expr[0], eval_expr(expr[1], dims), eval_expr(expr[2], dims)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op in ("floordiv", "floormod", "ceildiv"):
        if b == 0:
            raise LaunchError(f"division by zero evaluating {expr!r} with {dims}")
        return a // b if op == "floordiv" else a % b if op == "floormod" else -(-a // b)
    raise LaunchError(f"unknown operator {op!r} in {expr!r}; known: {', '.join(OPS)}")


_OP_FUNCS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "min": min, "max": max, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "ceildiv": lambda a, b: -(-a // b),
}


def compile_expr(expr: Expr) -> Callable[[dict[str, int]], int]:
    """A function of the dims that computes eval_expr(expr, dims), errors included, without
    walking the expression on every call. `expr` must have passed check_expr."""
    if _is_int(expr):
        return lambda dims: expr  # type: ignore[return-value]
    if isinstance(expr, str):
        def name(dims: dict[str, int]) -> int:
            v = dims.get(expr)
            return v if v is not None else eval_expr(expr, dims)
        return name
    f, a, b = _OP_FUNCS[expr[0]], compile_expr(expr[1]), compile_expr(expr[2])
    if expr[0] in ("floordiv", "floormod", "ceildiv"):
        def div(dims: dict[str, int]) -> int:
            y = b(dims)
            return f(a(dims), y) if y else eval_expr(expr, dims)  # raises: division by zero
        return div
    return lambda dims: f(a(dims), b(dims))


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
    value of a symbolic dim, or a TMA descriptor of a tensor param (see the module doc)."""

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


_REQUIRED = ("manifest_version", "name", "program_digest", "target", "backend", "arch",
             "artifact_format", "artifact_sha256", "symbol", "params")
_OPTIONAL = {"kernel_args": [], "grid": [1, 1, 1], "block": [1, 1, 1], "dynamic_smem_bytes": 0,
             "cluster": [1, 1, 1], "action": None, "requires": [], "fallback": None,
             "notes": None, "code_object": None, "metal": None, "pdl": False}
# The launch fields a fallback variant replaces (it shares the artifact and the params).
_FALLBACK_FIELDS = ("symbol", "kernel_args", "grid", "block", "dynamic_smem_bytes", "cluster")
_ACTION_FIELDS = {"v", "program", "target", "options", "toolchain", "namespace"}


def _check_action(action: object, program_digest: str) -> None:
    """The action record (tiled.cache.keys) whose digest is the entry's key: the cache and
    bundle import recompute the key from it and refuse an entry filed under another key."""
    if not isinstance(action, dict) or set(action) != _ACTION_FIELDS:
        raise _fail("action", f"expected an object with the fields {sorted(_ACTION_FIELDS)}")
    if action["program"] != program_digest:
        raise _fail("action.program", "names another program than program_digest")
    for key in ("toolchain", "program"):
        if not isinstance(action[key], str) or not _HEX64.fullmatch(action[key]):
            raise _fail(f"action.{key}", "expected 64 lowercase hex digits (sha256)")
    if not isinstance(action["options"], dict) or not isinstance(action["namespace"], str) \
            or not isinstance(action["target"], dict):
        raise _fail("action", "options and target must be objects, namespace a string")


@dataclass(frozen=True)
class Manifest:
    """A validated launch manifest. Immutable; compare with ==; (de)serialize with
    to_json / from_json (sorted keys: equal manifests give equal text)."""

    name: str
    program_digest: str
    target: str
    backend: str
    arch: str
    artifact_format: str
    artifact_sha256: str
    symbol: str
    params: tuple[Param, ...]
    kernel_args: tuple[KernelArg, ...] = ()
    grid: tuple[Expr, Expr, Expr] = (1, 1, 1)
    block: tuple[Expr, Expr, Expr] = (1, 1, 1)
    dynamic_smem_bytes: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)
    # The action record this manifest was compiled under (tiled.cache.keys.action_record), or
    # None for a manifest built by hand: the launch never reads it.
    action: dict | None = field(default=None, compare=False)
    # Launch preconditions: expressions over the dims, each must evaluate to 0 for this
    # launch; when one does not, the runtime launches `fallback` (the launch fields of
    # another kernel in the same artifact), or refuses the call when there is none.
    requires: tuple[Expr, ...] = ()
    fallback: dict | None = field(default=None, hash=False)
    # What a tool records beside the kernel (a JSON object; tiled.autotune: the tuning record
    # and the winning config). The launch never reads it.
    notes: dict | None = field(default=None, compare=False, hash=False)
    # rocm: the shipped code object's facts (tiled.runtime.code_object); None elsewhere.
    code_object: dict | None = field(default=None, hash=False)
    # metal: how the kernel binds its arguments (tiled.runtime.metal_abi); None elsewhere.
    metal: dict | None = field(default=None, hash=False)
    # cuda: the kernel holds a T.pdl_sync, so it is launched with programmatic stream
    # serialization (it may start before the kernels ahead of it end; tiled.lang.pdl).
    pdl: bool = False
    manifest_version: int = MANIFEST_VERSION
    _dims: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Direct construction may pass dicts / lists; normalize to the frozen forms (and check
        # Param / KernelArg objects built by hand through the same path as JSON).
        def put(key: str, value: object) -> None:
            object.__setattr__(self, key, value)

        for key in ("params", "kernel_args", "grid", "block", "cluster", "requires"):
            if not isinstance(getattr(self, key), list | tuple):
                raise _fail(key, f"expected a list, got {type(getattr(self, key)).__name__}")
        put("params", tuple(Param.from_dict(p.to_dict() if isinstance(p, Param) else p,
                                            f"params[{i}]") for i, p in enumerate(self.params)))
        put("kernel_args", tuple(
            KernelArg.from_dict(k.to_dict() if isinstance(k, KernelArg) else k,
                                f"kernel_args[{i}]") for i, k in enumerate(self.kernel_args)))
        for key in ("grid", "block", "requires"):
            put(key, tuple(check_expr(e, f"{key}[{i}]") for i, e in enumerate(getattr(self, key))))
        put("cluster", tuple(self.cluster))
        self._validate()
        if self.fallback is not None:
            self.fallback_manifest()  # validates the variant like any manifest

    @property
    def dims(self) -> tuple[str, ...]:
        """Symbolic dim names, in order of first appearance in the params."""
        return self._dims

    def _validate(self) -> None:
        if self.manifest_version != MANIFEST_VERSION:
            raise _fail("manifest_version", f"this runtime reads version {MANIFEST_VERSION}, "
                        f"got {self.manifest_version!r}")
        for key in ("name", "target", "backend", "arch", "artifact_format", "symbol"):
            v = getattr(self, key)
            if not isinstance(v, str) or not v:
                raise _fail(key, f"expected a non-empty string, got {v!r}")
        for key in ("program_digest", "artifact_sha256"):
            v = getattr(self, key)
            if not isinstance(v, str) or not _HEX64.fullmatch(v):
                raise _fail(key, f"expected 64 lowercase hex digits (sha256), got {v!r}")
        if not self.target.split(":")[0] == self.backend:
            raise _fail("target", f"{self.target!r} does not belong to backend {self.backend!r}")
        want = FORMATS.get(self.backend)
        if want is not None and self.artifact_format != want:
            raise _fail("artifact_format", f"backend {self.backend!r} produces {want!r}, "
                        f"got {self.artifact_format!r}")
        names: set[str] = set()
        dims: list[str] = []
        for i, p in enumerate(self.params):
            if p.name in names:
                raise _fail(f"params[{i}].name", f"duplicate parameter name {p.name!r}")
            names.add(p.name)
            for s in p.shape or ():
                if isinstance(s, str) and s not in dims:
                    dims.append(s)
        object.__setattr__(self, "_dims", tuple(dims))
        for i, ka in enumerate(self.kernel_args):
            where = f"kernel_args[{i}]"
            if ka.kind == "dim":
                if ka.name not in dims:
                    raise _fail(where, f"dim {ka.name!r} is not a dim of any tensor parameter")
            elif not 0 <= ka.param < len(self.params):  # type: ignore[operator]
                raise _fail(where, f"param index {ka.param} out of range "
                            f"(0..{len(self.params) - 1})")
            elif ka.kind == "tensor_map":
                _check_tensor_map(ka, self.params[ka.param], ka.param, where)  # type: ignore[index]
            elif self.params[ka.param].kind != ka.kind:  # type: ignore[index]
                p = self.params[ka.param]  # type: ignore[index]
                raise _fail(where, f"kind {ka.kind!r} but params[{ka.param}] ({p.name}) is a "
                            f"{p.kind}")
        for key in ("grid", "block"):
            exprs = getattr(self, key)
            if len(exprs) != 3:
                raise _fail(key, f"expected 3 entries, got {len(exprs)}")
            for j, e in enumerate(exprs):
                unknown = expr_names(e) - set(dims) - ({SM_COUNT_DIM} if key == "grid" else set())
                if unknown:
                    raise _fail(f"{key}[{j}]", f"uses {sorted(unknown)}, which no tensor "
                                f"parameter binds (dims: {', '.join(dims) or 'none'})")
        if not _is_int(self.dynamic_smem_bytes) or self.dynamic_smem_bytes < 0:
            raise _fail("dynamic_smem_bytes", f"expected an int >= 0, got "
                        f"{self.dynamic_smem_bytes!r}")
        if len(self.cluster) != 3 or not all(_is_int(c) and c >= 1 for c in self.cluster):
            raise _fail("cluster", f"expected 3 ints >= 1, got {list(self.cluster)!r}")
        if not isinstance(self.pdl, bool):
            raise _fail("pdl", f"expected true or false, got {self.pdl!r}")
        if self.action is not None:
            _check_action(self.action, self.program_digest)
        for j, e in enumerate(self.requires):
            unknown = expr_names(e) - set(dims)
            if unknown:
                raise _fail(f"requires[{j}]", f"uses {sorted(unknown)}, which no tensor "
                            f"parameter binds (dims: {', '.join(dims) or 'none'})")
        if self.backend == "rocm" or self.code_object is not None:
            if self.backend != "rocm":
                raise _fail("code_object", f"a rocm manifest's field; this one is "
                            f"{self.backend}'s")
            if self.code_object is None:
                raise _fail("code_object", "a rocm manifest needs it (the code object's "
                            "kernarg layout and resources)")
            check_code_object(self.code_object, self.kernel_args,
                              [self._arg_bytes(ka) for ka in self.kernel_args], _fail)
        if self.backend == "metal" or self.metal is not None:
            if self.backend != "metal":
                raise _fail("metal", f"a metal manifest's field; this one is {self.backend}'s")
            if self.metal is None:
                raise _fail("metal", "a metal manifest needs it (buffer indices and the "
                            "scalar-argument struct)")
            check_metal(self.metal, self.kernel_args,
                        [None if ka.kind == "tensor" else self._arg_bytes(ka)
                         for ka in self.kernel_args], _fail)
        if self.notes is not None and not isinstance(self.notes, dict):
            raise _fail("notes", f"expected an object, got {type(self.notes).__name__}")
        if self.fallback is not None and (not isinstance(self.fallback, dict) or
                                          set(self.fallback) != set(_FALLBACK_FIELDS)):
            raise _fail("fallback", f"expected an object with the fields "
                        f"{', '.join(_FALLBACK_FIELDS)}")

    def _arg_bytes(self, ka: KernelArg) -> int | None:
        """Bytes kernel argument `ka` takes in a kernarg segment (None: no fixed size)."""
        if ka.kind == "tensor":
            return 8
        if ka.kind == "dim":
            return 8 if ka.dtype in ("int64", "uint64") else 4
        if ka.kind == "scalar":
            return dtypes.nbytes(self.params[ka.param].dtype)  # type: ignore[index]
        return None

    def fallback_manifest(self) -> Manifest:
        """The fallback variant as a manifest of its own (same params and artifact, no
        preconditions). Raises ManifestError (naming `fallback.<field>`) when it is malformed,
        LaunchError when there is none."""
        if self.fallback is None:
            raise LaunchError(f"{self.name}: the manifest has no fallback variant")
        d = {**self.to_dict(), **self.fallback, "requires": [], "fallback": None}
        try:
            return Manifest.from_dict(d)
        except ManifestError as e:
            raise ManifestError(str(e).replace("manifest ", "manifest fallback.", 1)) from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest_version": self.manifest_version, "name": self.name,
            "program_digest": self.program_digest, "target": self.target,
            "backend": self.backend, "arch": self.arch, "artifact_format": self.artifact_format,
            "artifact_sha256": self.artifact_sha256, "symbol": self.symbol,
            "params": [p.to_dict() for p in self.params],
            "kernel_args": [k.to_dict() for k in self.kernel_args],
            "grid": [_expr_json(e) for e in self.grid],
            "block": [_expr_json(e) for e in self.block],
            "dynamic_smem_bytes": self.dynamic_smem_bytes, "cluster": list(self.cluster),
            **({"action": self.action} if self.action is not None else {}),
            **({"requires": [_expr_json(e) for e in self.requires]} if self.requires else {}),
            **({"fallback": self.fallback} if self.fallback is not None else {}),
            **({"notes": self.notes} if self.notes is not None else {}),
            **({"code_object": self.code_object} if self.code_object is not None else {}),
            **({"metal": self.metal} if self.metal is not None else {}),
            **({"pdl": True} if self.pdl else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: object) -> Manifest:
        if not isinstance(d, dict):
            raise ManifestError(f"manifest: expected a JSON object, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ManifestError(f"manifest: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            raise ManifestError(f"manifest: unknown field(s) {', '.join(unknown)} (manifest "
                                f"version {MANIFEST_VERSION} has no such field)")
        v = {**_OPTIONAL, **d}
        if not _is_int(v["manifest_version"]):
            raise _fail("manifest_version", f"expected an int, got {v['manifest_version']!r}")
        for key in ("params", "kernel_args", "grid", "block", "cluster", "requires"):
            if not isinstance(v[key], list):
                raise _fail(key, f"expected a list, got {type(v[key]).__name__}")
        return cls(**v)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            d = json.loads(text)
        except RecursionError:
            raise ManifestError("manifest: not valid JSON: nested too deeply") from None
        except (ValueError, TypeError) as e:
            raise ManifestError(f"manifest: not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def coerce(cls, m: Manifest | dict | str | bytes) -> Manifest:
        """A Manifest from a Manifest, a dict or JSON text."""
        if isinstance(m, Manifest):
            return m
        if isinstance(m, dict):
            return cls.from_dict(m)
        if isinstance(m, str | bytes):
            return cls.from_json(m)
        raise ManifestError(f"manifest: expected Manifest, dict or JSON text, got "
                            f"{type(m).__name__}")


def _expr_json(e: Expr) -> Expr:
    return [e[0], _expr_json(e[1]), _expr_json(e[2])] if isinstance(e, list | tuple) else e
