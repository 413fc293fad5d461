"""Verifier rules of memory accesses, a mixin of `_Verifier` (tiled.ir.verifier): an element
access (a store's or an atomic's indices and value), a tile region (rank, extents, offsets) and
each index into a buffer dim. Bounds follow the interval rules of tiled.ir.verifier's docstring:
SHARED, FRAGMENT and LOCAL accesses are rejected when provably out of bounds, GLOBAL ones only
when outside on every execution (the compiler guards the others), and a global region may run
past its tensor's end but not start past it. `index` returns each index's interval: the seam of
the guard pass (tiled.compiler.passes.guards), which overrides it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiled.ir.intervals import _Iv
from tiled.ir.verify_base import _INT32_MAX, _MAX_DIM, Rules, _dt
from tiled.v1 import tile_ir_pb2 as pb


class AccessRules(Rules):
    """Element accesses, regions and indices (module docstring)."""

    if TYPE_CHECKING:  # provided by ExprRules (tiled.ir.verify_exprs)
        def int_expr(self, e: pb.Expr, path: tuple, depth: int, what: str) -> _Iv: ...

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
                self.addressable(b, i, iv, ext - 1, opath)
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

    def addressable(self, b: pb.Buffer, i: int, iv: _Iv, past: int, path: tuple) -> None:
        """Rejects an index into dim i of global `b` (a region's start, `past` elements before
        its last) whose element offset leaves 32 bits at an attained end: kernels compute
        offsets in int32, and the compiler folds the offsets of such ends, which then do not
        fit. Only static strides are known here; a tensor the runtime accepts has its
        in-bounds offsets in range."""
        stride = 1
        for d in self.shape[b.id][i + 1:]:
            if not isinstance(d, int):
                return
            stride *= d
        for end, exact in ((iv.hi + past, iv.hi_exact), (iv.lo, iv.lo_exact)):
            if exact and not -_INT32_MAX - 1 <= end * stride <= _INT32_MAX:
                self.fail(f"index {end} into {self.bname(b.id)} dim {i} addresses element "
                          f"{end * stride}, past what 32-bit offsets reach (kernels index "
                          "tensors with int32)", path)

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
        (tiled.ir.verifier's docstring). Returns the index's interval; None in code that never
        runs."""
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
            self.addressable(b, i, iv, 0, ipath)
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
