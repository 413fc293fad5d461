"""Verifier rules of the tile ops, a mixin of `_Verifier` (tiled.ir.verifier): T.copy, T.gemm,
T.fill, T.reduce and T.cumsum (Scan) are run by the whole block, so never inside a Parallel
loop; each takes operands of the scopes, dtypes and shapes its lowering handles (a copy's two
tiles agree up to unit dims, gemm's A @ B is C, a reduction drops one dim, a scan keeps the
shape and dtype). Regions and indices are checked by tiled.ir.verify_access, TMA copies
by tiled.ir.verify_ws.
"""

from __future__ import annotations

from tiled.ir import ops
from tiled.ir.verify_base import Rules, _dt, _shape_str
from tiled.v1 import tile_ir_pb2 as pb


class TileOpRules(Rules):
    """The statements that are tile ops (module docstring)."""

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
        if g.policy not in ops.GEMM_POLICIES:
            self.fail(f"gemm has unknown warp policy {g.policy}", (path, ".policy"))
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

    def s_scan(self, sc: pb.Scan, path: tuple, depth: int) -> None:
        self.tile_op("cumsum", path)
        src = self.buffer(sc.src, (path, ".src"))
        dst = self.buffer(sc.dst, (path, ".dst"))
        for role, b in (("source", src), ("destination", dst)):
            field = ".src" if b is src else ".dst"
            if b.scope not in (pb.SHARED, pb.FRAGMENT):
                self.fail(f"cumsum {role} {self.bname(b.id)} is "
                          f"{ops.SCOPE_NAME.get(b.scope, '?')}; it must be SHARED or FRAGMENT "
                          "(T.copy a global tile into one first)", (path, field))
            if b.dtype == pb.BOOL:
                self.fail(f"cumsum {role} {self.bname(b.id)} is bool; a prefix sum adds "
                          "numbers (cast to an integer first)", (path, field))
        if dst.dtype != src.dtype:
            self.fail(f"cumsum of {_dt(src.dtype)} {self.bname(src.id)} into {_dt(dst.dtype)} "
                      f"{self.bname(dst.id)}: both must have one dtype (T.copy casts)",
                      (path, ".dst"))
        shape = self.shape[src.id]
        if self.shape[dst.id] != shape:
            self.fail(f"cumsum of {self.bname(src.id)} ({_shape_str(shape)}) into "
                      f"{self.bname(dst.id)} ({_shape_str(self.shape[dst.id])}): both must "
                      "have one shape", (path, ".dst"))
        if not 0 <= sc.dim < len(shape):
            self.fail(f"cumsum dim {sc.dim} is out of range for {self.bname(src.id)} of rank "
                      f"{len(shape)}", (path, ".dim"))
