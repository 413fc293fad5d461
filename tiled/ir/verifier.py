"""The Tile IR verifier: every rule a program must meet before a compiler may see it.

`verify_program` either returns or raises `VerifyError` whose `path` names the offending field
(`kernel.body.seq.stmts[2].copy.src.offsets[0]`) and whose `loc` is the author's `file:line` of
the nearest enclosing statement. It accepts any decoded message, however malformed: it never
raises another exception, its work is bounded by `Limits.max_nodes` and its recursion by
`Limits.max_depth`.

Static bounds use integer intervals: each integer expression gets [lo, hi] and, per end,
whether that end is *attained*, i.e. reached by every execution that reaches the expression at
all (loop and block vars start at 0; constant extents reach their last iteration). An access to
a SHARED, FRAGMENT or LOCAL buffer is rejected when it is provably out of bounds: the whole
interval lies outside, or an attained end does. A GLOBAL element access is rejected only when
it is outside on every execution (the whole interval): the compiler guards the others (a load
outside reads 0, a store outside is skipped; TileLang's semantics), and `index()` returns each
interval for that pass (tiled.compiler.passes.guards). A global region may run past the end (a
ragged tail), not start past it. Guards (`if i < 64`, `select(i < 64, ...)`) narrow intervals;
a guard the analysis cannot read makes the vars it mentions inexact, so guarded code is never
rejected wrongly. Code that never runs may still be rejected when its access would be out of
bounds whenever it ran (`if flag[0] > 9: S[200] = 0` with S of 128): that is a bug even if no
input reaches it.

The same intervals reject integer operations that are undefined where they provably happen:
a shift by an amount outside [0, bits), a division or modulo by 0, a signed overflow (unsigned
arithmetic wraps, as defined); and constants the compiler folds but no dtype holds (`uint8(-1)`,
`float16(1e6)`, a float division by 0.0, `1 << 31` in int32). Names that become C identifiers
(parameters, symbolic dims) must be valid, unreserved and distinct, and a kernel's buffers must
fit Limits: shared memory, local memory per thread, memory per block.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import NoReturn

from tiled import config
from tiled.errors import VerifyError
from tiled.ir import dtypes, ops
from tiled.ir.dtypes import ENUM_TO_NAME, nbytes
from tiled.ir.intervals import _binary_exact, _binary_iv, _const, _fit, _full, _Iv
from tiled.ir.program import SCHEMA_VERSION, Program
from tiled.ir.verify_ws import WarpSpecializedRules
from tiled.v1 import tile_ir_pb2 as pb

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_DIM = (1 << 31) - 1
_INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program. Defaults suit a server accepting untrusted programs."""

    max_nodes: int = 200_000  # IR nodes: exprs, stmts, regions, table entries
    max_depth: int = 200  # statement + expression nesting
    max_threads: int = 1024
    max_loop_extent: int = (1 << 31) - 1  # constant loop extents
    max_tile_elements: int = 1 << 22  # elements of one non-GLOBAL buffer or one region
    max_shared_bytes: int = field(default_factory=lambda: config.get("max_shared_bytes"))
    # Per thread: LOCAL buffers, plus FRAGMENT buffers spread over the block's threads.
    max_local_bytes: int = 64 * 1024
    # Per block, every non-GLOBAL buffer: the cpu backend runs a block on one thread and
    # allocates them all (LOCAL ones once), for as many blocks as it runs at once.
    max_block_bytes: int = 32 << 20


_GUARD_WORK = 256  # expression nodes one guard analysis may visit
_NEGATE = {pb.LT: pb.GE, pb.LE: pb.GT, pb.GT: pb.LE, pb.GE: pb.LT, pb.EQ: pb.NE, pb.NE: pb.EQ}
_MIRROR = {pb.LT: pb.GT, pb.LE: pb.GE, pb.GT: pb.LT, pb.GE: pb.LE, pb.EQ: pb.EQ, pb.NE: pb.NE}
# Scalar parameter dtypes no kernel ABI passes (TVM's packed calls take no bfloat16 or fp8
# scalar; the CUDA launcher has no fp8 one either).
_NO_SCALAR = frozenset({pb.BFLOAT16, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2})
# What the launch manifest can evaluate (tiled.compiler.manifest.expr_json).
_GRID_OPS = frozenset({pb.ADD, pb.SUB, pb.MUL, pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD, pb.MIN,
                       pb.MAX})
_GRID_RULE = ("the launch manifest computes the grid from tensor shapes: it may use only "
              "symbolic dims, constants, casts and + - * / // % min max")
_BOUND_HOW = {"dim": "a symbolic dim", "scalar": "a scalar parameter",
              "block": "a block var", "loop": "a loop var"}


def _printable(name: str) -> bool:
    return len(name) <= 64 and _IDENT.fullmatch(name) is not None


def _c_name_problem(name: str) -> str | None:
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


