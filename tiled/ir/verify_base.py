"""What the verifier's rule mixins share with its driver (tiled.ir.verifier._Verifier): the
size bounds of dims and int32 values, how a message names a dtype, a shape, a field path and a
source line, and `Rules`, the base of the mixins, which declares the driver's state and
helpers to type checkers (at run time it is empty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from tiled.ir.dtypes import ENUM_TO_NAME
from tiled.ir.intervals import _Iv
from tiled.v1 import tile_ir_pb2 as pb

if TYPE_CHECKING:  # type-only: tiled.ir.verifier imports this module
    from tiled.ir.verifier import Limits

_MAX_DIM = (1 << 31) - 1
_INT32_MAX = (1 << 31) - 1


def _dt(dtype: int) -> str:
    return ENUM_TO_NAME.get(dtype, f"dtype {dtype}")


def _shape_str(shape: list) -> str:
    return "x".join(str(d) for d in shape)


def _render(path: tuple | None) -> str:
    parts = []
    while path is not None:
        path, seg = path
        parts.append(seg)
    return "".join(reversed(parts))


def _loc_str(loc: pb.Location) -> str:
    return f"{loc.file or '<unknown>'}:{loc.line}" if (loc.file or loc.line) else ""


class Rules:
    """Base of the rule mixins of `_Verifier`, which provides everything declared here: a
    mixin reads the driver's state and calls its helpers and the other mixins' rules."""

    if TYPE_CHECKING:  # provided by _Verifier and its mixins
        p: pb.Program
        limits: Limits
        vars: dict[int, pb.Var]
        bufs: dict[int, pb.Buffer]
        shape: dict[int, list]
        bound: dict[int, str]
        in_scope: set[int]
        env: dict[int, _Iv]
        dead: bool
        parallel: int
        loc: str

        def fail(self, message: str, path: tuple | None) -> NoReturn: ...
        def count(self, path: tuple, n: int = 1) -> None: ...
        def deep(self, depth: int, path: tuple) -> None: ...
        def vname(self, vid: int) -> str: ...
        def bname(self, bid: int) -> str: ...
        def var(self, vid: int, path: tuple) -> pb.Var: ...
        def buffer(self, bid: int, path: tuple) -> pb.Buffer: ...
        def bind(self, vid: int, how: str, path: tuple) -> None: ...
        def elements(self, b: pb.Buffer) -> int: ...
        def region(self, r: pb.Region, path: tuple, depth: int) -> pb.Buffer: ...
        def indices(self, b: pb.Buffer, indices, path: tuple, depth: int) -> None: ...
        def index(self, b: pb.Buffer, i: int, idx: pb.Expr, ipath: tuple,
                  depth: int) -> _Iv | None: ...
        def expr(self, e: pb.Expr, path: tuple, depth: int,
                 launch: bool = False) -> _Iv | None: ...
        def var_iv(self, vid: int) -> _Iv: ...
        def cast_value(self, value: pb.Expr, iv: _Iv | None, dt: int, path: tuple) -> None: ...
        def signed_overflow(self, sym: str, r: _Iv, dt: int, path: tuple) -> None: ...
        def int_fold(self, op: int, sym: str, a: int, b: int, dt: int, path: tuple) -> None: ...
        def int_operand(self, op: int, sym: str, b: _Iv, dt: int, path: tuple) -> None: ...
        def refined(self, cond: pb.Expr, negate: bool) -> tuple[dict, bool]: ...
        def tma_copy(self, c: pb.Copy, src: pb.Buffer, dst: pb.Buffer, path: tuple,
                     depth: int) -> None: ...
