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
fit Limits: shared memory, local memory per thread, memory per block. A VECTORIZED loop
(serial semantics; a target may run its iterations as vector lanes) holds element statements
only: stores, atomics, ifs and serial / unroll / vectorized loops.

The rules live by concept in mixins of `_Verifier`, which walks the program (tables, kernel,
statements): verify_params (parameters and their C names), verify_limits (memory totals),
verify_access (element accesses, regions and indices: the bounds above), verify_tiles (tile
ops), verify_exprs (expressions), verify_arith (undefined integer operations, unfoldable
constants), verify_guards (ranges under guards) and verify_ws (the explicit Hopper path);
verify_base holds what they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

from tiled import config
from tiled.errors import VerifyError
from tiled.ir import ops
from tiled.ir.intervals import _const, _Iv
from tiled.ir.program import SCHEMA_VERSION, Program
from tiled.ir.verify_access import AccessRules
from tiled.ir.verify_arith import ArithRules
from tiled.ir.verify_base import _INT32_MAX, _MAX_DIM, _dt, _loc_str, _render, _shape_str
from tiled.ir.verify_exprs import ExprRules
from tiled.ir.verify_guards import GuardRefinement
from tiled.ir.verify_limits import LimitRules
from tiled.ir.verify_params import _IDENT, ParamRules, _printable
from tiled.ir.verify_tiles import TileOpRules
from tiled.ir.verify_ws import WarpSpecializedRules
from tiled.v1 import tile_ir_pb2 as pb


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program. Defaults suit a server accepting untrusted programs."""

    max_nodes: int = 200_000  # IR nodes: exprs, stmts, regions, table entries
    max_depth: int = 200  # statement + expression nesting
    max_threads: int = 1024
    # Constant loop extents; far below int32's limit, so that lowering's flat index
    # arithmetic (extent + threads - 1, ...) cannot overflow.
    max_loop_extent: int = 1 << 30
    max_tile_elements: int = 1 << 22  # elements of one non-GLOBAL buffer or one region
    max_shared_bytes: int = field(default_factory=lambda: config.get("max_shared_bytes"))
    # Per thread: LOCAL buffers, plus FRAGMENT buffers spread over the block's threads.
    max_local_bytes: int = field(default_factory=lambda: config.get("max_local_bytes"))
    # Per block, every non-GLOBAL buffer: the cpu backend runs a block on one thread and
    # allocates them all (LOCAL ones once), for as many blocks as it runs at once.
    max_block_bytes: int = field(default_factory=lambda: config.get("max_block_bytes"))


# What a VECTORIZED loop may hold: element statements, run in order on one thread.
_VECTOR_BODY = frozenset({"seq", "store", "atomic_add", "if_then_else", "for_"})

_BOUND_HOW = {"dim": "a symbolic dim", "scalar": "a scalar parameter",
              "block": "a block var", "loop": "a loop var"}


class _Verifier(ParamRules, LimitRules, AccessRules, TileOpRules, ExprRules, ArithRules,
                GuardRefinement, WarpSpecializedRules):
    """The driver: reads the tables and walks the kernel's statements; the other rules come
    from the mixins (module docstring)."""

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
        self.vectorized: str | None = None  # the innermost enclosing VECTORIZED loop's var
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
        p = self.p
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
        for i, b in enumerate(p.buffers):
            path = (None, f"buffers[{i}]")
            if b.id in self.bufs:
                self.fail(f"buffer id {b.id} is declared twice", path)
            self.bufs[b.id] = b
            self.buffer_decl(b, path)
        self.shared_memory()
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
        static = 1
        for d in dims:
            static *= d if isinstance(d, int) else 1
        if b.scope == pb.GLOBAL and static > _INT32_MAX:
            # Kernels index tensors with int32 (the runtime refuses larger tensors too).
            self.fail(f"tensor {name} of shape {_shape_str(dims)} has {static} or more "
                      f"elements; kernels index tensors with 32-bit integers, at most "
                      f"{_INT32_MAX} elements", path)


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
        rule = getattr(self, "s_" + kind, None)
        if rule is None:  # a statement of a newer schema than this verifier knows
            self.fail(f"statement kind {kind!r} is not supported by this tiled", path)
        if self.vectorized is not None and kind not in _VECTOR_BODY:
            self.fail(f"{kind} inside T.vectorized loop {self.vectorized}: a vectorized loop "
                      "holds element statements only (stores, atomics, ifs, serial / unroll / "
                      "vectorized loops); move the tile op or T.Parallel outside it", path)
        rule(getattr(s, kind), (path, "." + kind), depth)
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
        if self.vectorized is not None and f.kind in (pb.PARALLEL, pb.PIPELINED):
            self.fail(f"{ops.LOOP_KIND_NAME[f.kind]} loop over {name} inside T.vectorized loop "
                      f"{self.vectorized}: a vectorized loop runs on one thread, in order; "
                      "put the T.vectorized loop inside instead", (path, ".kind"))
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
        outer_vector = self.vectorized
        if f.kind == pb.VECTORIZED:
            self.vectorized = name
        self.stmt(f.body, (path, ".body"), depth + 1)
        self.vectorized = outer_vector
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

    def s_grid_dependency(self, _g: pb.GridDependency, path: tuple, _depth: int) -> None:
        """T.pdl_sync / T.pdl_trigger: run by every thread of the block, not per element."""
        if self.parallel:
            self.fail("T.pdl_sync / T.pdl_trigger inside T.Parallel: they are run by the whole "
                      "block; place them outside the nest", path)

    def s_store(self, s: pb.Store, path: tuple, depth: int) -> None:
        self.element_access(s, path, depth, "store")

    def s_atomic_add(self, s: pb.AtomicAdd, path: tuple, depth: int) -> None:
        """T.atomic_add / atomic_max / atomic_min: one element of a GLOBAL or SHARED number
        buffer, updated atomically (AtomicAdd.op says how)."""
        if s.op not in ops.ATOMIC_OPS:
            self.fail(f"atomic has unknown op {s.op}", (path, ".op"))
        what = ops.ATOMIC_NAME[s.op]
        b = self.element_access(s, path, depth, what)
        if b.scope not in (pb.GLOBAL, pb.SHARED):
            self.fail(f"{what} into {ops.SCOPE_NAME[b.scope]} buffer {self.bname(b.id)}; "
                      "atomics work on GLOBAL or SHARED buffers", (path, ".buffer"))
        if b.dtype == pb.BOOL:
            self.fail(f"{what} into bool buffer {self.bname(b.id)}", (path, ".buffer"))
        if b.dtype in (pb.FLOAT8_E4M3, pb.FLOAT8_E5M2):
            self.fail(f"{what} into float8 buffer {self.bname(b.id)}: no target has float8 "
                      "atomics; accumulate in a float32 buffer and cast once", (path, ".buffer"))
        if s.order not in pb.MemoryOrder.values():
            self.fail(f"{what} has unknown memory order {s.order}", (path, ".order"))
        if s.has_prev:
            prev = self.buffer(s.prev, (path, ".prev"))
            if prev.scope != pb.LOCAL or [d.size for d in prev.shape] != [1] or \
                    prev.dtype != b.dtype:
                self.fail(f"{what}: the previous value goes to a one-element LOCAL buffer of "
                          f"{self.bname(b.id)}'s dtype, not {self.bname(prev.id)}",
                          (path, ".prev"))


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
