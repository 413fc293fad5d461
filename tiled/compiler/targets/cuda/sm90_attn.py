"""The sm_90a warp-specialized attention path: which programs take it, and its lowering.

A kernel takes the path on `cuda:sm_90a` when it has the shape of a FlashAttention forward
(examples/flash_attention.py): before a top-level T.Pipelined loop, a Q tile is copied from
global to shared; in the loop, a K and a V tile are copied from global to shared,
`S = Q @ K^T` (T.gemm with transpose_B into a float32 fragment), some fragment computation,
the probabilities are copied from a fragment to a shared P tile, and `acc += P @ V`. The four
shared tiles may be used by nothing else; Q, K, V are 16-bit with head dim D of 64 or 128;
the K / V tile has BN of 64 or 128 rows; threads are 128 or 256, one consumer warpgroup per
64 query rows (BM = 64 * warpgroups). Then:

- the block gets one more warpgroup (the producer): its first thread TMA-loads Q once per
  program block, and K and V per iteration into a STAGES-deep ring of 128B-swizzled tiles,
  each tile D / 64 panels of 64 columns, with separate full barriers for K and V (S can start
  before V lands);
- the consumers run the program: `S = Q @ K^T` is wgmma with both operands in shared memory;
  the fragment code between the gemms runs on the wgmma accumulator layout, its row
  reductions on the rows layout (layouts.WgmmaRows: a register combine and two quad
  shuffles); the copy of S's probabilities to P becomes a conversion to 16-bit registers in
  wgmma's A-operand layout (which is the accumulator layout of S), and `acc += P @ V` is
  wgmma with A in registers and V as an MN-major shared operand; the stage is released then;
- when every program block runs the same number of iterations, the grid is persistent
  (min(blocks, SMs) blocks, each walking program blocks, `attn_blocks`): Q has two slots, so
  the producer loads the next block's Q and first K / V tiles while the consumers finish this
  one. When the count depends on the block (a causal mask), blocks differ in length and the
  hardware's block scheduler balances them better than a fixed walk: one block per program
  block, the program's grid;
- every global tensor feeding the ring is described by a TMA descriptor of its own rank, so a
  tile past the end of a sequence reads zeros, as the program says, not the next head's rows.

Everything else is lowered as for sm_80.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.stmts import body_statements, const_int, tile_op_buffers
from tiled.compiler.targets.cuda.cnames import CTYPE
from tiled.compiler.targets.cuda.epilogue import store_acc_tile
from tiled.compiler.targets.cuda.grid_walk import persistent_walk, producer_waits_for_grid
from tiled.compiler.targets.cuda.layouts import WgmmaLayout
from tiled.compiler.targets.cuda.tma import tma_requirements
from tiled.ir import dtypes
from tiled.ir.walk import element_accesses, expr_vars, walk
from tiled.v1 import tile_ir_pb2 as pb

PRODUCER_THREADS = 128
PRODUCER_REGS, CONSUMER_REGS = 24, 240
RING_SLACK = 1024  # the ring is aligned to 1024 bytes inside the dynamic pool
SMEM_BUDGET = 225 * 1024  # of the ring: stages are dropped to fit (sm_90a: 227 KiB)


def tile_ops_on(body: pb.Stmt, tiles: set[int]) -> int:
    """How many tile ops (copy, gemm, reduce, fill) in `body` read or write one of `tiles`."""
    return sum(bool(tile_op_buffers(st) & tiles) for st in walk(body))


@dataclass(frozen=True)
class AttnPlan:
    loop: pb.For  # the T.Pipelined loop
    copy_q: pb.Copy
    copy_k: pb.Copy
    copy_v: pb.Copy
    q: int  # shared tile ids (ring tiles: only TMA and wgmma see them)
    k: int
    v: int
    p: int
    s: int  # fragment of the scores (QK^T's accumulator)
    o: int  # fragment of the output (PV's accumulator)
    dtype: str  # float16 | bfloat16
    BM: int
    BN: int
    D: int
    stages: int
    nwg: int
    clear_s: int  # index in the loop body of a `T.clear(S)` just before S = Q K^T, or -1
    persistent: bool  # every program block runs the same number of iterations
    requires: tuple = ()  # launch preconditions of the TMA descriptors (tma)

    @property
    def ring_tiles(self) -> set[int]:
        return {self.q, self.k, self.v, self.p}

    @property
    def ring_bytes(self) -> int:
        return RING_SLACK + (2 * self.BM + 2 * self.stages * self.BN) * self.D * 2 + \
            8 * (4 + 4 * self.stages)

    def accumulators(self) -> dict[int, WgmmaLayout]:
        return {self.s: WgmmaLayout(self.BM, self.BN, self.nwg),
                self.o: WgmmaLayout(self.BM, self.D, self.nwg)}

    def template(self) -> str:
        return (f"tiled::sm90::attn::WsAttn<{CTYPE[self.dtype]}, {self.BM}, {self.BN}, "
                f"{self.D}, {self.stages}, {self.nwg}>")

    def box(self, c: pb.Copy) -> list[int]:
        """The TMA box of a ring copy, innermost first: one 64-column panel of the tile."""
        return [64] + [int(e) for e in reversed(c.src.extents[:-1])]


def find_ws_attention(p: pb.Program) -> AttnPlan | None:
    """The plan for `p`'s attention loop, or None when `p` does not match (see the module
    docstring); never raises for a program that merely does not match."""
    buffers = {b.id: b for b in p.buffers}
    threads = p.kernel.threads
    if threads not in (128, 256):
        return None
    nwg = threads // 128
    top = body_statements(p.kernel.body)
    loops = [i for i, s in enumerate(top) if s.WhichOneof("kind") == "for_"
             and s.for_.kind == pb.PIPELINED]
    if len(loops) != 1:
        return None
    f = top[loops[0]].for_
    if (n := const_int(f.extent)) is not None and n < 1:
        return None  # a loop that never runs has nothing to feed
    body = body_statements(f.body)
    gemms = [s.gemm for s in body if s.WhichOneof("kind") == "gemm"]
    if len(gemms) != 2:
        return None
    qk, pv = gemms
    if not qk.transpose_b or qk.transpose_a or pv.transpose_a or pv.transpose_b or \
            qk.clear_accum or pv.clear_accum:
        return None
    q, k, s_frag, pt, v, o = qk.a, qk.b, qk.c, pv.a, pv.b, pv.c
    if len({q, k, s_frag, pt, v, o}) != 6:
        return None
    shared = [buffers[x] for x in (q, k, v, pt)]
    if any(b.scope != pb.SHARED or len(b.shape) != 2 for b in shared):
        return None
    dt = {dtypes.canonical_name(b.dtype) for b in shared}
    if len(dt) != 1 or not dt <= {"float16", "bfloat16"}:
        return None
    for x in (s_frag, o):
        if buffers[x].scope != pb.FRAGMENT or dtypes.canonical_name(buffers[x].dtype) != "float32":
            return None
    BM, D = (d.size for d in buffers[q].shape)
    BN = buffers[k].shape[0].size
    if nwg * 64 != BM or D not in (64, 128) or BN not in (64, 128) or \
            [d.size for d in buffers[k].shape] != [BN, D] or \
            [d.size for d in buffers[v].shape] != [BN, D] or \
            [d.size for d in buffers[pt].shape] != [BM, BN] or \
            [d.size for d in buffers[s_frag].shape] != [BM, BN] or \
            [d.size for d in buffers[o].shape] != [BM, D]:
        return None

    # The statements of the loop: K / V copies first, then S = Q K^T, ..., P <- fragment,
    # acc += P V; nothing else in the loop touches shared memory (copies between fragments,
    # as T.copy(m, m_prev), are fragment code).
    kinds = [st.WhichOneof("kind") for st in body]
    copies = [st.copy for st in body if st.WhichOneof("kind") == "copy" and not
              buffers[st.copy.src.buffer].scope == buffers[st.copy.dst.buffer].scope
              == pb.FRAGMENT]
    ring_copies = {c.dst.buffer: c for c in copies if c.dst.buffer in (k, v)}
    p_copies = [c for c in copies if c.dst.buffer == pt]
    if set(ring_copies) != {k, v} or len(p_copies) != 1 or len(copies) != 3:
        return None
    i_qk, i_pv = kinds.index("gemm"), len(kinds) - 1 - kinds[::-1].index("gemm")
    i_p = next(i for i, st in enumerate(body) if st.WhichOneof("kind") == "copy"
               and st.copy.dst.buffer == pt)
    ring_idx = [i for i, st in enumerate(body) if st.WhichOneof("kind") == "copy"
                and st.copy.dst.buffer in (k, v)]
    if max(ring_idx) > i_qk or not i_qk < i_p < i_pv:
        return None
    pc = p_copies[0]
    src_p = buffers[pc.src.buffer]
    if src_p.scope != pb.FRAGMENT or [d.size for d in src_p.shape] != [BM, BN] or \
            list(pc.src.extents) != [BM, BN] or list(pc.dst.extents) != [BM, BN] or \
            any(o_.WhichOneof("kind") != "int_value" or o_.int_value
                for o_ in list(pc.src.offsets) + list(pc.dst.offsets)):
        return None

    # The Q copy: top level, before the loop.
    q_copies = [s.copy for s in top[:loops[0]] if s.WhichOneof("kind") == "copy"
                and s.copy.dst.buffer == q]
    if len(q_copies) != 1:
        return None
    # The tiles' origins: of the block vars, the loop var (K / V) and symbolic dims (as the
    # safety pass's clamps bring in), values the producer computes as the consumers do.
    block_vars = set(p.kernel.block_vars)
    uniform = block_vars | {d.var for b in p.buffers for d in b.shape
                            if d.WhichOneof("kind") == "var"}
    for c, rows, allowed in ((q_copies[0], BM, uniform),
                             (ring_copies[k], BN, uniform | {f.var}),
                             (ring_copies[v], BN, uniform | {f.var})):
        src = buffers[c.src.buffer]
        if src.scope != pb.GLOBAL or not 2 <= len(src.shape) <= 5 or \
                dtypes.canonical_name(src.dtype) not in dt:
            return None
        ext = list(c.src.extents)
        if ext[-1] != D or src.shape[-1].WhichOneof("kind") != "size" or \
                src.shape[-1].size != D or sorted(e for e in ext[:-1] if e != 1) != [rows] or \
                max(ext[:-1]) > 256 or list(c.dst.extents) != [rows, D] or \
                any(o_.WhichOneof("kind") != "int_value" or o_.int_value
                    for o_ in c.dst.offsets):
            return None
        if c.src.offsets[-1].WhichOneof("kind") != "int_value" or c.src.offsets[-1].int_value:
            return None
        if not expr_vars(c.src.offsets) <= allowed:
            return None
    # The ring tiles and the P tile feed these ops only.
    tiles = {q, k, v, pt}
    if tile_ops_on(p.kernel.body, tiles) != 6 or \
            {bid for bid, _ in element_accesses(p.kernel.body)} & tiles:
        return None
    requires: list = []
    for c in (q_copies[0], ring_copies[k], ring_copies[v]):  # the tensors TMA reads
        req = tma_requirements(p, buffers[c.src.buffer])
        if req is None:
            return None
        requires += [r for r in req if r not in requires]
    dtype = dt.pop()
    before = [i for i in range(i_qk) if i not in ring_idx]
    clear_s = before[-1] if before and _clears(body[before[-1]], s_frag, BM, BN) else -1
    stage = 2 * BN * D * 2
    stages = max(1, min(f.num_stages, (SMEM_BUDGET - 2 * BM * D * 2) // stage))
    return AttnPlan(f, q_copies[0], ring_copies[k], ring_copies[v], q, k, v, pt, s_frag, o,
                    dtype, BM, BN, D, stages, nwg, clear_s,
                    not expr_vars([f.extent]) & block_vars, tuple(requires))


def _clears(st: pb.Stmt, frag: int, rows: int, cols: int) -> bool:
    """Whether `st` sets all of `frag` to zero."""
    if st.WhichOneof("kind") != "fill":
        return False
    f = st.fill
    v = f.value
    zero = (v.WhichOneof("kind") == "float_value" and v.float_value == 0) or \
        (v.WhichOneof("kind") == "int_value" and v.int_value == 0)
    return zero and f.dst.buffer == frag and list(f.dst.extents) == [rows, cols] and all(
        o.WhichOneof("kind") == "int_value" and o.int_value == 0 for o in f.dst.offsets)


def _touches(st: pb.Stmt, bid: int) -> bool:
    """Whether statement `st` (or one inside it) reads or writes buffer `bid`."""
    return any(b == bid for b, _ in element_accesses(st)) or \
        any(bid in tile_op_buffers(x) for x in walk(st))


# -- lowering (called by lower.CudaLowering, `low`) ------------------------------------

def _call(low, name: str, *args, ret: str = "void"):
    return T.call_extern(ret, f"{low.attn.template()}::{name}", *args)


def _ring(low):
    return T.address_of(low.pool[low.ws_offset])


def _coords(low, c: pb.Copy) -> list:
    """The copy's box origin, innermost dim first."""
    return [low.expr(o) for o in reversed(c.src.offsets)]


