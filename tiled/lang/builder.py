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
import re
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
# The names the DSL makes up for an allocation the author did not name (`shared3`, `frag5`):
# the source rewrite (tiled.lang.naming) replaces them by the assignment's target name.
_GENERATED_BUFFER_NAME = re.compile(r"(?:shared|frag|local|bar|var)(\d+)")


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


def active() -> Builder | None:
    """The builder of the trace running on this thread, or None outside a trace."""
    return getattr(_state, "builder", None)


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
        self.launch = 0  # which `with T.Kernel` block of the function this trace records
        self.kernels_seen = 0  # the blocks opened so far (scratch() traces the others)
        self.last_if: list[pb.IfThenElse | None] = []
        self.buffer_names: set[str] = set()
        self.broken_loop: pb.Location | None = None
        self.named_buffers: set[int] = set()  # ids whose name the author chose

    def scratch(self) -> Builder:
        """A builder for a `with T.Kernel` block this trace does not record: the tables so far
        (parameters, dims), so that the block's references resolve; dropped after it."""
        other = Builder(self.program.name)
        other.program.CopyFrom(self.program)
        other.program.ClearField("kernel")
        other.dims = dict(self.dims)
        other.buffer_names = set(self.buffer_names)
        other.named_buffers = set(self.named_buffers)
        return other

    # -- tables ------------------------------------------------------------------------------
    def new_var(self, name: str, dtype: str = "int32") -> int:
        vid = len(self.program.vars)
        self.program.vars.add(id=vid, name=name, dtype=dtypes.to_enum(dtype))
        return vid

    def new_buffer(self, name: str, dtype: str, shape: list, scope: int, *,
                   generated: bool | None = None) -> pb.Buffer:
        """A new buffer. `generated`: whether `name` was made up by the DSL (then the source
        rewrite may replace it by the author's); None guesses from its spelling (`shared3`)."""
        bid = len(self.program.buffers)
        if generated is None:
            match = _GENERATED_BUFFER_NAME.fullmatch(name)
            generated = match is not None and int(match.group(1)) == bid
        if not generated:
            self.named_buffers.add(bid)
        self.buffer_names.add(name)
        buf = self.program.buffers.add(id=bid, name=name, dtype=dtypes.to_enum(dtype), scope=scope)
        for d in shape:
            # A static extent is an int; a symbolic one is ("var", var_id).
            if isinstance(d, tuple):
                buf.shape.add(var=d[1])
            else:
                buf.shape.add(size=d)
        return buf

    # -- debug names -----------------------------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        """(buffers, vars) so far: what a later rename may touch is what was created after."""
        return len(self.program.buffers), len(self.program.vars)

    def name_buffer(self, bid: int, name: str) -> str | None:
        """Gives buffer `bid` the author's `name` unless the author named it already (`name=`).
        Buffer names are unique in a program: a second `tmp` (a macro called twice) becomes
        `tmp_1`. Returns the name given, or None when the buffer kept its own."""
        if bid in self.named_buffers or not name.isidentifier():
            return None
        taken = self.buffer_names | {self.program.vars[v].name for v in self.dims.values()} | {
            p.name for p in self.program.params}
        unique, n = name, 0
        while unique in taken:
            n += 1
            unique = f"{name}_{n}"
        self.buffer_names.add(unique)
        self.named_buffers.add(bid)
        self.program.buffers[bid].name = unique
        return unique

    def name_var(self, vid: int, name: str) -> None:
        """Gives var `vid` (a loop or block var) the author's name. Loop vars may share one:
        sibling loops each bind their own `i`, as the source does."""
        if name.isidentifier():
            self.program.vars[vid].name = name

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
        from tiled.lang import binding  # binding imports expr, which imports this module

        binding.on_emit(self, stmt)
        self.scopes[-1].append(stmt)
        if stmt.WhichOneof("kind") != "if_then_else":
            self.last_if[-1] = None
        return stmt

    def open_scope(self) -> None:
        self.scopes.append([])
        self.last_if.append(None)

    def close_scope(self) -> pb.Stmt:
        stmts = self.scopes.pop()
        from tiled.lang import binding

        binding.on_close(self, stmts)
        self.last_if.pop()
        if len(stmts) == 1:
            return stmts[0]
        out = pb.Stmt()
        out.seq.stmts.extend(stmts)
        return out
