"""`@tiled.kernel`: turns an annotated Python function into a Tile IR program by tracing it.

The function runs once, under trace, when `.ir` is first read: tiled.lang primitives record
statements instead of computing. Python values it closes over (block sizes, stages, dtypes)
are constants of the program, as in TileLang. Before tracing, the function's source is
rewritten (tiled.lang.rewrite): a Python `if` whose condition is a traced value becomes an IR
conditional while an `if` on a Python value keeps its ordinary meaning, and the names the
author wrote (allocations, loop and block vars) become the program's debug names.
"""

from __future__ import annotations

import functools
import inspect
import linecache

from tiled.errors import KernelDefinitionError, VerifyError
from tiled.ir import dtypes, verify
from tiled.ir.program import Program
from tiled.lang.annotations import Scalar, Tensor, TileBuffer, dyn
from tiled.lang.builder import Builder, definition_error, tracing
from tiled.lang.expr import BufferRef, Dim, Expr
from tiled.lang.rewrite import rewrite_function
from tiled.v1 import tile_ir_pb2 as pb

__all__ = ["KernelFunction", "Scalar", "Tensor", "annotations_of", "dyn", "kernel"]


def annotations_of(fn) -> dict:
    """The parameter annotations of `fn`, evaluated: a string annotation (a module with
    `from __future__ import annotations`) is evaluated where the function was defined."""
    try:
        hints = dict(fn.__annotations__)
    except AttributeError:
        return {}
    scope = None
    for name, ann in hints.items():
        if isinstance(ann, str):
            if scope is None:
                cells = zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True)
                scope = {n: c.cell_contents for n, c in cells if _filled(c)}
            try:
                hints[name] = eval(ann, fn.__globals__, scope)
            except Exception as e:
                raise definition_error(f"the annotation of {name} ({ann!r}) does not evaluate: "
                                       f"{type(e).__name__}: {e}") from None
    return hints


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


# -- the kernel object --------------------------------------------------------------------------

class KernelFunction:
    """What `@tiled.kernel` returns. `.ir` is the traced, verified Program (cached);
    `tiled.compile(k, target)` compiles it.

    >>> print(add.ir)                              # the Tile IR, as text
    >>> tiled.compile(add, "cpu")(a, b, c)
    """

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self._launches: list[Program] | None = None

    def __repr__(self):
        return f"<tiled.kernel {self.name}>"

    @property
    def launches(self) -> list[Program]:
        """The traced, verified Program of each `with T.Kernel` block, in launch order (one
        for most kernels). Every launch takes all of the function's parameters."""
        if self._launches is None:
            first, count = self._trace(0)
            self._launches = [first] + [self._trace(i)[0] for i in range(1, count)]
        return self._launches

    @property
    def ir(self) -> Program:
        """The traced, verified Program. A function of several `with T.Kernel` blocks has one
        per block (`launches`): tiled.compile and tiled.jit run them in order, and `.ir`
        says so instead of answering with one of them."""
        launches = self.launches
        if len(launches) > 1:
            line = self.fn.__code__.co_firstlineno
            raise KernelDefinitionError(
                f"kernel {self.name} launches {len(launches)} kernels (one per `with "
                "T.Kernel` block): tiled.compile and tiled.jit run them in order; its "
                "`.launches` holds their programs. This use takes one kernel",
                self.fn.__code__.co_filename, line, None,
                linecache.getline(self.fn.__code__.co_filename, line))
        return launches[0]

    def _params(self, b: Builder):
        sig = inspect.signature(self.fn)
        hints = annotations_of(self.fn)
        args = []
        for p in sig.parameters.values():
            ann = hints.get(p.name, p.annotation)
            if isinstance(ann, Tensor):
                shape = []
                for d in ann.shape:
                    if isinstance(d, Dim):
                        if d.name not in b.dims:
                            b.dims[d.name] = b.new_var(d.name)
                        shape.append(("var", b.dims[d.name]))
                    else:
                        shape.append(d)
                buf = b.new_buffer(p.name, ann.dtype, shape, pb.GLOBAL)
                b.program.params.add(name=p.name, buffer=buf.id)
                args.append(BufferRef(buf.id, p.name, ann.dtype,
                                      ann.shape, pb.GLOBAL))
            elif isinstance(ann, Scalar):
                vid = b.new_var(p.name, ann.dtype)
                b.program.params.add(name=p.name, scalar=vid)
                args.append(Expr(pb.Expr(dtype=dtypes.to_enum(ann.dtype), var=vid), ann.dtype))
            else:
                line = self.fn.__code__.co_firstlineno
                hint = (f"; {ann!r} annotates a tile a @T.macro takes, kernel tensors are "
                        "global" if isinstance(ann, TileBuffer) else "")
                raise KernelDefinitionError(
                    f"parameter {p.name!r} of kernel {self.name} needs an annotation "
                    f"T.Tensor(shape, dtype) or a scalar type such as T.int32{hint}",
                    self.fn.__code__.co_filename, line,
                    None, linecache.getline(self.fn.__code__.co_filename, line))
        return args

    def _trace(self, launch: int) -> tuple[Program, int]:
        """The Program of `with T.Kernel` block `launch` (the function traced once more for
        each), and how many such blocks the function has."""
        fn = rewrite_function(self.fn)
        b = Builder(self.name if launch == 0 else f"{self.name}_{launch}")
        b.launch = launch
        with tracing(b):
            args = self._params(b)
            fn(*args)
        file, line = self.fn.__code__.co_filename, self.fn.__code__.co_firstlineno
        if not b.kernel_done:
            raise KernelDefinitionError(f"kernel {self.name} has no `with T.Kernel(...)` block",
                                        file, line, None, linecache.getline(file, line))
        if b.broken_loop is not None:
            loc = b.broken_loop
            raise KernelDefinitionError("a tiled loop was left early (`break`); tiled loops "
                                        "always run to their extent", loc.file, loc.line, None,
                                        linecache.getline(loc.file, loc.line))
        program = Program(b.program)
        try:
            verify(program)
        except VerifyError as e:
            f, _, ln = e.loc.rpartition(":")
            if f and ln.isdigit():
                raise KernelDefinitionError(e.message, f, int(ln), None,
                                            linecache.getline(f, int(ln))) from None
            raise KernelDefinitionError(f"{e.message} ({e.path})", file, line) from None
        return program, b.kernels_seen


def kernel(fn) -> KernelFunction:
    """Declares a tile kernel. Parameters are annotated `T.Tensor(shape, dtype)` or scalar
    types; the body opens one `with T.Kernel(...)` block.

    >>> @tiled.kernel
    ... def add(A: T.Tensor((1024,), "float32"), B: T.Tensor((1024,), "float32"),
    ...         C: T.Tensor((1024,), "float32")):
    ...     with T.Kernel(8, threads=128) as bx:
    ...         for i in T.Parallel(128):
    ...             C[bx * 128 + i] = A[bx * 128 + i] + B[bx * 128 + i]
    """
    if not callable(fn):
        raise TypeError("@tiled.kernel decorates a function")
    return KernelFunction(fn)
