"""A readable, TileLang-like text view of a program, for logs and debugging. Never parsed.

    kernel gemm(A: Tensor[(M, 1024), float16], B: Tensor[(1024, 1024), float16], ...):
      with Kernel(ceildiv(1024, 128), ceildiv(M, 128), threads=128) as (bx, by):
        A_shared = alloc_shared((128, 32), float16)
        clear(C_local)
        for k in Pipelined(32, num_stages=3):
          copy(A[by * 128 : +128, k * 32 : +32], A_shared)
          gemm(A_shared, B_shared, C_local)

Regions print as `buf[offset : +extent, ...]`, or as the bare name when they cover the whole
buffer. The printer accepts unverified programs: unknown ids and missing parts print as `?`,
and nesting deeper than `MAX_DEPTH` prints as `...`.
"""

from __future__ import annotations

import re
from collections import Counter

from tiled.ir import ops
from tiled.ir.dtypes import ENUM_TO_NAME
from tiled.ir.program import Program
from tiled.v1 import tile_ir_pb2 as pb

MAX_DEPTH = 150
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ATOM = 12  # precedence of names, calls and literals
_INDENT = "  "


def format_program(program: Program | pb.Program) -> str:
    """The text view of `program`; stable for a given message. Never raises for a message."""
    msg = program.proto if isinstance(program, Program) else program
    return _Printer(msg).program()


def format_expr(expr: pb.Expr, program: Program | pb.Program | None = None) -> str:
    """`expr` as source text (`bx * 128 + i`), for messages about one place of the source.
    Vars and buffers print with the debug names `program` gives them, as written (two loops'
    `i` both print `i`); an id without a usable name prints as `v<id>` / `b<id>`. Never raises
    for a message."""
    msg = program.proto if isinstance(program, Program) else program
    return _ExprPrinter(msg if msg is not None else pb.Program()).expr(expr, 0)[0]


def _dtype(dtype: int) -> str:
    return ENUM_TO_NAME.get(dtype, "?")


