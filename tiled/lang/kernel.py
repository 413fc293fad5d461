"""`@tiled.kernel`: turns an annotated Python function into a Tile IR program by tracing it.

The function runs once, under trace, when `.ir` is first read: tiled.lang primitives record
statements instead of computing. Python values it closes over (block sizes, stages, dtypes)
are constants of the program, as in TileLang. Before tracing, the function's source is
rewritten so that a Python `if` whose condition is a traced value becomes an IR conditional,
while an `if` on a Python value keeps its ordinary meaning.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import textwrap

from tiled.errors import KernelDefinitionError, VerifyError
from tiled.ir import dtypes, verify
from tiled.ir.program import Program
from tiled.lang import loops
from tiled.lang.builder import Builder, definition_error, tracing
from tiled.lang.expr import BufferRef, Dim, Expr
from tiled.v1 import tile_ir_pb2 as pb


class Tensor:
    """A tensor parameter: `A: T.Tensor((M, 1024), "float16")`, dims ints or `T.dyn` names."""

    def __init__(self, shape, dtype):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        for d in self.shape:
            if not (isinstance(d, Dim) or (isinstance(d, int) and not isinstance(d, bool)
                                           and d > 0)):
                raise definition_error(f"T.Tensor dims must be positive ints or T.dyn(...), "
                                       f"got {d!r}")
        try:
            self.dtype = dtypes.canonical_name(dtype)
        except ValueError as e:
            raise definition_error(str(e)) from None

    def __repr__(self):
        return f"T.Tensor({self.shape}, {self.dtype!r})"


class Scalar:
    """A scalar parameter type: `n: T.int32`, `alpha: T.float32`."""

    def __init__(self, dtype: str):
        self.dtype = dtype

    def __repr__(self):
        return f"T.{self.dtype}"


def dyn(name: str) -> Dim:
    """A symbolic dimension, bound at launch from the tensor that has it.

    >>> M = T.dyn("M")
    >>> def k(A: T.Tensor((M, 64), "float32")): ...
    """
    return Dim(name)


# -- the `if` rewrite ---------------------------------------------------------------------------

class _IfRewriter(ast.NodeTransformer):
    """`if c: A else: B` -> evaluate c once; traced -> `with T.If(c): A` + `with T.Else(): B`,
    Python value -> the original `if`."""

    def __init__(self):
        self.n = 0

    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        self.n += 1
        tmp = f"__tiled_cond{self.n}"
        assign = ast.Assign(targets=[ast.Name(tmp, ast.Store())], value=node.test)
        rt = ast.Name("__tiled_rt", ast.Load())

        def with_(ctor, args, body):
            call = ast.Call(ast.Attribute(rt, ctor, ast.Load()), args, [])
            return ast.With(items=[ast.withitem(call)], body=body)

        traced = [with_("If", [ast.Name(tmp, ast.Load())], node.body)]
        if node.orelse:
            traced.append(with_("Else", [], node.orelse))
        # Copies: a node in two places of the tree would have its line moved twice by
        # ast.increment_lineno, and statements under the `if` would report wrong lines.
        python = ast.If(test=ast.Name(tmp, ast.Load()), body=copy.deepcopy(node.body),
                        orelse=copy.deepcopy(node.orelse))
        is_traced = ast.Call(ast.Attribute(rt, "is_traced", ast.Load()),
                             [ast.Name(tmp, ast.Load())], [])
        out = [assign, ast.If(test=is_traced, body=traced, orelse=[python])]
        for n in out:
            ast.copy_location(n, node)
        return out


class _Runtime:
    If = loops.If
    Else = loops.Else

    @staticmethod
    def is_traced(x) -> bool:
        return isinstance(x, (Expr, Dim))


def _rewrite_ifs(fn):
    """Returns `fn` rebuilt with the `if` rewrite, or `fn` itself when its source is not
    available (then an `if` on a traced value raises a clear error)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return fn
    src = textwrap.dedent("".join(lines))
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef) or not any(
            isinstance(n, ast.If) for n in ast.walk(fdef)):
        return fn
    fdef.decorator_list = []
    rewriter = _IfRewriter()
    fdef.body = [rewriter.visit(s) for s in fdef.body]
    fdef.body = [s for item in fdef.body for s in (item if isinstance(item, list) else [item])]
    free = fn.__code__.co_freevars
    factory = ast.FunctionDef(
        name="__tiled_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in free], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[])
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, first - 1)
    env = dict(fn.__globals__)
    env["__tiled_rt"] = _Runtime
    exec(compile(module, fn.__code__.co_filename, "exec"), env)
    cells = [c.cell_contents for c in (fn.__closure__ or ())]
    return env["__tiled_factory"](*cells)


# -- the kernel object --------------------------------------------------------------------------

class KernelFunction:
    """What `@tiled.kernel` returns. `.ir` is the traced, verified Program (cached);
    `tiled.compile(k, target)` compiles it."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self._ir: Program | None = None

    def __repr__(self):
        return f"<tiled.kernel {self.name}>"

    @property
    def ir(self) -> Program:
        if self._ir is None:
            self._ir = self._trace()
        return self._ir

    def _params(self, b: Builder):
        sig = inspect.signature(self.fn)
        try:
            hints = dict(self.fn.__annotations__)
        except AttributeError:
            hints = {}
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
                raise KernelDefinitionError(
                    f"parameter {p.name!r} of kernel {self.name} needs an annotation "
                    "T.Tensor(shape, dtype) or a scalar type such as T.int32",
                    self.fn.__code__.co_filename, line,
                    None, linecache.getline(self.fn.__code__.co_filename, line))
        return args

    def _trace(self) -> Program:
        fn = _rewrite_ifs(self.fn)
        b = Builder(self.name)
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
        return program


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
