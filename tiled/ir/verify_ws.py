"""Verifier rules of the explicit Hopper path: warpgroup regions (`T.ws`), mbarriers and TMA
copies (tiled.lang.hopper). A mixin of the verifier's `_Verifier`; its messages are located
like the others (the path of the field, the author's line of the nearest statement).

Per statement: a T.ws group names a warpgroup of the launch (threads a multiple of 128) and
does not nest; setmaxnreg counts are 24..256 in steps of 8; an mbarrier op or a TMA copy names
a barrier from T.alloc_barrier (anything else is uninitialized memory: waiting on it never
returns) at an index that is not provably out of range; parities are 0 or 1, expected bytes
1..2^20-1; an arrival runs on at most `arrive_count` threads (each thread arrives once); a TMA
copy moves a 2-d global tile whose box TMA can encode into whole 2-d tiles of a dense shared
buffer. Over the kernel (`barrier_flow`): a barrier that is waited on is arrived on somewhere
(else the wait never returns), and a barrier that TMA copies complete on has an expect_tx
somewhere (else its phase completes before the data lands).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from tiled.ir import ops
from tiled.ir.dtypes import ENUM_TO_NAME, nbytes
from tiled.ir.intervals import _const, _Iv
from tiled.ir.verify_base import _loc_str
from tiled.v1 import tile_ir_pb2 as pb

WARPGROUP = 128  # threads
MAX_TX_BYTES = (1 << 20) - 1  # an mbarrier phase's transaction count
TMA_MAX_BOX = 256  # elements per box dim


def explicit_statement(program: pb.Program) -> tuple[str, pb.Stmt] | None:
    """The first statement of the explicit path in `program` as (its T.* name, the statement),
    or None: backends without the path name it when they refuse the program."""
    stack = [program.kernel.body] if program.HasField("kernel") else []
    while stack:
        s = stack.pop()
        kind = s.WhichOneof("kind")
        if kind == "warp_group":
            return "T.ws", s
        if kind == "mbarrier":
            return "T." + ops.MBARRIER_NAME.get(s.mbarrier.kind, "mbarrier_?"), s
        if kind == "fence_proxy_async":
            return "T.fence_proxy_async", s
        if kind == "copy" and s.copy.HasField("tma"):
            return "T.tma_copy", s
        if kind == "seq":
            stack.extend(reversed(s.seq.stmts))
        elif kind == "for_":
            stack.append(s.for_.body)
        elif kind == "if_then_else":
            stack += [s.if_then_else.else_body, s.if_then_else.then_body]
    return None


class WarpSpecializedRules:
    """The explicit path's rules, mixed into `_Verifier` (which provides fail, buffer, stmt,
    int_expr, index, bname, shape, p, loc, parallel)."""

    if TYPE_CHECKING:  # provided by _Verifier
        p: pb.Program
        shape: dict[int, list]
        parallel: int
        loc: str

        def fail(self, message: str, path: tuple | None) -> NoReturn: ...
        def buffer(self, bid: int, path: tuple) -> pb.Buffer: ...
        def bname(self, bid: int) -> str: ...
        def stmt(self, s: pb.Stmt, path: tuple, depth: int) -> None: ...
        def index(self, b: pb.Buffer, i: int, idx: pb.Expr, ipath: tuple,
                  depth: int) -> _Iv | None: ...
        def int_expr(self, e: pb.Expr, path: tuple, depth: int, what: str) -> _Iv: ...

    def init_ws(self) -> None:
        self.group: int | None = None  # the enclosing T.ws region's warpgroup
        self.arrived: set[int] = set()  # barrier ids some T.mbarrier_arrive names
        self.expected: set[int] = set()  # ... some T.mbarrier_expect_tx names
        self.waits: dict[int, tuple[str, tuple]] = {}  # barrier id -> first wait (loc, path)
        self.tma_on: dict[int, tuple[str, tuple]] = {}  # barrier id -> first TMA copy

    def barrier_decl(self, b: pb.Buffer, path: tuple) -> None:
        name = self.bname(b.id)
        if b.scope != pb.BARRIER:
            if b.arrive_count:
                self.fail(f"{ops.SCOPE_NAME.get(b.scope, '?')} buffer {name} sets arrive_count "
                          f"{b.arrive_count}; only barriers have one", (path, ".arrive_count"))
            return
        if b.dtype != pb.UINT64 or len(self.shape[b.id]) != 1:
            self.fail(f"barrier {name} must be a 1-d uint64 buffer (T.alloc_barrier)", path)
        if b.arrive_count < 1:
            self.fail(f"barrier {name} has arrive_count {b.arrive_count}; a phase needs at "
                      "least 1 arrival", (path, ".arrive_count"))

    def region_threads(self) -> int:
        return WARPGROUP if self.group is not None else self.p.kernel.threads

    # -- statements ----------------------------------------------------------------------------

    def s_warp_group(self, w: pb.WarpGroup, path: tuple, depth: int) -> None:
        threads = self.p.kernel.threads
        if self.parallel:
            self.fail("T.ws cannot appear inside a Parallel loop", path)
        if self.group is not None:
            self.fail(f"T.ws({w.group}) is nested in T.ws({self.group}); warpgroup regions do "
                      "not nest", path)
        if threads % WARPGROUP:
            self.fail(f"T.ws needs the kernel's threads to be a multiple of {WARPGROUP} (whole "
                      f"warpgroups); it launches {threads}", path)
        if w.group >= threads // WARPGROUP:
            self.fail(f"T.ws({w.group}) names warpgroup {w.group}, but {threads} threads make "
                      f"{threads // WARPGROUP} warpgroup(s), 0..{threads // WARPGROUP - 1}",
                      (path, ".group"))
        if w.regs and not (24 <= w.regs <= 256 and w.regs % 8 == 0):
            self.fail(f"T.ws(regs={w.regs}): setmaxnreg takes 24..256 registers, a multiple of "
                      "8 (0 leaves them alone)", (path, ".regs"))
        if not w.HasField("body"):
            self.fail(f"T.ws({w.group}) has no body", (path, ".body"))
        self.group = w.group
        self.stmt(w.body, (path, ".body"), depth + 1)
        self.group = None

    def barrier_ref(self, ref: pb.BarrierRef, path: tuple, depth: int, what: str) -> pb.Buffer:
        b = self.buffer(ref.barrier, (path, ".barrier"))
        name = self.bname(b.id)
        if b.scope != pb.BARRIER:
            self.fail(f"{what} on {name}, a {ops.SCOPE_NAME.get(b.scope, '?')} buffer: "
                      "mbarrier ops need a barrier from T.alloc_barrier, which also initializes "
                      "it (on other memory they act on an uninitialized barrier, and a wait "
                      "never returns)", (path, ".barrier"))
        if not ref.HasField("index"):
            self.fail(f"{what} on {name} has no barrier index", (path, ".index"))
        self.index(b, 0, ref.index, (path, ".index"), depth)
        return b

    def s_mbarrier(self, op: pb.MBarrierOp, path: tuple, depth: int) -> None:
        if op.kind not in ops.MBARRIER_NAME:
            self.fail(f"mbarrier op has {'no kind' if op.kind == 0 else f'unknown kind {op.kind}'}",
                      (path, ".kind"))
        what = "T." + ops.MBARRIER_NAME[op.kind]
        if self.parallel:
            self.fail(f"{what} is run by its whole region; it cannot appear inside a Parallel "
                      "loop", path)
        if not op.HasField("barrier"):
            self.fail(f"{what} names no barrier", (path, ".barrier"))
        b = self.barrier_ref(op.barrier, (path, ".barrier"), depth + 1, what)
        name = self.bname(b.id)
        if op.kind == pb.MBARRIER_ARRIVE:
            if op.HasField("value"):
                self.fail(f"{what} takes no value", (path, ".value"))
            width = self.region_threads()
            if width > b.arrive_count:
                self.fail(f"{what} here runs on {width} threads, each arriving once on {name}, "
                          f"whose phases complete after {b.arrive_count} arrival(s): allocate "
                          f"it with arrive_count={width}", path)
            self.arrived.add(b.id)
            return
        if not op.HasField("value"):
            self.fail(f"{what} on {name} has no "
                      f"{'parity' if op.kind == pb.MBARRIER_WAIT_PARITY else 'byte count'}",
                      (path, ".value"))
        iv = self.int_expr(op.value, (path, ".value"), depth + 1, f"the value of {what}")
        c = _const(iv)
        if op.kind == pb.MBARRIER_WAIT_PARITY:
            if c is not None and c not in (0, 1):
                self.fail(f"{what} on {name} waits for parity {c}; a parity is 0 or 1",
                          (path, ".value"))
            self.waits.setdefault(b.id, (self.loc, path))
        else:
            if c is not None and not 1 <= c <= MAX_TX_BYTES:
                self.fail(f"{what} on {name} announces {c} bytes; a phase takes 1.."
                          f"{MAX_TX_BYTES}", (path, ".value"))
            self.expected.add(b.id)

    def s_fence_proxy_async(self, _f: pb.FenceProxyAsync, path: tuple, _depth: int) -> None:
        if self.parallel:
            self.fail("T.fence_proxy_async is run by its whole region; it cannot appear inside "
                      "a Parallel loop", path)

    def tma_copy(self, c: pb.Copy, src: pb.Buffer, dst: pb.Buffer, path: tuple,
                 depth: int) -> None:
        b = self.barrier_ref(c.tma, (path, ".tma"), depth + 1, "T.tma_copy")
        sname, dname = self.bname(src.id), self.bname(dst.id)
        if src.scope != pb.GLOBAL or dst.scope != pb.SHARED:
            self.fail(f"T.tma_copy reads a GLOBAL tile into a SHARED tile; here {sname} is "
                      f"{ops.SCOPE_NAME.get(src.scope, '?')} and {dname} is "
                      f"{ops.SCOPE_NAME.get(dst.scope, '?')}", path)
        if src.dtype != dst.dtype:
            self.fail(f"T.tma_copy moves bytes: {sname} ({ENUM_TO_NAME.get(src.dtype)}) and "
                      f"{dname} ({ENUM_TO_NAME.get(dst.dtype)}) need the same dtype", path)
        if len(self.shape[src.id]) != 2:
            self.fail(f"T.tma_copy takes 2-d global tensors; {sname} has rank "
                      f"{len(self.shape[src.id])}", (path, ".src"))
        rows, cols = c.src.extents
        inner = cols * nbytes(src.dtype)
        if inner % 16 or rows > TMA_MAX_BOX or cols > TMA_MAX_BOX:
            self.fail(f"T.tma_copy of a {rows}x{cols} tile of {sname}: TMA boxes have at most "
                      f"{TMA_MAX_BOX} elements per dim and rows of a multiple of 16 bytes; "
                      f"these rows are {inner} bytes", (path, ".src.extents"))
        shape, lead = self.shape[dst.id], len(self.shape[dst.id]) - 2
        whole = lead >= 0 and all(e == 1 for e in c.dst.extents[:lead]) and \
            list(c.dst.extents[lead:]) == [rows, cols] == shape[lead:] and \
            all(_const_expr(o) == 0 for o in c.dst.offsets[lead:])
        if not whole:
            self.fail(f"T.tma_copy fills whole 2-d tiles: {dname} must be {rows}x{cols}, or "
                      f"hold stages of {rows}x{cols} named as {dname}[s, :, :]", (path, ".dst"))
        if lead and rows * inner % 128:
            self.fail(f"each stage of {dname} is {rows * inner} bytes; TMA writes 128-byte "
                      "aligned tiles, so a stage must be a multiple of 128 bytes", (path, ".dst"))
        self.tma_on.setdefault(b.id, (self.loc, path))

    # -- the whole kernel ----------------------------------------------------------------------

    def barrier_flow(self) -> None:
        threads = self.p.kernel.threads
        for i, b in enumerate(self.p.buffers):
            if b.scope == pb.BARRIER and b.arrive_count > threads:
                self.loc = _loc_str(b.loc)
                self.fail(f"barrier {self.bname(b.id)} waits for {b.arrive_count} arrivals per "
                          f"phase, more than the block's {threads} threads can give",
                          (None, f"buffers[{i}].arrive_count"))
        for bid, (loc, path) in self.waits.items():
            if bid not in self.arrived:
                name = self.bname(bid)
                self.loc = loc
                self.fail(f"T.mbarrier_wait_parity on {name} waits for a phase that never "
                          f"completes: no T.mbarrier_arrive names {name} anywhere in the kernel "
                          "(TMA copies and T.mbarrier_expect_tx add bytes, not arrivals)", path)
        for bid, (loc, path) in self.tma_on.items():
            if bid not in self.expected:
                name = self.bname(bid)
                self.loc = loc
                self.fail(f"T.tma_copy completes its bytes on {name}, but no "
                          f"T.mbarrier_expect_tx on {name} announces them: the phase would "
                          "complete before the data lands", path)


def _const_expr(e: pb.Expr) -> int | None:
    return e.int_value if e.WhichOneof("kind") == "int_value" else None
