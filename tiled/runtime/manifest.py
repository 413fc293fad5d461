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
Checked on construction: one box entry per dim, each in 1..256, box[0] times the element size
a multiple of 16 bytes and, when swizzled, at most `b` bytes.

Validation happens on construction; every problem raises ManifestError naming the field.

This module holds the Manifest class: the rules that span the whole manifest (names and dims
across params, kernel_args against params, the backend fields, the fallback variant) and its
JSON form. The parts live beside it and are re-exported here: expressions in
tiled.runtime.manifest_exprs, Param / KernelArg in tiled.runtime.manifest_args, ManifestError
and the single-value checks in tiled.runtime.manifest_base.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime.code_object import check_code_object
from tiled.runtime.manifest_args import (
    KERNEL_ARG_KINDS,
    TMA_MAX_BOX,
    TMA_MAX_RANK,
    TMA_SWIZZLES,
    KernelArg,
    Param,
    _check_tensor_map,
)
from tiled.runtime.manifest_base import DTYPES, ManifestError, _fail, _is_int
from tiled.runtime.manifest_exprs import (
    OPS,
    SM_COUNT_DIM,
    Expr,
    _expr_json,
    check_expr,
    compile_expr,
    eval_expr,
    expr_names,
)
from tiled.runtime.metal_abi import check_metal

MANIFEST_VERSION = 1
# backend -> the artifact format its loader takes; other backends are accepted by the manifest
# and refused by tiled.runtime.load until a loader exists.
FORMATS = {"cpu": "so", "cuda": "cubin", "rocm": "hsaco", "metal": "msl"}

_HEX64 = re.compile(r"[0-9a-f]{64}")

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


# The names other modules import from here, wherever they are defined.
__all__ = ["DTYPES", "FORMATS", "KERNEL_ARG_KINDS", "MANIFEST_VERSION", "OPS", "SM_COUNT_DIM",
           "TMA_MAX_BOX", "TMA_MAX_RANK", "TMA_SWIZZLES", "Expr", "KernelArg", "Manifest",
           "ManifestError", "Param", "check_expr", "compile_expr", "eval_expr", "expr_names"]