class _Verifier(WarpSpecializedRules):
    def __init__(self, program: pb.Program, limits: Limits):
        self.p, self.limits = program, limits
        self.nodes = 0
        self.vars: dict[int, pb.Var] = {}
        self.bufs: dict[int, pb.Buffer] = {}
        self.shape: dict[int, list] = {}  # buffer id -> dims: int, or the dim var's name
        self.bound: dict[int, str] = {}  # var id -> "dim" | "scalar" | "block" | "loop"
        self.in_scope: set[int] = set()
        self.env: dict[int, _Iv] = {}  # integer vars in scope -> their range here
        self.dead = False  # inside code no execution reaches: skip bounds checks
        self.parallel = 0  # PARALLEL loops around the current statement
        self.loc = ""
        self.init_ws()

    # -- helpers -------------------------------------------------------------------------------

    def fail(self, message: str, path: tuple | None) -> NoReturn:
        raise VerifyError(message, _render(path), self.loc)

    def count(self, path: tuple, n: int = 1) -> None:
        self.nodes += n
        if self.nodes > self.limits.max_nodes:
            self.fail(f"program has more than {self.limits.max_nodes} IR nodes; "
                      "split the kernel or raise Limits.max_nodes", path)

    def deep(self, depth: int, path: tuple) -> None:
        if depth > self.limits.max_depth:
            self.fail(f"program nests deeper than {self.limits.max_depth} statements and "
                      "expressions", path)

    def vname(self, vid: int) -> str:
        v = self.vars.get(vid)
        return v.name if v is not None and _printable(v.name) else f"v{vid}"

    def bname(self, bid: int) -> str:
        b = self.bufs.get(bid)
        return b.name if b is not None and _printable(b.name) else f"b{bid}"

    def var(self, vid: int, path: tuple) -> pb.Var:
        v = self.vars.get(vid)
        if v is None:
            self.fail(f"unknown var id {vid}: it is not in the program's var table", path)
        return v

    def buffer(self, bid: int, path: tuple) -> pb.Buffer:
        b = self.bufs.get(bid)
        if b is None:
            self.fail(f"unknown buffer id {bid}: it is not in the program's buffer table", path)
        return b

    def bind(self, vid: int, how: str, path: tuple) -> None:
        prev = self.bound.get(vid)
        if prev is not None:
            self.fail(f"{self.vname(vid)} is bound twice: first as {_BOUND_HOW[prev]}, again "
                      f"as {_BOUND_HOW[how]}; every var is bound exactly once", path)
        self.bound[vid] = how

    # -- program tables ------------------------------------------------------------------------

    def tables(self) -> None:
        p, lim = self.p, self.limits
        if p.schema_version != SCHEMA_VERSION:
            self.fail(f"schema version {p.schema_version} is not supported (expected "
                      f"{SCHEMA_VERSION})", (None, "schema_version"))
        if len(p.name) > 128 or not _IDENT.fullmatch(p.name):
            self.fail(f"kernel name {p.name[:64]!r} is not an identifier of at most 128 chars",
                      (None, "name"))
        self.count((None, "vars"), len(p.vars) + len(p.buffers) + len(p.params))
        for i, v in enumerate(p.vars):
            path = (None, f"vars[{i}]")
            if v.id in self.vars:
                self.fail(f"var id {v.id} is declared twice", path)
            self.vars[v.id] = v
            if v.dtype not in ops.DTYPES:
                self.fail(f"var {self.vname(v.id)} has "
                          f"{'no dtype' if v.dtype == 0 else f'unknown dtype {v.dtype}'}", path)
        shared: list[tuple[int, str, int]] = []  # (bytes, name, index in the table)
        for i, b in enumerate(p.buffers):
            path = (None, f"buffers[{i}]")
            if b.id in self.bufs:
                self.fail(f"buffer id {b.id} is declared twice", path)
            self.bufs[b.id] = b
            self.buffer_decl(b, path)
            if b.scope in (pb.SHARED, pb.BARRIER):  # barriers are 8 bytes each, in shared memory
                shared.append((self.elements(b) * nbytes(b.dtype), self.bname(b.id), i))
        total = sum(n for n, _, _ in shared)
        if total > lim.max_shared_bytes:
            biggest = ", ".join(f"{name} {_kib(n)}" for n, name, _ in sorted(shared)[::-1][:3])
            running, (_, crossing, i) = 0, shared[-1]
            for n, name, j in shared:  # the allocation that crosses the limit
                running += n
                if running > lim.max_shared_bytes:
                    crossing, i = name, j
                    break
            self.loc = _loc_str(p.buffers[i].loc)
            self.fail(f"kernel allocates {_kib(total)} of shared memory, the limit is "
                      f"{_kib(lim.max_shared_bytes)}: reduce block sizes or num_stages "
                      f"(largest: {biggest}; {crossing} crosses the limit)",
                      (None, f"buffers[{i}]"))
        self.params()

    def elements(self, b: pb.Buffer) -> int:
        n = 1
        for d in self.shape[b.id]:
            n *= d
        return n

    def buffer_decl(self, b: pb.Buffer, path: tuple) -> None:
        name = self.bname(b.id)
        if b.dtype not in ops.DTYPES:
            self.fail(f"buffer {name} has "
                      f"{'no dtype' if b.dtype == 0 else f'unknown dtype {b.dtype}'}", path)
        if b.scope not in ops.SCOPES:
            self.fail(f"buffer {name} has "
                      f"{'no scope' if b.scope == 0 else f'unknown scope {b.scope}'}", path)
        if not 1 <= len(b.shape) <= 8:
            self.fail(f"buffer {name} has rank {len(b.shape)}; ranks 1 to 8 are supported", path)
        self.count(path, len(b.shape))
        dims: list = []
        for j, d in enumerate(b.shape):
            dpath = (path, f".shape[{j}]")
            kind = d.WhichOneof("kind")
            if kind == "size":
                if not 1 <= d.size <= _MAX_DIM:
                    self.fail(f"dim {j} of {name} is {d.size}; static dims must be in "
                              f"1..{_MAX_DIM}", dpath)
                dims.append(d.size)
            elif kind == "var":
                v = self.var(d.var, (dpath, ".var"))
                if v.dtype != pb.INT32:
                    self.fail(f"symbolic dim {self.vname(d.var)} of {name} must be an int32 "
                              f"var, not {_dt(v.dtype)}", (dpath, ".var"))
                if b.scope != pb.GLOBAL:
                    self.fail(f"{ops.SCOPE_NAME[b.scope]} buffer {name} has symbolic dim "
                              f"{self.vname(d.var)}; only GLOBAL buffers may have symbolic "
                              "dims, tiles need static shapes", (dpath, ".var"))
                dims.append(self.vname(d.var))
            else:
                self.fail(f"dim {j} of {name} has neither a size nor a var", dpath)
        self.shape[b.id] = dims
        self.barrier_decl(b, path)
        if b.scope != pb.GLOBAL and self.elements(b) > self.limits.max_tile_elements:
            self.fail(f"{ops.SCOPE_NAME[b.scope]} buffer {name} of shape {_shape_str(dims)} has "
                      f"{self.elements(b)} elements; the limit is "
                      f"{self.limits.max_tile_elements}", path)

    def params(self) -> None:
        names: set[str] = set()
        param_of: dict[int, int] = {}
        for i, prm in enumerate(self.p.params):
            path = (None, f"params[{i}]")
            problem = _c_name_problem(prm.name)
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
                problem = _c_name_problem(name)
                if problem:
                    self.fail(f"{what}: the name {problem}", path)
                kind, who = taken.setdefault(name, ("dim", d.var))
                if (kind, who) != ("dim", d.var):
                    other = f"dim var {who}" if kind == "dim" else \
                        f"parameter {params[who].name}" if kind == "param" else \
                        f"tensor parameter {params[who].name}'s data pointer"
                    self.fail(f"{what} has the name of {other}; dims and parameters need "
                              "distinct C names", path)

    def memory(self, threads: int) -> None:
        """The per-thread and per-block totals of Limits (max_local_bytes, max_block_bytes)."""
        lim, buffers = self.limits, self.p.buffers
        per_thread: list[tuple[int, int]] = []  # (bytes, index in the table)
        per_block: list[tuple[int, int]] = []
        for i, b in enumerate(buffers):
            if b.scope == pb.GLOBAL:
                continue
            n = self.elements(b) * nbytes(b.dtype)
            per_block.append((n, i))
            if b.scope == pb.LOCAL:
                per_thread.append((n, i))
            elif b.scope == pb.FRAGMENT:
                per_thread.append((-(-n // threads), i))
        for sizes, limit, what, knob in (
                (per_thread, lim.max_local_bytes, "local memory per thread (LOCAL buffers, and "
                 f"FRAGMENT buffers spread over the block's {threads} threads)",
                 "max_local_bytes"),
                (per_block, lim.max_block_bytes, "memory per block (SHARED, FRAGMENT and LOCAL "
                 "buffers together)", "max_block_bytes")):
            total = sum(n for n, _ in sizes)
            if total <= limit:
                continue
            running, i = 0, sizes[-1][1]
            for n, j in sizes:  # the allocation that crosses the limit
                running += n
                if running > limit:
                    i = j
                    break
            biggest = ", ".join(f"{self.bname(buffers[j].id)} {_size(n)}"
                                for n, j in sorted(sizes, key=lambda s: (-s[0], s[1]))[:3])
            self.loc = _loc_str(buffers[i].loc) or self.loc
            self.fail(f"kernel allocates {_size(total)} of {what}, the limit is {_size(limit)} "
                      f"(Limits.{knob}): use fewer or smaller buffers (largest: {biggest}; "
                      f"{self.bname(buffers[i].id)} crosses the limit)", (None, f"buffers[{i}]"))

    # -- kernel --------------------------------------------------------------------------------

    def kernel(self) -> None:
        if not self.p.HasField("kernel"):
            self.fail("program has no kernel", (None, "kernel"))
        k, lim = self.p.kernel, self.limits
        kp = (None, "kernel")
        if k.HasField("loc"):
            self.loc = _loc_str(k.loc)
        if not 1 <= len(k.grid) <= 3:
            self.fail(f"kernel grid has {len(k.grid)} dims; it needs 1 to 3", (kp, ".grid"))
        if len(k.block_vars) != len(k.grid):
            self.fail(f"kernel has {len(k.grid)} grid dims but {len(k.block_vars)} block vars; "
                      "it needs one block var per grid dim", (kp, ".block_vars"))
        if not 1 <= k.threads <= lim.max_threads:
            self.fail(f"kernel asks for {k.threads} threads per block; it needs 1 to "
                      f"{lim.max_threads}", (kp, ".threads"))
        self.memory(k.threads)
        grid = []
        for i, g in enumerate(k.grid):
            path = (kp, f".grid[{i}]")
            iv = self.expr(g, path, 1, launch=True)
            if g.dtype not in ops.INT_DTYPES:
                self.fail(f"grid dim {i} has dtype {_dt(g.dtype)}; it must be an integer", path)
            if iv.hi < 1:
                self.fail(f"grid dim {i} launches {iv.hi} blocks; it needs at least 1", path)
            grid.append(iv)
        for i, vid in enumerate(k.block_vars):
            path = (kp, f".block_vars[{i}]")
            v = self.var(vid, path)
            if v.dtype != pb.INT32:
                self.fail(f"block var {self.vname(vid)} must be int32, not {_dt(v.dtype)}", path)
            self.bind(vid, "block", path)
            g = grid[i]
            # Block 0 runs in every launch that runs anything: the low end is attained.
            self.env[vid] = _Iv(0, min(g.hi, _INT32_MAX) - 1, True,
                                g.hi_exact and g.hi <= _INT32_MAX, frozenset([vid]))
            self.in_scope.add(vid)
        if not k.HasField("body"):
            self.fail("kernel has no body", (kp, ".body"))
        self.stmt(k.body, (kp, ".body"), 1)
        self.loc = ""  # the tables are outside the kernel's source
        for i, v in enumerate(self.p.vars):
            if v.id not in self.bound:
                self.fail(f"var {self.vname(v.id)} is declared but never bound: it is not a "
                          "parameter, a symbolic dim, a block var or a loop var",
                          (None, f"vars[{i}]"))

    # -- statements ----------------------------------------------------------------------------

    def stmt(self, s: pb.Stmt, path: tuple, depth: int) -> None:
        self.count(path)
        self.deep(depth, path)
        outer = self.loc
        if s.HasField("loc") and _loc_str(s.loc):
            self.loc = _loc_str(s.loc)
        kind = s.WhichOneof("kind")
        if kind is None:
            self.fail("empty statement: it has no kind", path)
        getattr(self, "s_" + kind)(getattr(s, kind), (path, "." + kind), depth)
        self.loc = outer

    def s_seq(self, seq: pb.Seq, path: tuple, depth: int) -> None:
        for i, s in enumerate(seq.stmts):
            self.stmt(s, (path, f".stmts[{i}]"), depth + 1)

    def s_for_(self, f: pb.For, path: tuple, depth: int) -> None:
        v = self.var(f.var, (path, ".var"))
        name = self.vname(f.var)
        if v.dtype != pb.INT32:
            self.fail(f"loop var {name} must be int32, not {_dt(v.dtype)}", (path, ".var"))
        self.bind(f.var, "loop", (path, ".var"))
        if not f.HasField("extent"):
            self.fail(f"loop over {name} has no extent", (path, ".extent"))
        ext = self.int_expr(f.extent, (path, ".extent"), depth + 1, f"extent of loop {name}")
        c = _const(ext)
        if c is not None and not 0 <= c <= self.limits.max_loop_extent:
            self.fail(f"loop over {name} has extent {c}; it must be in 0.."
                      f"{self.limits.max_loop_extent}", (path, ".extent"))
        if f.kind not in ops.LOOP_KINDS:
            self.fail(f"loop over {name} has "
                      f"{'no kind' if f.kind == 0 else f'unknown kind {f.kind}'}", (path, ".kind"))
        if f.kind == pb.PIPELINED and not 1 <= f.num_stages <= 8:
            self.fail(f"pipelined loop over {name} has num_stages {f.num_stages}; it needs 1 to 8",
                      (path, ".num_stages"))
        if f.kind != pb.PIPELINED and f.num_stages != 0:
            self.fail(f"loop over {name} sets num_stages {f.num_stages} but is not pipelined",
                      (path, ".num_stages"))
        if not f.HasField("body"):
            self.fail(f"loop over {name} has no body", (path, ".body"))
        saved_env, saved_dead = self.env, self.dead
        self.env = dict(self.env)
        if ext.hi < 1:
            self.dead = True  # never runs
        # "Attained" means: reached by every execution that reaches the statement at all, so
        # 0 is attained whatever the extent (a loop that runs, runs iteration 0).
        self.env[f.var] = _Iv(0, min(ext.hi - 1, _INT32_MAX), True,
                              ext.hi_exact and ext.hi - 1 <= _INT32_MAX,
                              ext.deps | {f.var})
        self.in_scope.add(f.var)
        self.parallel += f.kind == pb.PARALLEL
        self.stmt(f.body, (path, ".body"), depth + 1)
        self.parallel -= f.kind == pb.PARALLEL
        self.in_scope.discard(f.var)
        self.env, self.dead = saved_env, saved_dead

    def s_if_then_else(self, s: pb.IfThenElse, path: tuple, depth: int) -> None:
        if not s.HasField("cond"):
            self.fail("if has no condition", (path, ".cond"))
        self.expr(s.cond, (path, ".cond"), depth + 1)
        if s.cond.dtype != pb.BOOL:
            self.fail(f"if condition has dtype {_dt(s.cond.dtype)}; it must be bool",
                      (path, ".cond"))
        if not s.HasField("then_body"):
            self.fail("if has no then body", (path, ".then_body"))
        saved = self.env, self.dead
        self.env, self.dead = self.refined(s.cond, False)
        self.stmt(s.then_body, (path, ".then_body"), depth + 1)
        if s.HasField("else_body"):
            self.env, self.dead = saved
            self.env, self.dead = self.refined(s.cond, True)
            self.stmt(s.else_body, (path, ".else_body"), depth + 1)
        self.env, self.dead = saved

    def s_store(self, s: pb.Store, path: tuple, depth: int) -> None:
        self.element_access(s, path, depth, "store")

    def s_atomic_add(self, s: pb.AtomicAdd, path: tuple, depth: int) -> None:
        b = self.element_access(s, path, depth, "atomic_add")
        if b.scope not in (pb.GLOBAL, pb.SHARED):
            self.fail(f"atomic_add into {ops.SCOPE_NAME[b.scope]} buffer {self.bname(b.id)}; "
                      "atomics work on GLOBAL or SHARED buffers", (path, ".buffer"))
        if b.dtype == pb.BOOL:
            self.fail(f"atomic_add into bool buffer {self.bname(b.id)}", (path, ".buffer"))

    def element_access(self, s, path: tuple, depth: int, what: str) -> pb.Buffer:
        b = self.buffer(s.buffer, (path, ".buffer"))
        self.indices(b, s.indices, path, depth)
        if not s.HasField("value"):
            self.fail(f"{what} into {self.bname(b.id)} has no value", (path, ".value"))
        self.expr(s.value, (path, ".value"), depth + 1)
        if s.value.dtype != b.dtype:
            self.fail(f"{what} of {_dt(s.value.dtype)} value into {_dt(b.dtype)} buffer "
                      f"{self.bname(b.id)}; cast the value", (path, ".value"))
        return b

    def tile_op(self, what: str, path: tuple) -> None:
        if self.parallel:
            self.fail(f"{what} is a tile op run by the whole block; it cannot appear inside a "
                      "Parallel loop", path)

    def s_copy(self, c: pb.Copy, path: tuple, depth: int) -> None:
        self.tile_op("copy", path)
        for side in ("src", "dst"):
            if not c.HasField(side):
                self.fail(f"copy has no {side} region", (path, "." + side))
        src = self.region(c.src, (path, ".src"), depth + 1)
        dst = self.region(c.dst, (path, ".dst"), depth + 1)
        if c.HasField("tma"):
            self.tma_copy(c, src, dst, path, depth)
        if src.scope == pb.GLOBAL and dst.scope == pb.GLOBAL:
            self.fail(f"copy from global {self.bname(src.id)} to global {self.bname(dst.id)}; "
                      "one side must be SHARED, FRAGMENT or LOCAL", path)
        s_shape = [e for e in c.src.extents if e != 1]
        d_shape = [e for e in c.dst.extents if e != 1]
        if s_shape != d_shape:
            self.fail(f"copy shapes differ: the {self.bname(src.id)} tile is "
                      f"{_shape_str(c.src.extents)} but the {self.bname(dst.id)} tile is "
                      f"{_shape_str(c.dst.extents)}", path)

    def s_gemm(self, g: pb.Gemm, path: tuple, depth: int) -> None:
        self.tile_op("gemm", path)
        bufs = {}
        for role in ("a", "b", "c"):
            b = self.buffer(getattr(g, role), (path, "." + role))
            index = getattr(g, role + "_index") if role != "c" else ()
            ok = (pb.FRAGMENT,) if role == "c" else (pb.SHARED, pb.FRAGMENT)
            if b.scope not in ok:
                self.fail(f"gemm operand {role.upper()} is {ops.SCOPE_NAME.get(b.scope, '?')} "
                          f"buffer {self.bname(b.id)}; it must be "
                          f"{' or '.join(ops.SCOPE_NAME[s].upper() for s in ok)}",
                          (path, "." + role))
            if b.dtype == pb.BOOL:
                self.fail(f"gemm operand {role.upper()} ({self.bname(b.id)}) is bool; gemm "
                          "multiplies and adds numbers", (path, "." + role))
            if len(self.shape[b.id]) != 2 + len(index):
                self.fail(f"gemm operand {role.upper()} ({self.bname(b.id)}) has rank "
                          f"{len(self.shape[b.id])}; it must be 2, plus one index per leading "
                          f"dim ({len(index)} given)", (path, "." + role))
            for i, e in enumerate(index):
                self.index(b, i, e, (path, f".{role}_index[{i}]"), depth)
            bufs[role] = self.shape[b.id][len(index):]
        if g.c in (g.a, g.b):
            self.fail("gemm accumulator C is also an input", (path, ".c"))
        m, k = bufs["a"][::-1] if g.transpose_a else bufs["a"]
        k2, n = bufs["b"][::-1] if g.transpose_b else bufs["b"]
        names = {r: self.bname(getattr(g, r)) for r in "abc"}
        if k != k2:
            self.fail(f"gemm K differs: A ({names['a']}, {_shape_str(bufs['a'])}"
                      f"{', transposed' if g.transpose_a else ''}) has K={k} but B "
                      f"({names['b']}, {_shape_str(bufs['b'])}"
                      f"{', transposed' if g.transpose_b else ''}) has K={k2}", path)
        if bufs["c"] != [m, n]:
            self.fail(f"gemm C ({names['c']}) is {_shape_str(bufs['c'])} but A @ B is {m}x{n}",
                      (path, ".c"))

    def s_fill(self, f: pb.Fill, path: tuple, depth: int) -> None:
        self.tile_op("fill", path)
        if not f.HasField("dst"):
            self.fail("fill has no dst region", (path, ".dst"))
        b = self.region(f.dst, (path, ".dst"), depth + 1)
        if not f.HasField("value"):
            self.fail(f"fill of {self.bname(b.id)} has no value", (path, ".value"))
        self.expr(f.value, (path, ".value"), depth + 1)
        if f.value.dtype != b.dtype:
            self.fail(f"fill of {_dt(b.dtype)} buffer {self.bname(b.id)} with a "
                      f"{_dt(f.value.dtype)} value; cast the value", (path, ".value"))

    def s_reduce(self, r: pb.Reduce, path: tuple, depth: int) -> None:
        self.tile_op("reduce", path)
        if r.kind not in ops.REDUCE_KINDS:
            self.fail(f"reduce has {'no kind' if r.kind == 0 else f'unknown kind {r.kind}'}",
                      (path, ".kind"))
        src = self.buffer(r.src, (path, ".src"))
        dst = self.buffer(r.dst, (path, ".dst"))
        if src.scope not in (pb.SHARED, pb.FRAGMENT):
            self.fail(f"reduce source {self.bname(src.id)} is "
                      f"{ops.SCOPE_NAME.get(src.scope, '?')}; it must be SHARED or FRAGMENT",
                      (path, ".src"))
        if dst.scope != pb.FRAGMENT:
            self.fail(f"reduce destination {self.bname(dst.id)} is "
                      f"{ops.SCOPE_NAME.get(dst.scope, '?')}; it must be FRAGMENT",
                      (path, ".dst"))
        for role, b in (("source", src), ("destination", dst)):
            if b.dtype == pb.BOOL:
                self.fail(f"reduce {role} {self.bname(b.id)} is bool; reductions sum or compare "
                          "numbers (cast to an integer first)", (path, ".src" if b is src
                                                                 else ".dst"))
        s_shape = self.shape[src.id]
        if not 0 <= r.dim < len(s_shape):
            self.fail(f"reduce dim {r.dim} is out of range for {self.bname(src.id)} of rank "
                      f"{len(s_shape)}", (path, ".dim"))
        want = s_shape[:r.dim] + s_shape[r.dim + 1:] or [1]
        if self.shape[dst.id] != want:
            self.fail(f"reduce of {self.bname(src.id)} ({_shape_str(s_shape)}) over dim {r.dim} "
                      f"gives shape {_shape_str(want)}, but {self.bname(dst.id)} is "
                      f"{_shape_str(self.shape[dst.id])}", (path, ".dst"))

    # -- regions and indices -------------------------------------------------------------------

    def region(self, r: pb.Region, path: tuple, depth: int) -> pb.Buffer:
        self.count(path)
        self.deep(depth, path)
        b = self.buffer(r.buffer, (path, ".buffer"))
        name, shape = self.bname(b.id), self.shape[b.id]
        if b.scope == pb.BARRIER:
            self.fail(f"{name} is a barrier: it is used only by T.mbarrier_* ops and TMA copies, "
                      "never copied or filled", (path, ".buffer"))
        if len(r.offsets) != len(shape) or len(r.extents) != len(shape):
            self.fail(f"region of {name} has {len(r.offsets)} offsets and {len(r.extents)} "
                      f"extents, but {name} has rank {len(shape)}", path)
        elements = 1
        for i, e in enumerate(r.extents):
            if not 1 <= e <= _MAX_DIM:
                self.fail(f"region of {name} has extent {e} in dim {i}; extents must be in "
                          f"1..{_MAX_DIM}", (path, f".extents[{i}]"))
            elements *= e
        if elements > self.limits.max_tile_elements:
            self.fail(f"region of {name} is a tile of {elements} elements; the limit is "
                      f"{self.limits.max_tile_elements}", (path, ".extents"))
        for i, off in enumerate(r.offsets):
            opath = (path, f".offsets[{i}]")
            iv = self.int_expr(off, opath, depth + 1, f"offset {i} of the {name} region")
            ext, dim = r.extents[i], shape[i]
            if self.dead:
                continue
            if (iv.hi < 0) or (iv.lo_exact and iv.lo < 0):
                self.fail(f"region of {name} starts at offset "
                          f"{iv.lo if iv.lo_exact else f'{iv.hi} or less'} in dim {i}; "
                          "offsets must not be negative", opath)
            if not isinstance(dim, int):
                continue
            if b.scope == pb.GLOBAL:  # ragged tails of global tensors are legal, not tiles
                if iv.lo > dim - 1:  # wholly outside
                    start = iv.lo if iv.lo == iv.hi else f"{iv.lo} or more"
                    self.fail(f"tile of {ext} starting at offset {start} lies wholly outside "
                              f"{name} dim {i} of extent {dim} (valid starts 0..{dim - 1})",
                              opath)
                continue
            if ext > dim:
                self.fail(f"tile extent {ext} is larger than {name} dim {i} of extent {dim}",
                          (path, f".extents[{i}]"))
            if iv.lo + ext > dim or (iv.hi_exact and iv.hi + ext > dim):
                start = iv.hi if iv.hi_exact else f"{iv.lo} or more"
                self.fail(f"tile of {ext} starting at offset {start} runs past the end of "
                          f"{name} dim {i} of extent {dim}", opath)
        return b

    def indices(self, b: pb.Buffer, indices, path: tuple, depth: int) -> None:
        name, shape = self.bname(b.id), self.shape[b.id]
        if b.scope == pb.BARRIER:
            self.fail(f"{name} is a barrier: it is used only by T.mbarrier_* ops and TMA copies, "
                      "never loaded or stored", (path, ".buffer"))
        if len(indices) != len(shape):
            self.fail(f"{name} has rank {len(shape)} but is indexed with {len(indices)} "
                      "indices", (path, ".indices"))
        for i, idx in enumerate(indices):
            self.index(b, i, idx, (path, f".indices[{i}]"), depth)

    def index(self, b: pb.Buffer, i: int, idx: pb.Expr, ipath: tuple, depth: int) -> _Iv | None:
        """Checks `idx` as the index into dim i of `b`: rejected when provably out of bounds
        (module docstring). Returns the index's interval; None in code that never runs."""
        name = self.bname(b.id)
        iv = self.int_expr(idx, ipath, depth + 1, f"index {i} into {name}")
        if self.dead:
            return None
        dim = self.shape[b.id][i]
        static = isinstance(dim, int)
        valid = f"0..{dim - 1}" if static else f"0..{dim}-1"
        if b.scope == pb.GLOBAL:
            # The compiler guards global accesses (a load outside reads 0, a store outside is
            # skipped), so only an access outside on every execution is an error.
            if iv.hi < 0 or (static and iv.lo > dim - 1):
                value = iv.lo if iv.lo == iv.hi else f"in {iv.lo}..{iv.hi}"
                self.fail(f"index {value} is out of bounds for {name} dim {i} of extent {dim} "
                          f"(valid {valid}) on every execution", ipath)
            return iv
        low = iv.hi < 0 or (iv.lo_exact and iv.lo < 0)
        high = static and (iv.lo > dim - 1 or (iv.hi_exact and iv.hi > dim - 1))
        if low or high:
            if low:
                value = iv.lo if iv.lo_exact else f"{iv.hi} or less"
            else:
                value = iv.hi if iv.hi_exact else f"{iv.lo} or more"
            self.fail(f"index {value} is out of bounds for {name} dim {i} of extent {dim} "
                      f"(valid {valid})", ipath)
        return iv

    # -- expressions ---------------------------------------------------------------------------

    def int_expr(self, e: pb.Expr, path: tuple, depth: int, what: str) -> _Iv:
        iv = self.expr(e, path, depth)
        if e.dtype not in ops.INT_DTYPES:
            self.fail(f"{what} has dtype {_dt(e.dtype)}; it must be an integer", path)
        return iv

    def expr(self, e: pb.Expr, path: tuple, depth: int, launch: bool = False) -> _Iv | None:
        """Checks `e` and returns its interval (None unless its dtype is an integer)."""
        self.count(path)
        self.deep(depth, path)
        dt = e.dtype
        if dt not in ops.DTYPES:
            self.fail(f"expression has {'no dtype' if dt == 0 else f'unknown dtype {dt}'}", path)
        kind = e.WhichOneof("kind")
        if kind is None:
            self.fail("empty expression: it has no value, var or operator", path)
        is_int = dt in ops.INT_DTYPES
        if kind == "int_value":
            if dt not in ops.INT_RANGE:
                self.fail(f"integer constant {e.int_value} has dtype {_dt(dt)}; use float_value",
                          path)
            lo, hi = ops.INT_RANGE[dt]
            if not lo <= e.int_value <= hi:
                self.fail(f"constant {e.int_value} does not fit in {_dt(dt)}", path)
            return _Iv(e.int_value, e.int_value, True, True) if is_int else None
        if kind == "float_value":
            if dt not in ops.FLOAT_DTYPES:
                self.fail(f"float constant {e.float_value} has dtype {_dt(dt)}; use int_value",
                          path)
            if math.isfinite(e.float_value) and abs(e.float_value) > ops.FLOAT_MAX[dt]:
                self.fail(f"float constant {e.float_value:g} does not fit in {_dt(dt)} (largest "
                          f"finite value {ops.FLOAT_MAX[dt]:g}); use inf for an infinity", path)
            return None
        if kind == "var":
            return self.var_use(e, path, launch)
        sub = getattr(e, kind)
        spath = (path, "." + kind)
        if launch and kind in ("call", "select"):
            self.fail(f"the grid uses a {kind}; {_GRID_RULE}", spath)
        if kind == "binary":
            return self.binary(e, sub, spath, depth, launch)
        if kind == "call":
            return self.call(e, sub, spath, depth, launch)
        if kind == "cast":
            if not sub.HasField("value"):
                self.fail(f"cast to {_dt(dt)} has no value", (spath, ".value"))
            iv = self.expr(sub.value, (spath, ".value"), depth + 1, launch)
            self.cast_value(sub.value, iv, dt, (spath, ".value"))
            src = sub.value.dtype
            if not is_int:
                return None
            if src in ops.INT_DTYPES:
                return _fit(iv, dt)
            return replace(_full(dt), lo=0, hi=1) if src == pb.BOOL else _full(dt)
        if kind == "select":
            return self.select(e, sub, spath, depth, launch)
        # load
        if launch:
            self.fail(f"the grid cannot load from buffers; {_GRID_RULE}", spath)
        b = self.buffer(sub.buffer, (spath, ".buffer"))
        self.indices(b, sub.indices, spath, depth)
        if dt != b.dtype:
            self.fail(f"load from {_dt(b.dtype)} buffer {self.bname(b.id)} is typed "
                      f"{_dt(dt)}; add a cast", path)
        return _full(dt) if is_int else None

    def cast_value(self, value: pb.Expr, iv: _Iv | None, dt: int, path: tuple) -> None:
        """Rejects a cast of a constant the target dtype cannot hold (`uint8(-1)`, `bool(5)`,
        `int32(inf)`, `float16(1e6)`): the compiler folds casts of constants, and TVM refuses
        a folded value outside the dtype (C leaves float-to-int overflow undefined)."""
        src = value.dtype
        if dt == src:
            return
        if iv is not None and _const(iv) is not None and (not self.dead or not iv.deps):
            c, what = _const(iv), f"{_const(iv)}"
        elif src in ops.FLOAT_DTYPES and (f := _float_const(value)) is not None:
            c, what = f, f"{f:g}"
        else:
            return
        if dt in ops.FLOAT_DTYPES:
            ok = not math.isfinite(c) or abs(c) <= ops.FLOAT_MAX[dt]
            valid = f"largest finite value {ops.FLOAT_MAX[dt]:g}"
        else:
            lo, hi = ops.INT_RANGE[dt]
            ok = math.isfinite(c) and lo <= math.trunc(c) <= hi
            valid = f"{lo}..{hi}"
        if not ok:
            hint = "; compare instead (x != 0)" if dt == pb.BOOL else \
                "; mask or clamp it first" if dt not in ops.FLOAT_DTYPES else ""
            self.fail(f"cast of constant {what} to {_dt(dt)}: {_dt(dt)} holds {valid}{hint}",
                      path)

    def var_use(self, e: pb.Expr, path: tuple, launch: bool) -> _Iv | None:
        v = self.var(e.var, (path, ".var"))
        name = self.vname(e.var)
        if launch and e.var in self.in_scope and self.bound.get(e.var) == "scalar":
            self.fail(f"the grid uses scalar parameter {name}; {_GRID_RULE}", (path, ".var"))
        if e.var not in self.in_scope:
            if launch:
                self.fail(f"the grid uses {name}; {_GRID_RULE}", (path, ".var"))
            self.fail(f"{name} is used where it is not defined (a loop var is visible only "
                      "inside its loop body)", (path, ".var"))
        if v.dtype != e.dtype:
            self.fail(f"{name} is {_dt(v.dtype)} but used as {_dt(e.dtype)}; add a cast", path)
        return self.var_iv(e.var) if e.dtype in ops.INT_DTYPES else None

    def var_iv(self, vid: int) -> _Iv:
        """The range of an integer var in scope. Dims and scalars stay out of `env`, which is
        copied at every loop and guard: its size must not grow with the parameter count."""
        iv = self.env.get(vid)
        if iv is not None:
            return iv
        if self.bound.get(vid) == "dim":
            return _Iv(1, _MAX_DIM, deps=frozenset([vid]))
        return replace(_full(self.vars[vid].dtype), deps=frozenset([vid]))

    def binary(self, e: pb.Expr, b: pb.Binary, path: tuple, depth: int, launch: bool):
        op = b.op
        if op not in ops.BINARY_OPS:
            self.fail(f"binary expression has "
                      f"{'no operator' if op == 0 else f'unknown operator {op}'}", (path, ".op"))
        sym = (ops.BINARY_SYMBOL.get(op) or (ops.BINARY_FUNCTION[op],))[0]
        for side in ("a", "b"):
            if not b.HasField(side):
                self.fail(f"operator {sym} has no operand {side}", (path, "." + side))
        if launch and op not in _GRID_OPS:
            self.fail(f"the grid uses {sym}; {_GRID_RULE}", path)
        ia = self.expr(b.a, (path, ".a"), depth + 1, launch)
        ib = self.expr(b.b, (path, ".b"), depth + 1, launch)
        ta, dt = b.a.dtype, e.dtype
        if ta != b.b.dtype:
            self.fail(f"operands of {sym} have different dtypes, {_dt(ta)} and "
                      f"{_dt(b.b.dtype)}; cast one of them", path)
        if op in ops.COMPARISON_OPS:
            if dt != pb.BOOL:
                self.fail(f"comparison {sym} gives bool, not {_dt(dt)}", path)
            return None
        if op in ops.LOGICAL_OPS:
            if ta != pb.BOOL or dt != pb.BOOL:
                self.fail(f"logical {sym} takes and gives bool, not {_dt(ta)} -> {_dt(dt)}", path)
            return None
        if op in ops.INT_ONLY_OPS and ta not in ops.INT_DTYPES:
            self.fail(f"operator {sym} works on integers, not {_dt(ta)}", path)
        if ta == pb.BOOL:
            self.fail(f"arithmetic {sym} on bool operands", path)
        if dt != ta:
            self.fail(f"{sym} of {_dt(ta)} operands gives {_dt(ta)}, not {_dt(dt)}", path)
        if dt not in ops.INT_DTYPES:
            if op == pb.DIV and _float_const(b.b) == 0:
                self.fail(f"{_dt(dt)} division by constant 0: TVM refuses to fold it; write "
                          "inf (or nan) for the value you mean, or guard the divisor",
                          (path, ".b"))
            return None
        if not self.dead or not ib.deps:  # a constant is wrong even in code that never runs
            self.int_operand(op, sym, ib, dt, (path, ".b"))
            if _const(ia) is not None and _const(ib) is not None and not (self.dead and ia.deps):
                self.int_fold(op, sym, _const(ia), _const(ib), dt, path)
        exact = _binary_exact(op, ia, ib)
        if exact is not None and dt not in ops.UNSIGNED_DTYPES and \
                (not self.dead or not exact.deps):
            self.signed_overflow(sym, exact, dt, path)
        return _binary_iv(op, ia, ib, dt)

    def signed_overflow(self, sym: str, r: _Iv, dt: int, path: tuple) -> None:
        """Signed overflow is undefined (C, LLVM's nsw): rejected where it provably happens,
        at an attained end or on every execution. Unsigned arithmetic wraps, as defined."""
        lo, hi = ops.INT_RANGE[dt]
        if r.hi < lo or r.lo > hi:
            value = r.lo if r.lo == r.hi else f"{r.lo}..{r.hi}"
        elif r.lo_exact and r.lo < lo:
            value = r.lo
        elif r.hi_exact and r.hi > hi:
            value = r.hi
        else:
            return
        self.fail(f"{_dt(dt)} arithmetic overflows: {sym} reaches {value}, outside {lo}..{hi} "
                  "(signed overflow is undefined); compute in a wider dtype", path)

    def int_fold(self, op: int, sym: str, a: int, b: int, dt: int, path: tuple) -> None:
        """Constant operands are folded by the compiler, and TVM refuses the folds that leave
        the dtype where C would shift into the sign bit or wrap an unsigned difference."""
        lo, hi = ops.INT_RANGE[dt]
        if op == pb.SHL and dt not in ops.UNSIGNED_DTYPES and 0 <= b < dtypes.bits(dt) \
                and not lo <= a << b <= hi:
            self.fail(f"constant shift {a} << {b} overflows {_dt(dt)} ({lo}..{hi})", path)
        if op == pb.SUB and dt in ops.UNSIGNED_DTYPES and a < b:
            self.fail(f"constant {a} - {b} wraps below 0 in {_dt(dt)}", path)

    def int_operand(self, op: int, sym: str, b: _Iv, dt: int, path: tuple) -> None:
        """Rejects a shift amount outside [0, bits) or an integer divisor 0, when the value
        is certain (a constant) or reached at an attained end: the result is undefined there
        (C and LLVM), and a constant one stops TVM's folding."""
        if op in (pb.SHL, pb.SHR):
            bits = dtypes.bits(dt)
            if b.hi < 0 or b.lo >= bits:
                amount = b.lo if b.lo == b.hi else f"in {b.lo}..{b.hi}"
            elif b.lo_exact and b.lo < 0:
                amount = b.lo
            elif b.hi_exact and b.hi >= bits:
                amount = b.hi
            else:
                return
            self.fail(f"shift {sym} by {amount} on {_dt(dt)}: the amount must be in "
                      f"0..{bits - 1} (the width of {_dt(dt)} is {bits} bits)", path)
        if op in (pb.DIV, pb.FLOOR_DIV, pb.FLOOR_MOD) and (
                (b.lo == b.hi == 0) or (b.lo_exact and b.lo == 0) or (b.hi_exact and b.hi == 0)):
            what = "constant 0" if b.lo == b.hi else f"a value in {b.lo}..{b.hi} that reaches 0"
            self.fail(f"integer {sym} by {what} ({_dt(dt)}): division by zero is undefined; "
                      "guard the divisor or use max(divisor, 1)", path)

    def call(self, e: pb.Expr, c: pb.Call, path: tuple, depth: int, launch: bool):
        op, dt = c.op, e.dtype
        if op not in ops.INTRINSIC_ARITY:
            self.fail(f"call of {'no intrinsic' if op == 0 else f'unknown intrinsic {op}'}",
                      (path, ".op"))
        name = ops.INTRINSIC_NAME[op]
        if len(c.args) != ops.INTRINSIC_ARITY[op]:
            self.fail(f"{name} takes {ops.INTRINSIC_ARITY[op]} argument(s), got {len(c.args)}",
                      (path, ".args"))
        ivs = []
        for i, a in enumerate(c.args):
            ivs.append(self.expr(a, (path, f".args[{i}]"), depth + 1, launch))
            if a.dtype != dt:
                self.fail(f"{name} of {_dt(a.dtype)} argument gives {_dt(a.dtype)}, "
                          f"not {_dt(dt)}", (path, f".args[{i}]"))
        if op in ops.FLOAT_INTRINSICS and dt not in ops.FLOAT_DTYPES:
            self.fail(f"{name} works on floats, not {_dt(dt)}; cast the argument", path)
        if op in ops.BOOL_INTRINSICS and dt != pb.BOOL:
            self.fail(f"{name} works on bool, not {_dt(dt)}", path)
        if op in ops.NUMERIC_INTRINSICS and dt == pb.BOOL:
            self.fail(f"{name} does not work on bool", path)
        if dt not in ops.INT_DTYPES:
            return None
        a = ivs[0]
        c = _const(a) if not self.dead or not a.deps else None
        if c is not None and op == pb.NEG and dt in ops.UNSIGNED_DTYPES and c != 0:
            self.fail(f"neg of constant {c} wraps below 0 in {_dt(dt)}", path)
        if c is not None and op == pb.ABS and c == ops.INT_RANGE[dt][0]:
            self.fail(f"abs of constant {c} overflows {_dt(dt)}", path)
        if op == pb.NEG:
            return _fit(_Iv(-a.hi, -a.lo, a.hi_exact, a.lo_exact, a.deps), dt)
        if op == pb.ABS and a.lo >= 0:
            return a
        return _full(dt)

    def select(self, e: pb.Expr, s: pb.Select, path: tuple, depth: int, launch: bool):
        for part in ("cond", "true_value", "false_value"):
            if not s.HasField(part):
                self.fail(f"select has no {part}", (path, "." + part))
        self.expr(s.cond, (path, ".cond"), depth + 1, launch)
        if s.cond.dtype != pb.BOOL:
            self.fail(f"select condition has dtype {_dt(s.cond.dtype)}; it must be bool",
                      (path, ".cond"))
        saved = self.env, self.dead
        ivs, dead = [], []
        for part, negate in (("true_value", False), ("false_value", True)):
            self.env, self.dead = self.refined(s.cond, negate)
            dead.append(self.dead and not saved[1])
            ivs.append(self.expr(getattr(s, part), (path, "." + part), depth + 1, launch))
            self.env, self.dead = saved
            if getattr(s, part).dtype != e.dtype:
                self.fail(f"select {part} is {_dt(getattr(s, part).dtype)} but the select is "
                          f"{_dt(e.dtype)}", (path, "." + part))
        if e.dtype not in ops.INT_DTYPES:
            return None
        t, f = ivs
        if dead[0] != dead[1]:  # the condition is decided: the select is its live side
            return f if dead[0] else t
        return _Iv(min(t.lo, f.lo), max(t.hi, f.hi), deps=t.deps | f.deps)

    # -- guards --------------------------------------------------------------------------------

    def refined(self, cond: pb.Expr, negate: bool) -> tuple[dict, bool]:
        """Var ranges and deadness where `cond` (or its negation) holds. `cond` was verified.
        A conjunction of `var op constant` keeps attained ends exact (the guarded set is a box);
        any other guard leaves the ranges it narrows sound but makes its vars inexact."""
        env, dead, box = dict(self.env), self.dead, True
        atoms, stack = [], [(cond, negate)]
        while stack:
            if len(atoms) + len(stack) > _GUARD_WORK:
                return _blurred(env, env), dead
            e, neg = stack.pop()
            kind = e.WhichOneof("kind")
            if kind == "binary" and e.binary.op == (pb.OR if neg else pb.AND):
                stack += [(e.binary.a, neg), (e.binary.b, neg)]
            elif kind == "binary" and e.binary.op in ops.COMPARISON_OPS:
                atoms.append((e.binary, neg))
            elif kind == "call" and e.call.op == pb.NOT:
                stack.append((e.call.args[0], not neg))
            elif kind == "int_value":
                dead |= (e.int_value != 0) == neg
            else:
                box = False
        for b, neg in atoms:
            op = _NEGATE[b.op] if neg else b.op
            ka, kb = b.a.WhichOneof("kind"), b.b.WhichOneof("kind")
            a, c = self.side(b.a), self.side(b.b)
            if ka == "var" and b.a.var in env and c is not None:
                vid = b.a.var
            elif kb == "var" and b.b.var in env and a is not None:
                vid, op, c = b.b.var, _MIRROR[op], a
            elif a is not None and c is not None and _const(a) is not None \
                    and _const(c) is not None:
                x, y = _const(a), _const(c)
                dead |= not {pb.LT: x < y, pb.LE: x <= y, pb.GT: x > y, pb.GE: x >= y,
                             pb.EQ: x == y, pb.NE: x != y}[op]
                continue
            else:
                box = False
                continue
            box &= _const(c) is not None and op != pb.NE
            iv, whole = env[vid], env[vid].lo_exact and env[vid].hi_exact
            lo, hi, lo_e, hi_e = iv.lo, iv.hi, iv.lo_exact, iv.hi_exact
            if op in (pb.LT, pb.LE, pb.EQ):
                bound = c.hi - (op == pb.LT)
                if bound < hi:
                    hi, hi_e = bound, whole and bound >= lo
            if op in (pb.GT, pb.GE, pb.EQ):
                bound = c.lo + (op == pb.GT)
                if bound > lo:
                    lo, lo_e = bound, whole and bound <= hi
            env[vid] = replace(iv, lo=lo, hi=hi, lo_exact=lo_e, hi_exact=hi_e)
        if not box:
            env = _blurred(env, _vars_of(cond, env))
        dead |= any(iv.lo > iv.hi for iv in env.values())
        return env, dead

    def side(self, e: pb.Expr) -> _Iv | None:
        """The range of a comparison operand that is a constant or an integer var, else None.
        Reads the enclosing ranges: atoms of one guard are applied independently."""
        kind = e.WhichOneof("kind")
        if kind == "int_value" and e.dtype in ops.INT_DTYPES:
            return _Iv(e.int_value, e.int_value, True, True)
        if kind == "var" and e.dtype in ops.INT_DTYPES:
            return self.var_iv(e.var)
        return None


def _float_const(e: pb.Expr) -> float | None:
    """The value of a float expression that is a constant (a literal, under negations and
    casts), else None: what the compiler folds before TVM sees it."""
    sign = 1.0
    for _ in range(8):
        kind = e.WhichOneof("kind")
        if kind == "float_value":
            return sign * e.float_value
        if kind == "int_value":
            return sign * e.int_value
        if kind == "call" and e.call.op == pb.NEG and len(e.call.args) == 1:
            sign, e = -sign, e.call.args[0]
        elif kind == "cast" and e.cast.HasField("value"):
            e = e.cast.value
        else:
            return None
    return None


def _blurred(env: dict, vids) -> dict:
    """`env` with the ranges of `vids` kept but no longer attained."""
    return {v: replace(iv, lo_exact=False, hi_exact=False) if v in vids else iv
            for v, iv in env.items()}


def _vars_of(e: pb.Expr, env: dict):
    """The vars `e` mentions; all of `env` when `e` is too large to look through, which keeps
    guard analysis linear (nested guards would otherwise rescan each other's conditions)."""
    found, stack, work = set(), [e], 0
    while stack:
        work += 1
        if work > _GUARD_WORK:
            return env
        e = stack.pop()
        kind = e.WhichOneof("kind")
        if kind == "var":
            found.add(e.var)
        elif kind == "binary":
            stack += [e.binary.a, e.binary.b]
        elif kind == "call":
            stack += list(e.call.args)
        elif kind == "cast":
            stack.append(e.cast.value)
        elif kind == "select":
            stack += [e.select.cond, e.select.true_value, e.select.false_value]
        elif kind == "load":
            stack += list(e.load.indices)
    return found


def _size(n: int) -> str:
    """Bytes for a message: KiB or MiB, exact."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            whole = n / (1 << shift)
            return f"{whole:g} {unit}" if whole == int(whole) else f"{whole:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{-(-n // 1024)} KiB ({n} bytes)"


def verify_program(program: Program | pb.Program, limits: Limits | None = None) -> None:
    """Checks every rule of the Tile IR (module docstring). Returns None or raises VerifyError;
    never another exception, whatever message `program` holds. Thread-safe: keeps no state."""
    msg = program.proto if isinstance(program, Program) else program
    v = _Verifier(msg, limits if limits is not None else Limits())
    try:
        v.tables()
        v.kernel()
        v.barrier_flow()
    except RecursionError:
        # Only a caller's Limits.max_depth beyond Python's stack can get here.
        raise VerifyError("program nests too deeply to verify", "kernel", v.loc) from None
