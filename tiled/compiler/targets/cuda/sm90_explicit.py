"""The explicit sm_90a path: programs that schedule Hopper by hand with T.ws regions,
mbarriers and TMA copies (tiled.lang.hopper), lowered by `ExplicitLowering`, a CudaLowering
that the cuda backend picks when a program holds any of those statements (cuda:sm_90a only).

- Barriers live at the end of the dynamic shared pool (8 bytes each); thread 0 initializes
  them with their arrive counts before the body runs, then fence + __syncthreads.
- `T.ws(g)` becomes `if (threadIdx.x / 128 == g)` (+ setmaxnreg): inside, tile ops and
  T.Parallel nests are shared out over the warpgroup's 128 threads, counted from its first
  (the fragment layouts are chosen for 128 threads, so fragments live in one warpgroup: they
  may be used only inside T.ws regions), and the barrier among them is a named barrier the
  other warpgroups never join. `regs` below the launch's budget (65536 / threads, at most 256)
  is setmaxnreg.dec, above it .inc.
- A TMA copy is one thread's `tma_load` (tiled_sm90.h) with a tensor map passed as a kernel
  parameter (recipe kind "tensor_map", swizzle 0: the shared tile is dense row-major, which
  every other op reads as usual); T.mbarrier_expect_tx is issued by the same thread, arrivals
  and waits by every thread that runs them (tiled_sm90_explicit.h).
- A T.gemm whose tiles only TMA writes and only such gemms read runs on wgmma over 128B-
  swizzled panel tiles, their TMA copies one swizzled box per 64-wide panel
  (sm90_wgmma.py); every other gemm on mma.sync over dense tiles.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.barriers import SyncTracker, shared_effects
from tiled.compiler.passes.resources import align_up
from tiled.compiler.passes.stmts import tile_op_buffers
from tiled.compiler.targets.cuda.layouts import infer_layouts
from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.compiler.targets.cuda.sm90_wgmma import find_wgmma, tma_panels, wgmma_gemm
from tiled.compiler.targets.cuda.tma import tma_requirements, with_tensor_maps
from tiled.compiler.tir import loc_of
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.verify_ws import WARPGROUP, explicit_statement
from tiled.ir.walk import stmt_exprs, subexprs, walk
from tiled.v1 import tile_ir_pb2 as pb

MAX_REGS = 256  # setmaxnreg's ceiling, and the register file's per-thread share cap here
REGISTER_FILE = 65536  # 32-bit registers per SM


def warpgroup_view(p: pb.Program) -> pb.Program:
    """`p` with every T.ws region replaced by its body and, when it has any, 128 threads: what
    layout inference and pool planning see (each region runs as a block of one warpgroup)."""
    view = pb.Program()
    view.CopyFrom(p)
    found = False
    stack = [view.kernel.body]
    while stack:
        s = stack.pop()
        kind = s.WhichOneof("kind")
        if kind == "warp_group":
            found = True
            s.CopyFrom(s.warp_group.body)
            stack.append(s)
        elif kind == "seq":
            stack.extend(s.seq.stmts)
        elif kind == "for_":
            stack.append(s.for_.body)
        elif kind == "if_then_else":
            stack += [s.if_then_else.then_body, s.if_then_else.else_body]
    if found:
        view.kernel.threads = WARPGROUP
    return view


def _fragments_in(st: pb.Stmt, buffers: dict) -> set[int]:
    """Fragments statement `st` itself (not its nested statements) reads or writes."""
    kind = st.WhichOneof("kind")
    ids = tile_op_buffers(st)
    if kind in ("store", "atomic_add"):
        ids.add(getattr(st, kind).buffer)
    ids |= {x.load.buffer for e in stmt_exprs(st) for x in subexprs(e)
            if x.WhichOneof("kind") == "load"}
    return {b for b in ids if buffers[b].scope == pb.FRAGMENT}


class ExplicitLowering(CudaLowering):
    explicit = True
    overlays = False  # the author orders the warps' shared accesses (T.ws, mbarriers)

    def __init__(self, program: Program, arch: str = "sm_90a", warp_specialize: bool = True):
        p = program.proto
        found = explicit_statement(p)
        if arch != "sm_90a":
            raise CompileError(f"{found[0]} is part of the explicit Hopper path (mbarriers, TMA, "
                               f"warpgroups): it compiles for cuda:sm_90a only, not "
                               f"cuda:{arch}", loc_of(found[1]))
        super().__init__(program, arch, warp_specialize=False)
        self.view = warpgroup_view(p)
        self.layouts = infer_layouts(self.view)
        self.wgmma, wgmma_layouts = find_wgmma(self.view, self.buffers)
        if wgmma_layouts is not None:
            self.layouts = wgmma_layouts
        self.explicit_requires: list = []  # launch preconditions of the TMA descriptors
        self.barrier_offset: dict[int, int] = {}  # barrier id -> byte offset in the pool
        self.bar_tir: dict[int, tirx.Buffer] = {}
        # (tensor, box rows, box cols, swizzle) -> tensor map parameter
        self.tmaps: dict[tuple[int, int, int, int], tirx.Var] = {}
        if self.view.kernel.threads != self.threads:  # the kernel has T.ws regions
            for st in walk(p.kernel.body):  # walk() stays outside T.ws bodies
                frags = _fragments_in(st, self.buffers)
                if frags:
                    name = self.buffers[min(frags)].name or f"b{min(frags)}"
                    raise CompileError(f"fragment {name} is used outside T.ws: in a kernel with "
                                       "warpgroup regions a fragment lives in one warpgroup's "
                                       "registers; use it inside a T.ws region", loc_of(st))

    # -- planning ------------------------------------------------------------------------------
    def statements(self):
        return walk(self.view.kernel.body)

    def placed_elsewhere(self) -> set[int]:
        return set(self.wgmma.tiles)

    def plan(self) -> None:
        super().plan()
        offset = align_up(self.pool_bytes, 16)
        if self.wgmma.tiles:
            self.wgmma.region_offset = offset
            offset += self.wgmma.region_bytes
        for b in self.program.buffers:
            if b.scope == pb.BARRIER:
                self.barrier_offset[b.id] = offset
                offset += 8 * b.shape[0].size
        self.pool_bytes = offset

    def declare_tensor_maps(self) -> None:
        """One TMA descriptor parameter per (tensor, box) the copies use. A tensor whose rows
        are not a multiple of 16 bytes apart is a located CompileError; one whose row stride
        depends on a symbolic dim makes that a launch precondition (`requires`): the author
        asked for TMA, so there is no variant without it."""
        for st in self.statements():
            if st.WhichOneof("kind") != "copy" or not st.copy.HasField("tma"):
                continue
            src = self.buffers[st.copy.src.buffer]
            req = tma_requirements(self.program, src)
            if req is None:
                shape = "x".join(str(d.size) for d in src.shape)
                raise CompileError(f"T.tma_copy from {src.name or 'a tensor'} ({shape} "
                                   f"{dtypes.canonical_name(src.dtype)}): TMA needs its rows "
                                   f"to be a multiple of 16 bytes apart; pad the row or use "
                                   f"T.copy", loc_of(st))
            self.explicit_requires += [r for r in req if r not in self.explicit_requires]
            key = self.tmap_key(st.copy)
            if key in self.tmaps:
                continue
            name = f"tiled_tmap_{len(self.tmaps)}"
            self.tmaps[key] = T.arg(name, T.handle())
            self.tensor_maps[name] = {"kind": "tensor_map", "param": self.param_of[key[0]],
                                      "box": [key[2], key[1]], "swizzle": key[3]}

    @property
    def requires(self) -> list:
        return self.explicit_requires

    def tmap_key(self, c: pb.Copy) -> tuple[int, int, int, int]:
        """(tensor, box rows, box cols, swizzle) of a TMA copy: a panel tile's copy is one
        128B-swizzled box of 64 columns per panel, any other one box of the whole tile."""
        rows, cols = c.src.extents
        if c.dst.buffer in self.wgmma.tiles:
            return c.src.buffer, rows, 64, 128
        return c.src.buffer, rows, cols, 0

    def lower_body(self) -> None:
        for b in self.program.buffers:
            if b.scope == pb.BARRIER:
                self.bar_tir[b.id] = T.decl_buffer((b.shape[0].size,), "uint64",
                                                   data=self.pool.data,
                                                   elem_offset=self.barrier_offset[b.id] // 8)
        with T.If(self.tx == 0), T.Then():
            for b in self.program.buffers:
                if b.scope == pb.BARRIER:
                    with T.serial(0, b.shape[0].size) as i:
                        self.call("bar_init", T.address_of(self.bar_tir[b.id][i]),
                                  tirx.const(b.arrive_count, "uint32"))
            self.call("fence_barrier_init")
        T.evaluate(T.tvm_storage_sync("shared"))
        self.stmt(self.program.kernel.body)

    # -- statements ----------------------------------------------------------------------------
    @staticmethod
    def call(fn: str, *args) -> None:
        T.evaluate(T.call_extern("void", f"tiled::sm90::{fn}", *args))

    def barrier(self, ref: pb.BarrierRef):
        return T.address_of(self.bar_tir[ref.barrier][self.expr(ref.index)])

    def stmt_seq(self, seq, _s):
        """Runs of adjacent T.ws regions of distinct warpgroups become one if / else-if chain
        (a thread is in one warpgroup, so this changes nothing): ptxas then sees that no code
        of another region follows a region's setmaxnreg.dec, which it would otherwise ignore
        (remark C7507) to keep that code's registers."""
        stmts = list(seq.stmts)
        i = 0
        while i < len(stmts):
            j = i
            groups: set[int] = set()
            while j < len(stmts) and stmts[j].WhichOneof("kind") == "warp_group" and \
                    stmts[j].warp_group.group not in groups:
                groups.add(stmts[j].warp_group.group)
                j += 1
            if j - i < 2:
                self.stmt(stmts[i])
                i += 1
                continue
            effects = [shared_effects(st.warp_group.body, self.buffers) for st in stmts[i:j]]
            # the block's accesses before the regions
            self.sync.before(any(r for r, _ in effects), any(w for _, w in effects))
            self.region_chain(stmts[i:j])
            i = j

    def region_chain(self, regions: list) -> None:
        w = regions[0].warp_group
        with T.If(tirx.floordiv(self.tx, WARPGROUP) == w.group):
            with T.Then():
                try:
                    self.region_body(w)
                except CompileError as e:
                    if not e.loc and loc_of(regions[0]):
                        raise CompileError(e.message, loc_of(regions[0])) from None
                    raise
            if len(regions) > 1:
                with T.Else():
                    self.region_chain(regions[1:])

    def stmt_warp_group(self, w, s):
        reads, writes = shared_effects(w.body, self.buffers)
        self.sync.before(reads, writes)  # the block's accesses before the region
        with T.If(tirx.floordiv(self.tx, WARPGROUP) == w.group), T.Then():
            self.region_body(w)

    def region_body(self, w) -> None:
        """The body of T.ws region `w`, inside the test for its warpgroup."""
        g = w.group
        outer = (self.sync, self.tx, self.threads, self.tid_base)
        if w.regs:
            budget = min(MAX_REGS, REGISTER_FILE // self.launch_threads // 8 * 8)
            if w.regs != budget:
                how = "inc" if w.regs > budget else "dec"
                self.call(f"setmaxnreg_{how}<{w.regs}>")
        # Named barrier g + 1 (0 is __syncthreads): only this warpgroup joins it.
        self.sync = SyncTracker(f"tiled::sm90::warpgroup_sync<{g + 1}>")
        self.tx, self.threads, self.tid_base = self.tx - WARPGROUP * g, WARPGROUP, \
            WARPGROUP * g
        try:
            self.stmt(w.body)
        finally:
            self.sync, self.tx, self.threads, self.tid_base = outer

    def stmt_mbarrier(self, op, s):
        bar = self.barrier(op.barrier)
        if op.kind == pb.MBARRIER_ARRIVE:
            self.call("bar_arrive", bar)
        elif op.kind == pb.MBARRIER_WAIT_PARITY:
            self.call("bar_wait", bar, tirx.Cast("uint32", self.expr(op.value)))
        else:
            with self.single_thread():
                self.call("bar_expect_tx", bar, tirx.Cast("uint32", self.expr(op.value)))

    def stmt_fence_proxy_async(self, _f, s):
        self.call("fence_proxy_async_shared")

    def stmt_copy(self, c, s):
        if not c.HasField("tma"):
            return super().stmt_copy(c, s)
        tmap = self.tmaps[self.tmap_key(c)]
        if c.dst.buffer in self.wgmma.tiles:
            return tma_panels(self, c, tmap)
        row, col = (self.expr(o) for o in c.src.offsets)
        dst = self.addr(c.dst.buffer, [self.expr(o) for o in c.dst.offsets])
        with self.single_thread():
            self.call("tma_load", dst, tmap, self.barrier(c.tma), col, row)
        return None


    def stmt_gemm(self, g, s):
        if g.a not in self.wgmma.tiles:
            return super().stmt_gemm(g, s)
        self.uniform_stmt(s)
        return wgmma_gemm(self, g)


def explicit_source(source: str, low: ExplicitLowering) -> str:
    """The kernel source with the explicit path's headers and its tensor-map parameters (passed
    by value, `const __grid_constant__`) and one block per SM in its launch bounds."""
    return ('#include "tiled_cuda.h"\n#include "tiled_sm90.h"\n#include "tiled_sm90_explicit.h"\n'
            + with_tensor_maps(source, low.launch_threads))
