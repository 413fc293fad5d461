"""How CudaLowering reads and writes a tile's elements: a shared tile by its row (stage,
padding, wgmma panels), a fragment by the slot its layout gives the thread, a global or local
buffer as indexed. A mixin of CudaLowering (lower.py), split from it by concept."""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.layout_kinds import ReplicatedLayout, StackedLayout, cols_of, ravel
from tiled.compiler.passes.stmts import column_read, is_identity
from tiled.compiler.targets.cuda.gemm_sm90 import panel_index
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.v1 import tile_ir_pb2 as pb


class BufferAccess:
    """Element access for a lowering with CudaLowering's state (buffers, tir, shared, layouts,
    stage, the current T.Parallel nest's bindings)."""

    def shared_index(self, bid: int, indices: list) -> list:
        if bid in self.wgmma_ops.panels:
            return [panel_index(self, bid, indices)]
        tile = self.shared[bid]
        shape = [d.size for d in self.buffers[bid].shape]
        row = ravel(indices[:-1], shape[:-1]) if len(shape) > 1 else tirx.const(0, "int32")
        stage = self.stage.get(bid)
        if stage is not None:
            row = row + stage * tile.rows
        return [row, indices[-1]]

    def shared_stride(self, bid: int) -> int:
        """Elements from one row of shared tile `bid` to the next (rows are padded); 1 for
        a panel tile, whose rows are swizzled (no vectors across its chunks)."""
        return 1 if bid in self.wgmma_ops.panels else self.shared[bid].stride

    def frag_slot(self, bid: int, indices: list, ir_indices=None):
        lay = self.layouts[bid]
        if bid in self.frag_bind and ir_indices is not None and \
                is_identity(ir_indices, self.nest_vars):
            return self.frag_bind[bid]
        if isinstance(lay, ReplicatedLayout):
            return ravel(indices, list(lay.shape))
        if isinstance(lay, self.rows_layouts) and self.frag_row is not None and \
                ir_indices is not None and is_identity(ir_indices, self.nest_vars[:1]):
            anchor, idx = self.frag_row  # m[i] over the anchor's row i: same thread
            if anchor.rows() == lay:
                return anchor.row_slot(idx)
        column = self.stacked_column(bid, indices, ir_indices)
        if column is not None:
            return lay.slot(*column)
        if self.nest_slot is not None and ir_indices is not None and \
                len(self.nest_vars) == 2 and is_identity(ir_indices, self.nest_vars[1:]):
            anchor, idx = self.nest_slot  # v[j] over the anchor's column j: same thread
            if cols_of(anchor) == lay:
                return anchor.col_slot(idx)
        raise CompileError(f"fragment {self.buffers[bid].name} is spread over threads here; "
                           "it can only be indexed by the variables of its T.Parallel loop")

    def stacked_column(self, bid: int, indices: list, ir_indices):
        """(row k, the nest's slot) of X[k, i] read over a vector of the columns a stacked X
        is laid out on (the anchor of the T.Parallel nest over i), else None."""
        lay = self.layouts[bid]
        if not isinstance(lay, StackedLayout) or self.nest_slot is None or \
                ir_indices is None or len(self.nest_vars) != 1 or \
                not column_read(ir_indices, self.nest_vars, lay.shape, lay.shape[1:]):
            return None
        anchor, idx = self.nest_slot
        return (indices[0], idx) if anchor == lay.inner else None

    def access(self, bid: int, indices: list, ir_indices=None):
        """(TIR buffer, TIR indices) of a logical element access."""
        scope = self.buffers[bid].scope
        if scope == pb.SHARED:
            return self.tir[bid], self.shared_index(bid, indices)
        if scope == pb.FRAGMENT:
            return self.tir[bid], [self.frag_slot(bid, indices, ir_indices)]
        if bid in self.lane_index:  # a scalar local, one element per vector lane (parallel.py)
            return self.tir[bid], [self.lane_index[bid]]
        return self.tir[bid], indices

    def load(self, bid, indices, ir_indices=None):
        if self.buffers[bid].scope == pb.FRAGMENT:
            column = self.stacked_column(bid, indices, ir_indices)
            if column is not None:
                return self.layouts[bid].read(self.tir[bid], *column)
        buf, idx = self.access(bid, indices, ir_indices)
        return buf[tuple(idx)]

    @contextlib.contextmanager
    def bound(self, values: dict):
        """Program variables bound to the TIR values `values` (var id -> value) inside the
        block (an expression evaluated at given points); the earlier bindings after it."""
        saved = {v: self.vars.get(v) for v in values}
        self.vars.update(values)
        try:
            yield
        finally:
            for v, old in saved.items():
                if old is None:
                    self.vars.pop(v, None)
                else:
                    self.vars[v] = old

    def expr(self, e):
        if e.WhichOneof("kind") == "call" and e.call.op == pb.EXP2 and \
                dtypes.canonical_name(e.dtype) == "float32":
            return T.call_extern("float32", "tiled::exp2_approx", self.expr(e.call.args[0]))
        if e.WhichOneof("kind") == "load":
            return self.load(e.load.buffer, [self.expr(i) for i in e.load.indices],
                             list(e.load.indices))
        return super().expr(e)

    def store(self, bid, value, indices, ir_indices=None):
        buf, idx = self.access(bid, indices, ir_indices)
        if str(value.ty) != buf.dtype:
            value = tirx.Cast(buf.dtype, value)
        T.buffer_store(buf, value, idx)

    def addr(self, bid: int, indices: list):
        buf, idx = self.access(bid, indices)
        return T.address_of(buf[tuple(idx)])

