"""Verifier rules of the kernel's parameters, a mixin of `_Verifier` (tiled.ir.verifier).

A parameter is a GLOBAL buffer (passed once) or a scalar of a dtype the kernel ABIs pass; every
GLOBAL buffer is a parameter, and the symbolic dims of their shapes are bound here. Parameter
and dim names become C identifiers of the generated kernel and names of the launch manifest:
each must be a valid identifier, not reserved (ops.RESERVED_NAMES, ops.RESERVED_PREFIXES), and
distinct from every other, the data pointers the compiler generates (`X_ptr`) included.
"""

from __future__ import annotations

import re

from tiled.ir import ops
from tiled.ir.verify_base import Rules, _dt
from tiled.v1 import tile_ir_pb2 as pb

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Scalar parameter dtypes no kernel ABI passes (TVM's packed calls take no bfloat16 or fp8
# scalar; the CUDA launcher has no fp8 one either).
_NO_SCALAR = frozenset({pb.BFLOAT16, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2})


def _printable(name: str) -> bool:
    return len(name) <= 64 and _IDENT.fullmatch(name) is not None


def c_name_problem(name: str) -> str | None:
    """Why `name` cannot be a parameter or dim name of the generated C (ops.RESERVED_NAMES),
    or None."""
    if not name:
        return "is empty"
    if len(name) > 64:
        return "is longer than 64 characters"
    if not _IDENT.fullmatch(name):
        return "is not an identifier (letters, digits and _, not starting with a digit)"
    if name in ops.RESERVED_NAMES:
        return "is reserved: a C/C++/CUDA keyword or a name of the generated kernel's code"
    if name.startswith(ops.RESERVED_PREFIXES) or (name[0] == "_" and name[1:2].isupper()):
        return ("is reserved: names starting with __, _ and a capital letter, or "
                f"{', '.join(ops.RESERVED_PREFIXES[1:])} belong to C, TVM or tiled")
    return None


class ParamRules(Rules):
    """The parameter table's rules (module docstring); `params()` runs after the buffer table."""

    def params(self) -> None:
        names: set[str] = set()
        param_of: dict[int, int] = {}
        for i, prm in enumerate(self.p.params):
            path = (None, f"params[{i}]")
            problem = c_name_problem(prm.name)
            if problem:
                self.fail(f"parameter name {prm.name[:64]!r} {problem}", path)
            if prm.name in names:
                self.fail(f"two parameters are named {prm.name!r}", path)
            names.add(prm.name)
            kind = prm.WhichOneof("kind")
            if kind == "buffer":
                b = self.buffer(prm.buffer, (path, ".buffer"))
                if b.scope != pb.GLOBAL:
                    self.fail(f"parameter {prm.name} is {ops.SCOPE_NAME.get(b.scope, '?')} "
                              f"buffer {self.bname(b.id)}; tensor parameters are GLOBAL",
                              (path, ".buffer"))
                if b.id in param_of:
                    self.fail(f"buffer {self.bname(b.id)} is passed as two parameters",
                              (path, ".buffer"))
                param_of[b.id] = i
            elif kind == "scalar":
                v = self.var(prm.scalar, (path, ".scalar"))
                if v.dtype in _NO_SCALAR:
                    self.fail(f"scalar parameter {prm.name} is {_dt(v.dtype)}; kernels take "
                              "bool, integer, float16, float32 or float64 scalars (pass a "
                              "float32 and cast it)", (path, ".scalar"))
                self.bind(prm.scalar, "scalar", (path, ".scalar"))
            else:
                self.fail(f"parameter {prm.name} is neither a buffer nor a scalar", path)
        for i, b in enumerate(self.p.buffers):
            if b.scope == pb.GLOBAL and b.id not in param_of:
                self.fail(f"global buffer {self.bname(b.id)} is not a parameter; every GLOBAL "
                          "buffer is passed in by the caller", (None, f"buffers[{i}]"))
        for bid, i in sorted(param_of.items(), key=lambda kv: kv[1]):
            for d in self.bufs[bid].shape:
                if d.WhichOneof("kind") == "var" and self.bound.get(d.var) != "dim":
                    self.bind(d.var, "dim", (None, f"params[{i}].buffer"))
        self.in_scope.update(self.bound)  # dims and scalar params
        self.c_names(param_of)

    def c_names(self, param_of: dict[int, int]) -> None:
        """Parameter and dim names are C identifiers of the generated kernel (tensor X: `X_ptr`,
        scalar s: `s`, dim M: `int M`; an unnamed dim is `d<id>`, as the compiler names it)
        and manifest names: each must be a valid, unreserved name, and all must differ."""
        params = self.p.params
        taken: dict[str, tuple[str, int]] = {}  # name -> ("param" | "ptr" | "dim", index | id)
        for i, prm in enumerate(params):
            taken[prm.name] = ("param", i)
        for i, prm in enumerate(params):
            if prm.WhichOneof("kind") != "buffer":
                continue
            ptr = prm.name + "_ptr"
            if ptr in taken:
                self.fail(f"parameter name {ptr!r} is the C name of tensor parameter {prm.name}'s "
                          "data pointer; rename one of them", (None, f"params[{taken[ptr][1]}]"))
            taken[ptr] = ("ptr", i)
        position = {v.id: j for j, v in enumerate(self.p.vars)}
        for bid, i in sorted(param_of.items(), key=lambda kv: kv[1]):
            for j, d in enumerate(self.bufs[bid].shape):
                if d.WhichOneof("kind") != "var":
                    continue
                name = self.vars[d.var].name or f"d{d.var}"
                what = f"symbolic dim {name[:64]!r} (dim {j} of {params[i].name})"
                path = (None, f"vars[{position[d.var]}]")
                problem = c_name_problem(name)
                if problem:
                    self.fail(f"{what}: the name {problem}", path)
                kind, who = taken.setdefault(name, ("dim", d.var))
                if (kind, who) != ("dim", d.var):
                    other = f"dim var {who}" if kind == "dim" else \
                        f"parameter {params[who].name}" if kind == "param" else \
                        f"tensor parameter {params[who].name}'s data pointer"
                    self.fail(f"{what} has the name of {other}; dims and parameters need "
                              "distinct C names", path)
