"""The source rewrite of kernels and macros: the function is rebuilt from its source with
some statements turned into calls of tiled.lang.naming (`__tiled_rt`), so the trace learns
the names the author wrote and reads `if` / assignments as TileLang's parser does:

- `if c:` on a traced value becomes `with T.If(c):` (+ `T.Else()`); on a Python value it
  stays an `if`;
- `X = <value>` names the buffers the value allocated `X` (`A_s = T.alloc_shared(...)`), and
  is a store when X is bound to a T.alloc_var; `x += v` likewise;
- `for` targets name loop vars, `with ... as` targets name block vars;
- `a and b`, `a or b`, `not a`, `lo <= i < hi` and `x if c else y` on traced values are IR
  logic and selects (TileLang's parser reads them so), on Python values Python's own;
- `for i in range(n)` with a traced n is T.serial(n); `while` on a traced value is refused.

The rebuilt function shares the original's globals and closure cells, so it sees what the
original would. When the source is not available (a function made by exec, a lambda), the
original function is used: then names are generated, and a traced `if` raises a clear error.
"""

from __future__ import annotations

import ast
import copy
import inspect
import types
import weakref

from tiled.lang.naming import Runtime

_RT = "__tiled_rt"
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # code -> rewritten code


def rewrite_function(fn):
    """`fn` rebuilt from its rewritten source, or `fn` itself when that is not possible."""
    code = fn.__code__
    try:
        new = _cache[code]
    except KeyError:
        new = _cache[code] = _rewrite_code(fn)
    if new is None:
        return fn
    cells = dict(zip(code.co_freevars, fn.__closure__ or (), strict=True))
    cells[_RT] = types.CellType(Runtime)
    if any(n not in cells for n in new.co_freevars):
        return fn
    out = types.FunctionType(new, fn.__globals__, fn.__name__, fn.__defaults__,
                             tuple(cells[n] for n in new.co_freevars))
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    return out


def _rewrite_code(fn) -> types.CodeType | None:
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    src = "".join(lines)
    # An indented def (in a factory, a class) parses under an `if 1:` that keeps its columns.
    prefixed = src[:1] in (" ", "\t")
    try:
        tree = ast.parse("if 1:\n" + src if prefixed else src)
    except SyntaxError:
        return None
    fdef = tree.body[0].body[0] if prefixed else tree.body[0]
    if not isinstance(fdef, ast.FunctionDef) or fdef.name != fn.__name__:
        return None
    fdef.decorator_list = []
    _Rewriter().visit(fdef)
    # The function is defined inside a factory whose parameters are its free variables, so
    # that the compiled code reads them as closure cells (given the original's cells later).
    free = [*fn.__code__.co_freevars, _RT]
    factory = ast.FunctionDef(
        name="__tiled_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in free], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[])
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, first - 1 - prefixed)
    compiled = compile(module, fn.__code__.co_filename, "exec")
    factory_code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    return next((c for c in factory_code.co_consts
                 if isinstance(c, types.CodeType) and c.co_name == fdef.name), None)


def _rt(attr: str) -> ast.Attribute:
    return ast.Attribute(ast.Name(_RT, ast.Load()), attr, ast.Load())


def _call(attr: str, *args: ast.expr) -> ast.Call:
    return ast.Call(_rt(attr), list(args), [])


def _target_names(target: ast.expr) -> ast.expr | None:
    """"x" for a name, ("i", "j") for a flat tuple of names, else None."""
    if isinstance(target, ast.Name):
        return ast.Constant(target.id)
    if isinstance(target, (ast.Tuple, ast.List)) and target.elts and all(
            isinstance(e, ast.Name) for e in target.elts):
        return ast.Tuple([ast.Constant(e.id) for e in target.elts], ast.Load())
    return None


def _as_tuple(names: ast.expr) -> ast.expr:
    return names if isinstance(names, ast.Tuple) else ast.Tuple([names], ast.Load())


def _thunk(e: ast.expr) -> ast.Lambda:
    args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.copy_location(ast.Lambda(args, e), e)


def _deferrable(exprs) -> bool:
    """Whether the expressions may move into lambdas without changing what they mean."""
    scoped = (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)
    return not any(isinstance(n, scoped) for e in exprs for n in ast.walk(e))


_AUG_OPS = {ast.Add: "+=", ast.Sub: "-=", ast.Mult: "*=", ast.Div: "/=", ast.FloorDiv: "//=",
            ast.Mod: "%=", ast.Pow: "**=", ast.LShift: "<<=", ast.RShift: ">>=",
            ast.BitAnd: "&=", ast.BitOr: "|=", ast.BitXor: "^=", ast.MatMult: "@="}