class _Printer:
    def __init__(self, p: pb.Program):
        self.p = p
        # Loop vars are named where their loop binds them (`loop_name`): two loops' `i` both
        # print `i`. Every other name is global, so it prints as written only when unique.
        self.loop_vars = _loop_vars(p)
        self.var_table = {v.id: v for v in p.vars}
        used = Counter(v.name for v in p.vars if v.id not in self.loop_vars) + \
            Counter(b.name for b in p.buffers)
        self.vars: dict[int, str] = {}
        self.bufs: dict[int, pb.Buffer] = {}
        self.buf_names: dict[int, str] = {}
        ids = Counter(v.id for v in p.vars)
        self.dup_ids = {i for i, n in ids.items() if n > 1}
        for v in p.vars:
            ok = ids[v.id] == 1 and used[v.name] == 1 and _IDENT.fullmatch(v.name)
            self.vars.setdefault(v.id, v.name if ok else f"v{v.id}")
        self.live = set(used)  # the names a loop var must not shadow here
        ids = Counter(b.id for b in p.buffers)
        for b in p.buffers:
            ok = ids[b.id] == 1 and used[b.name] == 1 and _IDENT.fullmatch(b.name)
            self.bufs.setdefault(b.id, b)
            self.buf_names.setdefault(b.id, b.name if ok else f"b{b.id}")
        self.lines: list[str] = []

    def var(self, vid: int) -> str:
        return self.vars.get(vid, "?")

    def loop_name(self, vid: int) -> str:
        """The name of a loop var bound here: as written, unless a name in scope (an enclosing
        loop's, a buffer's, a dim's) has it; then with a suffix, `i_1`."""
        v = self.var_table.get(vid)
        base = v.name if v is not None and vid not in self.dup_ids and \
            _IDENT.fullmatch(v.name) else f"v{vid}"
        name, n = base, 0
        while name in self.live:
            n += 1
            name = f"{base}_{n}"
        self.vars[vid] = name
        return name

    def buf(self, bid: int) -> str:
        return self.buf_names.get(bid, "?")

    def shape(self, b: pb.Buffer) -> str:
        dims = [str(d.size) if d.WhichOneof("kind") == "size"
                else self.var(d.var) if d.WhichOneof("kind") == "var" else "?" for d in b.shape]
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"

    # -- program ---------------------------------------------------------------------------

    def program(self) -> str:
        p, params, is_param = self.p, [], set()
        for prm in p.params:
            kind = prm.WhichOneof("kind")
            if kind == "buffer" and prm.buffer in self.bufs:
                b = self.bufs[prm.buffer]
                is_param.add(prm.buffer)
                params.append(f"{prm.name}: Tensor[{self.shape(b)}, {_dtype(b.dtype)}]")
            elif kind == "scalar":
                dt = next((v.dtype for v in p.vars if v.id == prm.scalar), None)
                params.append(f"{prm.name}: {_dtype(dt) if dt is not None else '?'}")
            else:
                params.append(f"{prm.name}: ?")
        self.lines.append(f"kernel {p.name}({', '.join(params)}):")
        if not p.HasField("kernel"):
            self.lines.append(_INDENT + "pass  # no kernel")
            return "\n".join(self.lines)
        k = p.kernel
        grid = [self.expr(g, 2)[0] for g in k.grid]
        names = [self.var(v) for v in k.block_vars]
        bound = names[0] if len(names) == 1 else f"({', '.join(names)})"
        args = ", ".join([*grid, f"threads={k.threads}"])
        self.lines.append(f"{_INDENT}with Kernel({args}) as {bound}:")
        for b in p.buffers:
            if b.id in is_param:
                continue
            scope = ops.SCOPE_NAME.get(b.scope, "?")
            if b.scope == pb.BARRIER:
                n = b.shape[0].size if len(b.shape) == 1 else "?"
                self.lines.append(f"{_INDENT * 2}{self.buf(b.id)} = alloc_barrier({n}, "
                                  f"arrive_count={b.arrive_count})")
            else:
                self.lines.append(f"{_INDENT * 2}{self.buf(b.id)} = alloc_{scope}("
                                  f"{self.shape(b)}, {_dtype(b.dtype)})")
        if k.HasField("body"):
            self.stmt(k.body, 2, 2)
        else:
            self.lines.append(_INDENT * 2 + "pass")
        return "\n".join(self.lines)

    # -- statements ------------------------------------------------------------------------

    def emit(self, indent: int, text: str) -> None:
        self.lines.append(_INDENT * indent + text)

    def stmt(self, s: pb.Stmt, indent: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.emit(indent, "...")
            return
        kind = s.WhichOneof("kind")
        d = depth + 1
        if kind == "seq":
            if not s.seq.stmts:
                self.emit(indent, "pass")
            for sub in s.seq.stmts:
                self.stmt(sub, indent, d)
        elif kind == "for_":
            f = s.for_
            args = [self.expr(f.extent, d)[0]]
            if f.num_stages or f.kind == pb.PIPELINED:
                args.append(f"num_stages={f.num_stages}")
            name = self.loop_name(f.var)
            self.emit(indent, f"for {name} in "
                              f"{ops.LOOP_KIND_NAME.get(f.kind, '?')}({', '.join(args)}):")
            self.live.add(name)
            self.body(f.body if f.HasField("body") else None, indent + 1, d)
            self.live.discard(name)
        elif kind == "if_then_else":
            s_if = s.if_then_else
            self.emit(indent, f"if {self.expr(s_if.cond, d)[0]}:")
            self.body(s_if.then_body if s_if.HasField("then_body") else None, indent + 1, d)
            if s_if.HasField("else_body"):
                self.emit(indent, "else:")
                self.body(s_if.else_body, indent + 1, d)
        elif kind in ("store", "atomic_add"):
            x = getattr(s, kind)
            target = f"{self.buf(x.buffer)}[{self.exprs(x.indices, d)}]"
            value = self.expr(x.value, d)[0]
            if kind == "store":
                self.emit(indent, f"{target} = {value}")
            else:
                order = pb.MemoryOrder.Name(x.order).removeprefix("ORDER_").lower() \
                    if x.order in pb.MemoryOrder.values() else f"order {x.order}"
                call = f"{ops.ATOMIC_NAME.get(x.op, 'atomic_?')}({target}, {value}" + \
                    (f", memory_order={order!r})" if x.order else ")")
                self.emit(indent, f"{self.buf(x.prev)} = {call}" if x.has_prev else call)
        elif kind == "copy":
            c = s.copy
            src, dst = self.region(c.src, d), self.region(c.dst, d)
            if c.HasField("tma"):
                self.emit(indent, f"tma_copy({src}, {dst}, {self.barrier(c.tma, d)})")
            else:
                self.emit(indent, f"copy({src}, {dst})")
        elif kind == "gemm":
            g = s.gemm
            flags = [f"{n}=True" for n in ("transpose_a", "transpose_b", "clear_accum")
                     if getattr(g, n)]
            a, b = (self.buf(x) + (f"[{self.exprs(index, d)}]" if index else "")
                    for x, index in ((g.a, g.a_index), (g.b, g.b_index)))
            if g.policy != pb.POLICY_SQUARE:
                flags.append(f"policy={ops.GEMM_POLICY_NAME.get(g.policy, '?')}")
            args = [a, b, self.buf(g.c), *flags]
            self.emit(indent, f"gemm({', '.join(args)})")
        elif kind == "fill":
            dst, value = self.region(s.fill.dst, d), s.fill.value
            zero = value.WhichOneof("kind") in ("int_value", "float_value") and not (
                value.int_value or value.float_value)
            if zero and "[" not in dst:
                self.emit(indent, f"clear({dst})")
            else:
                self.emit(indent, f"fill({dst}, {self.expr(value, d)[0]})")
        elif kind == "reduce":
            r = s.reduce
            self.emit(indent, f"{ops.REDUCE_NAME.get(r.kind, 'reduce_?')}({self.buf(r.src)}, "
                              f"{self.buf(r.dst)}, dim={r.dim}, clear={r.clear})")
        elif kind == "scan":
            sc = s.scan
            bufs = self.buf(sc.src) if sc.src == sc.dst else \
                f"{self.buf(sc.src)}, {self.buf(sc.dst)}"
            rev = ", reverse=True" if sc.reverse else ""
            self.emit(indent, f"cumsum({bufs}, dim={sc.dim}{rev})")
        elif kind == "warp_group":
            w = s.warp_group
            regs = f", regs={w.regs}" if w.regs else ""
            self.emit(indent, f"with ws({w.group}{regs}):")
            self.body(w.body if w.HasField("body") else None, indent + 1, d)
        elif kind == "mbarrier":
            op = s.mbarrier
            args = [self.barrier(op.barrier, d)]
            if op.HasField("value"):
                args.append(self.expr(op.value, d)[0])
            self.emit(indent, f"{ops.MBARRIER_NAME.get(op.kind, 'mbarrier_?')}({', '.join(args)})")
        elif kind == "fence_proxy_async":
            self.emit(indent, "fence_proxy_async()")
        elif kind == "grid_dependency":
            self.emit(indent, "pdl_trigger()" if s.grid_dependency.trigger else "pdl_sync()")
        else:
            self.emit(indent, "pass  # empty statement")

    def barrier(self, ref: pb.BarrierRef, depth: int) -> str:
        return f"{self.buf(ref.barrier)}[{self.expr(ref.index, depth)[0]}]"

    def body(self, s: pb.Stmt | None, indent: int, depth: int) -> None:
        if s is None:
            self.emit(indent, "pass  # no body")
        else:
            self.stmt(s, indent, depth)

    def region(self, r: pb.Region, depth: int) -> str:
        b = self.bufs.get(r.buffer)
        name = self.buf(r.buffer)
        whole = (b is not None and len(r.offsets) == len(r.extents) == len(b.shape)
                 and all(o.WhichOneof("kind") == "int_value" and o.int_value == 0
                         for o in r.offsets)
                 and all(d.WhichOneof("kind") == "size" and d.size == e
                         for d, e in zip(b.shape, r.extents, strict=True)))
        if whole:
            return name
        offsets = [self.expr(o, depth)[0] for o in r.offsets]
        extents = [str(e) for e in r.extents]
        n = max(len(offsets), len(extents))
        offsets += ["?"] * (n - len(offsets))
        extents += ["?"] * (n - len(extents))
        return f"{name}[{', '.join(f'{o} : +{e}' for o, e in zip(offsets, extents, strict=True))}]"

    # -- expressions -----------------------------------------------------------------------

    def exprs(self, es, depth: int) -> str:
        return ", ".join(self.expr(e, depth)[0] for e in es)

    def expr(self, e: pb.Expr, depth: int) -> tuple[str, int]:
        """(text, precedence) of `e`; precedence as in ops.BINARY_SYMBOL."""
        if depth > MAX_DEPTH:
            return "...", _ATOM
        d = depth + 1
        kind = e.WhichOneof("kind")
        if kind == "int_value":
            v = e.int_value
            if e.dtype == pb.BOOL and v in (0, 1):
                return str(bool(v)), _ATOM
            text = str(v) if e.dtype == pb.INT32 else f"{_dtype(e.dtype)}({v})"
            return text, (11 if text.startswith("-") else _ATOM)
        if kind == "float_value":
            v = repr(e.float_value)
            text = v if e.dtype == pb.FLOAT32 else f"{_dtype(e.dtype)}({v})"
            return text, (11 if text.startswith("-") else _ATOM)
        if kind == "var":
            return self.var(e.var), _ATOM
        if kind == "binary":
            return self.binary(e.binary, d)
        if kind == "call":
            name = ops.INTRINSIC_NAME.get(e.call.op, "?")
            if e.call.op == pb.REINTERPRET:  # TileLang's T.reinterpret(dtype, value)
                return f'{name}("{_dtype(e.dtype)}", {self.exprs(e.call.args, d)})', _ATOM
            return f"{name}({self.exprs(e.call.args, d)})", _ATOM
        if kind == "cast":
            return f"{_dtype(e.dtype)}({self.expr(e.cast.value, d)[0]})", _ATOM
        if kind == "select":
            s = e.select
            parts = [self.expr(x, d)[0] for x in (s.cond, s.true_value, s.false_value)]
            return f"select({', '.join(parts)})", _ATOM
        if kind == "load":
            return f"{self.buf(e.load.buffer)}[{self.exprs(e.load.indices, d)}]", _ATOM
        return "?", _ATOM

    def binary(self, b: pb.Binary, depth: int) -> tuple[str, int]:
        if b.op in ops.BINARY_FUNCTION:
            a, c = self.expr(b.a, depth)[0], self.expr(b.b, depth)[0]
            return f"{ops.BINARY_FUNCTION[b.op]}({a}, {c})", _ATOM
        n = _ceildiv_divisor(b)
        if n is not None:
            return f"ceildiv({self.expr(b.a.binary.a, depth)[0]}, {n})", _ATOM
        sym, prec = ops.BINARY_SYMBOL.get(b.op, ("?", 0))
        (a, pa), (c, pc) = self.expr(b.a, depth), self.expr(b.b, depth)
        # Left-associative: the left operand keeps equal precedence bare, the right does not.
        # Comparisons do not chain, so both sides of one get parentheses at equal precedence.
        if pa < prec or (pa == prec and prec == 4):
            a = f"({a})"
        if pc <= prec:
            c = f"({c})"
        return f"{a} {sym} {c}", prec


class _ExprPrinter(_Printer):
    def __init__(self, p: pb.Program):
        super().__init__(p)
        for v in p.vars:
            if _IDENT.fullmatch(v.name):
                self.vars[v.id] = v.name
        for b in p.buffers:
            if _IDENT.fullmatch(b.name):
                self.buf_names[b.id] = b.name

    def var(self, vid: int) -> str:
        return self.vars.get(vid, f"v{vid}")

    def buf(self, bid: int) -> str:
        return self.buf_names.get(bid, f"b{bid}")


def _loop_vars(p: pb.Program) -> set[int]:
    """The ids of the vars For statements bind (an explicit stack: programs may nest deep)."""
    out: set[int] = set()
    stack = [p.kernel.body] if p.HasField("kernel") and p.kernel.HasField("body") else []
    while stack:
        s = stack.pop()
        kind = s.WhichOneof("kind")
        if kind == "seq":
            stack.extend(s.seq.stmts)
        elif kind == "for_":
            out.add(s.for_.var)
            if s.for_.HasField("body"):
                stack.append(s.for_.body)
        elif kind == "if_then_else":
            for f in ("then_body", "else_body"):
                if s.if_then_else.HasField(f):
                    stack.append(getattr(s.if_then_else, f))
        elif kind == "warp_group" and s.warp_group.HasField("body"):
            stack.append(s.warp_group.body)
    return out


def _ceildiv_divisor(b: pb.Binary) -> int | None:
    """n when `b` is `(x + (n - 1)) // n` with constant n > 1, the spelling of ceildiv(x, n)."""
    if b.op != pb.FLOOR_DIV or b.b.WhichOneof("kind") != "int_value":
        return None
    n = b.b.int_value
    a = b.a
    if (n > 1 and a.WhichOneof("kind") == "binary" and a.binary.op == pb.ADD
            and a.binary.b.WhichOneof("kind") == "int_value" and a.binary.b.int_value == n - 1):
        return n
    return None