def _load_tile(low, c: pb.Copy, tmap, tile: str, bar: str, index) -> None:
    """TMA loads of the copy's tile, one per 64-column panel, into WsAttn's `tile` slot and
    onto its `bar` barrier for `index` (the program block for Q, the K / V tile count)."""
    coords = _coords(low, c)
    for j in range(low.attn.D // 64):
        dst = _call(low, tile, _ring(low), index, j, ret="handle")
        T.evaluate(T.call_extern("void", "tiled::sm90::tma_load", dst, tmap,
                                 _call(low, bar, _ring(low), index, ret="handle"),
                                 coords[0] + 64 * j, *coords[1:]))


def lower_attn_producer(low, tmaps: dict) -> None:
    """The producer warpgroup's first thread, per program block: Q, then K and V per
    iteration."""
    a = low.attn
    T.evaluate(_call(low, "begin_q", _ring(low), low.attn_b))
    _load_tile(low, a.copy_q, tmaps["q"], "q_tile", "q_bar", low.attn_b)
    n = low.expr(a.loop.extent)
    base = low.attn_k[0]
    with T.serial(0, n) as k:
        low.vars[a.loop.var] = k
        T.evaluate(_call(low, "begin_k", _ring(low), base + k))
        _load_tile(low, a.copy_k, tmaps["k"], "k_tile", "k_bar", base + k)
        T.evaluate(_call(low, "begin_v", _ring(low), base + k))
        _load_tile(low, a.copy_v, tmaps["v"], "v_tile", "v_bar", base + k)
    T.buffer_store(low.attn_k, base + n, [0])


def lower_attn_loop(low, f: pb.For) -> None:
    """The loop on the consumers' side: the program's statements, with the ring copies gone,
    the gemms as wgmma on the ring and the copy to P as a register conversion.

    The two consumer warpgroups take turns issuing their matrix products (WsAttn's
    sched_*). Software-pipelined within each warpgroup: iteration k issues S = Q K(k)^T, then the
    P V(k-1) it deferred, and waits only for the QK group, so the tensor cores run P V(k-1)
    while the program's statements compute on S. The first statement that touches the
    output fragment or P waits for P V(k-1) (and frees stage k-1). After the loop the last
    P V runs. A `T.clear(S)` right before the QK gemm becomes its first wgmma's zero scale."""
    a = low.attn
    n = low.expr(f.extent)
    s_acc = T.address_of(low.tir[a.s][0])
    o_acc = T.address_of(low.tir[a.o][0])
    p_regs = T.alloc_buffer((a.BN // 4,), "uint32", scope="local")
    p_addr = T.address_of(p_regs[0])

    base = low.attn_k[0]  # K / V tiles the block's earlier program blocks took

    def pv_issue(k):
        T.evaluate(_call(low, "pv_issue", _ring(low), base + k, p_addr, o_acc))

    def pv_wait(k):
        T.evaluate(_call(low, "pv_wait", _ring(low), base + k, o_acc))

    def iteration(k, first: bool) -> None:
        """One iteration; the first has no P V(k-1). Peeled so that every wgmma wait is
        static (see qk_wait)."""
        low.vars[f.var] = k
        issued = waited = first  # P V(k-1), in this iteration's lowering
        for i, st in enumerate(body_statements(f.body)):
            kind = st.WhichOneof("kind")
            if (kind == "copy" and st.copy.dst.buffer in (a.k, a.v)) or i == a.clear_s:
                continue
            # The ring's mbarriers order the wgmma calls; they touch no shared memory the
            # program's threads share, so no block barrier goes before them.
            if kind == "gemm" and st.gemm.c == a.s:
                zero = tirx.const(i > a.clear_s >= 0, "bool")
                T.evaluate(_call(low, "sched_wait"))
                T.evaluate(_call(low, "qk_issue", _ring(low), low.attn_b, base + k, s_acc,
                                 zero))
                if not issued:
                    pv_issue(k - 1)
                T.evaluate(_call(low, "sched_pass"))
                T.evaluate(_call(low, f"qk_wait<{str(not issued).lower()}>", _ring(low),
                                 base + k, s_acc))
                issued = True
                continue
            if not waited and (_touches(st, a.o) or _touches(st, a.p)):
                if not issued:
                    pv_issue(k - 1)
                pv_wait(k - 1)
                issued = waited = True
            if kind == "copy" and st.copy.dst.buffer == a.p:
                src = T.address_of(low.tir[st.copy.src.buffer][0])
                T.evaluate(_call(low, "to_a_regs", src, p_addr))
            elif not (kind == "gemm" and st.gemm.c == a.o):  # P V(k) runs in iteration k+1
                low.stmt(st)

    with T.If(n > 0), T.Then():
        iteration(tirx.const(0, "int32"), True)
        with T.serial(0, n - 1) as k:
            iteration(k + 1, False)
        pv_issue(n - 1)
        pv_wait(n - 1)
    T.buffer_store(low.attn_k, base + n, [0])
    T.evaluate(_call(low, "release_q", _ring(low), low.attn_b))


@contextlib.contextmanager
def attn_blocks(low, grid: list):
    """The persistent block's walk over the program's blocks blockIdx.x, + gridDim.x, ...,
    binding the block vars for each (x fastest, so neighbours share K / V in L2; x reversed,
    so that with a causal mask the longest blocks start first). `low.attn_b` numbers the
    walk's blocks, `low.attn_k` counts the K / V tiles taken so far. Not persistent: the
    launch bound the block vars; one block."""
    low.attn_k = T.alloc_buffer((1,), "int32", scope="local")
    T.buffer_store(low.attn_k, tirx.const(0, "int32"), [0])
    if not low.attn.persistent:
        low.attn_b = tirx.const(0, "int32")
        yield
        return
    blocks = grid[0]
    for g in grid[1:]:
        blocks = blocks * g
    with persistent_walk(low, blocks) as (it, linear):
        low.attn_b = it
        for i, (g, var) in enumerate(zip(grid, low.program.kernel.block_vars, strict=True)):
            coord = tirx.truncmod(linear, g) if i + 1 < len(grid) else linear
            low.vars[var] = g - 1 - coord if i == 0 else coord
            linear = tirx.truncdiv(linear, g)
        yield


def lower_attn_kernel(low, tmaps: dict, grid: list) -> None:
    """Barriers initialized, then the program's threads run its body (consumers) while the
    extra warpgroup's first thread feeds the ring (producer), both walking the same program
    blocks."""
    with T.If(low.tx == 0), T.Then():
        T.evaluate(_call(low, "init", _ring(low)))
    T.evaluate(T.tvm_storage_sync("shared"))
    with T.If(low.tx < low.threads):
        with T.Then():
            T.evaluate(T.call_extern("void", f"tiled::sm90::setmaxnreg_inc<{CONSUMER_REGS}>"))
            T.evaluate(_call(low, "sched_init"))
            with attn_blocks(low, grid):
                low.stmt(low.program.kernel.body)
        with T.Else():
            T.evaluate(T.call_extern("void", f"tiled::sm90::setmaxnreg_dec<{PRODUCER_REGS}>"))
            with T.If(low.tx == low.threads), T.Then():
                producer_waits_for_grid(low)
                with attn_blocks(low, grid):
                    lower_attn_producer(low, tmaps)


def stmt_q_copy(low) -> None:
    """The consumers' side of the Q copy: wait until it has landed."""
    T.evaluate(_call(low, "wait_q", _ring(low), low.attn_b))


def store_attn_tile(low, c: pb.Copy) -> bool:
    """The output fragment to its global tile with WsAttn::store (store_acc_tile)."""
    a = low.attn
    return store_acc_tile(low, c, a.template(), a.o, a.BM, a.D)


def tmap_params(low) -> list[tuple[str, str, dict]]:
    """(key, kernel parameter name, tensor_map recipe) of the three descriptors."""
    a = low.attn
    out = []
    for key, c in (("q", a.copy_q), ("k", a.copy_k), ("v", a.copy_v)):
        out.append((key, f"tiled_tmap_{key}",
                    {"kind": "tensor_map", "param": low.param_of[c.src.buffer], "box": a.box(c),
                     "swizzle": 128}))
    return out