class _Rewriter(ast.NodeTransformer):
    def __init__(self):
        self.n = 0

    def visit_ClassDef(self, node):
        return node  # a class body is Python's, not the kernel's

    def visit_If(self, node: ast.If):
        """`if c: A else: B` -> evaluate c once; traced -> `with T.If(c): A` +
        `with T.Else(): B`, Python value -> the original `if`."""
        self.generic_visit(node)
        self.n += 1
        tmp = f"__tiled_cond{self.n}"
        assign = ast.Assign(targets=[ast.Name(tmp, ast.Store())], value=node.test)

        def with_(ctor, args, body):
            return ast.With(items=[ast.withitem(_call(ctor, *args))], body=body)

        traced = [with_("If", [ast.Name(tmp, ast.Load())], node.body)]
        if node.orelse:
            traced.append(with_("Else", [], node.orelse))
        # Copies: a node in two places of the tree would have its line moved twice by
        # ast.increment_lineno, and statements under the `if` would report wrong lines.
        python = ast.If(test=ast.Name(tmp, ast.Load()), body=copy.deepcopy(node.body),
                        orelse=copy.deepcopy(node.orelse))
        is_traced = _call("is_traced", ast.Name(tmp, ast.Load()))
        out = [assign, ast.If(test=is_traced, body=traced, orelse=[python])]
        for n in out:
            ast.copy_location(n, node)
        return out

    def visit_Assign(self, node: ast.Assign):
        self.generic_visit(node)
        if len(node.targets) == 1:
            names = _target_names(node.targets[0])
            if names is not None:
                node.value = ast.copy_location(
                    _call("assign", names, _call("mark"), node.value), node.value)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self.generic_visit(node)
        if node.value is not None and isinstance(node.target, ast.Name):
            node.value = ast.copy_location(
                _call("assign", ast.Constant(node.target.id), _call("mark"), node.value),
                node.value)
        return node

    def visit_AugAssign(self, node: ast.AugAssign):
        self.generic_visit(node)
        if not isinstance(node.target, ast.Name) or type(node.op) not in _AUG_OPS:
            return node
        value = _call("augassign", ast.Name(node.target.id, ast.Load()),
                      ast.Constant(_AUG_OPS[type(node.op)]), node.value)
        out = ast.Assign(targets=[ast.Name(node.target.id, ast.Store())], value=value)
        return ast.copy_location(out, node)

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and \
                it.func.id == "range" and not it.keywords:
            it = ast.copy_location(_call("range", it.func, *it.args), it)
        names = _target_names(node.target)
        if names is not None:
            it = ast.copy_location(_call("loop", _as_tuple(names), it), it)
        node.iter = it
        return node

    def visit_With(self, node: ast.With):
        self.generic_visit(node)
        for item in node.items:
            names = _target_names(item.optional_vars) if item.optional_vars else None
            if names is not None:
                item.context_expr = ast.copy_location(
                    _call("bind", _as_tuple(names), item.context_expr), item.context_expr)
        return node

    # -- expressions: Python's lazy operators, deferred with lambdas so a Python operand keeps
    # its short-circuit (an operand with `:=`, `yield` or `await` keeps Python's meaning).

    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        if not _deferrable(node.values[1:]):
            return node
        op = "and" if isinstance(node.op, ast.And) else "or"
        out = _call("bool_op", ast.Constant(op), node.values[0], *map(_thunk, node.values[1:]))
        return ast.copy_location(out, node)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if not isinstance(node.op, ast.Not):
            return node
        return ast.copy_location(_call("not_", node.operand), node)

    def visit_Compare(self, node: ast.Compare):
        self.generic_visit(node)
        if len(node.ops) < 2 or not _deferrable(node.comparators):
            return node
        ops = ast.Tuple([ast.Constant(type(o).__name__) for o in node.ops], ast.Load())
        out = _call("compare_chain", ops, node.left, *map(_thunk, node.comparators))
        return ast.copy_location(out, node)

    def visit_IfExp(self, node: ast.IfExp):
        self.generic_visit(node)
        if not _deferrable([node.body, node.orelse]):
            return node
        out = _call("if_exp", node.test, _thunk(node.body), _thunk(node.orelse))
        return ast.copy_location(out, node)

    def visit_While(self, node: ast.While):
        self.generic_visit(node)
        node.test = ast.copy_location(_call("while_cond", node.test), node.test)
        return node
