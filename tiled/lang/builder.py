"""The trace builder: records a kernel body as Tile IR while the kernel function runs.

One `Builder` exists per trace, reachable through `current()`. Statements are appended to the
innermost open scope; loops and conditionals open a scope and close it into one statement.
Every statement carries the author's source location, taken from the first stack frame outside
this package.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
from contextlib import contextmanager

from tiled.errors import KernelDefinitionError
from tiled.ir import dtypes
from tiled.ir.program import SCHEMA_VERSION
from tiled.v1 import tile_ir_pb2 as pb

_LANG_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames that are never the author's: this package and the context-manager machinery that
# runs T.Kernel / T.If bodies.
_SKIP_FILES = {os.path.abspath(contextlib.__file__)}
_state = threading.local()


def user_frame():
    """The innermost frame outside tiled/lang: where the author wrote the current call."""
    f = sys._getframe(1)
    while f is not None and (
            os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _LANG_DIR
            or os.path.abspath(f.f_code.co_filename) in _SKIP_FILES):
        f = f.f_back
    return f


def definition_error(message: str, frame=None) -> KernelDefinitionError:
    frame = frame or user_frame()
    if frame is None:
        return KernelDefinitionError(message)
    file, line = frame.f_code.co_filename, frame.f_lineno
    return KernelDefinitionError(message, file, line, None, linecache.getline(file, line))


def current() -> Builder:
    b = getattr(_state, "builder", None)
    if b is None:
        raise definition_error("tiled.lang primitives can only be used inside a @tiled.kernel "
                               "function while it is traced")
    return b


@contextmanager
def tracing(builder: Builder):
    prev = getattr(_state, "builder", None)
    _state.builder = builder
    try:
        yield builder
    finally:
        _state.builder = prev


class Builder:
    def __init__(self, name: str):
        self.program = pb.Program(schema_version=SCHEMA_VERSION, name=name)
        self.scopes: list[list[pb.Stmt]] = []
        self.dims: dict[str, int] = {}  # symbolic dim name -> var id
        self.kernel_open = False
        self.kernel_done = False
        self.last_if: list[pb.IfThenElse | None] = []
        self.buffer_names: set[str] = set()
        self.broken_loop: pb.Location | None = None

    # -- tables ------------------------------------------------------------------------------
    def new_var(self, name: str, dtype: str = "int32") -> int:
        vid = len(self.program.vars)
        self.program.vars.add(id=vid, name=name, dtype=dtypes.to_enum(dtype))
        return vid

    def new_buffer(self, name: str, dtype: str, shape: list, scope: int) -> pb.Buffer:
        bid = len(self.program.buffers)
        buf = self.program.buffers.add(id=bid, name=name, dtype=dtypes.to_enum(dtype), scope=scope)
        for d in shape:
            # A static extent is an int; a symbolic one is ("var", var_id).
            if isinstance(d, tuple):
                buf.shape.add(var=d[1])
            else:
                buf.shape.add(size=d)
        return buf

    def var_dtype(self, vid: int) -> str:
        return dtypes.canonical_name(self.program.vars[vid].dtype)

    def buffer(self, bid: int) -> pb.Buffer:
        return self.program.buffers[bid]

    # -- statements ----------------------------------------------------------------------------
    def location(self) -> pb.Location:
        f = user_frame()
        if f is None:
            return pb.Location()
        return pb.Location(file=f.f_code.co_filename, line=f.f_lineno)

    def emit(self, stmt: pb.Stmt) -> pb.Stmt:
        if not self.scopes or not self.kernel_open:
            raise definition_error("statements must be inside `with T.Kernel(...)`")
        if not stmt.HasField("loc"):
            stmt.loc.CopyFrom(self.location())
        self.scopes[-1].append(stmt)
        if stmt.WhichOneof("kind") != "if_then_else":
            self.last_if[-1] = None
        return stmt

    def open_scope(self) -> None:
        self.scopes.append([])
        self.last_if.append(None)

    def close_scope(self) -> pb.Stmt:
        stmts = self.scopes.pop()
        self.last_if.pop()
        if len(stmts) == 1:
            return stmts[0]
        out = pb.Stmt()
        out.seq.stmts.extend(stmts)
        return out
