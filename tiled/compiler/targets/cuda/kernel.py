"""The CUDA kernel as a TIR PrimFunc: its parameters (the program's and the TMA descriptors
the sm_90a paths take), the launch (the program's grid, or a persistent walk), the shared
pool and fragments, then the body as its path lowers it (lower.CudaLowering: the statement
walk; the whole-kernel sm_90a paths; the T.Pipelined ring of ws_loop.py)."""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.passes.fold import fold_cast_stores
from tiled.compiler.passes.staging import stage_fragment_operands, unstage_register_operands
from tiled.compiler.targets.cuda.lower import CudaLowering
from tiled.compiler.targets.cuda.sm90_attn import find_ws_attention, lower_attn_kernel, tmap_params
from tiled.compiler.targets.cuda.ws_plan import (
    alternate_choice,
    longest_first,
    persistent_choice,
)
from tiled.compiler.tir import declare_params, source_name, tvm_dtype
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.v1 import tile_ir_pb2 as pb


def lower_cuda(program: Program, arch: str = "sm_80", warp_specialize: bool = True,
               lowering: type | None = None,
               pingpong: bool = False, wgmma_in_flight: bool = True,
               persistent: int = 0, whole_kernel: bool = True, ring_tables: int = 0,
               alternate: int = 0) -> tuple[object, CudaLowering]:
    """Returns (IRModule, the lowering) for `program`; the lowering holds the pool size, the
    launch's thread count and the TMA descriptors the kernel takes (sm_90a path).
    `lowering`: the CudaLowering class (the backend passes sm90_explicit's ExplicitLowering
    for programs of the explicit Hopper path; this module does not import it). `pingpong`:
    whether a T.Pipelined ring's two consumer warpgroups may take turns over two or more
    gemms (a ring of one gemm rebuilt every step takes them regardless; ws_loop.py);
    `wgmma_in_flight`: whether its wgmma gemms may run past their statement
    (wgmma_waits.py); `persistent`: whether its blocks walk the grid (0 the plan's choice,
    1 off, 2 on; ws_loop.persistent_choice); `whole_kernel`: whether the whole-kernel
    attention path (sm90_attn) may take the kernel it recognizes; `ring_tables`: which
    loops reading a tile table may be fed by a TMA producer (0 those whose gemms all take
    wgmma, 1 none, 2 all; ws_plan.plan_ws_loop, passes/pipeline.run_ahead); `alternate`:
    whether a second consumer warpgroup runs every other program block of the walk (0 the
    plan's choice, 1 off, 2 where it applies; ws_plan.alternate_choice)."""
    import tvm

    if lowering is None and arch == "sm_90a" and warp_specialize:
        program = fold_cast_stores(stage_fragment_operands(program))
        if not (whole_kernel and find_ws_attention(program.proto)):  # it reads P from shared
            program = unstage_register_operands(program)
    p = program.proto
    low = lowering(program, arch, warp_specialize) if lowering else \
        CudaLowering(program, arch, warp_specialize, whole_kernel, ring_tables)
    if low.wsloop is not None:
        low.wsloop.pingpong &= pingpong or low.wsloop.rebuilt
        low.wsloop.in_flight = wgmma_in_flight
        low.wsloop.persistent = persistent_choice(low, persistent)
    low.plan()
    if low.wsloop is not None and alternate_choice(low, alternate):
        low.wsloop.groups = 2
        low.launch_threads = 2 * low.threads + low.wsloop.producer_threads
        low.sync = low.block_sync()
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(p.name)
            T.func_attr({"tirx.noalias": True, "global_symbol": p.name})
            for bid, buf in declare_params(program, low).items():
                low.tir[bid] = buf
            attn_maps = {}
            if low.attn is not None:
                for key, name, recipe in tmap_params(low):
                    attn_maps[key] = T.arg(name, T.handle())
                    low.tensor_maps[name] = recipe
            low.declare_tensor_maps()
            grid = [low.expr(g) for g in p.kernel.grid]
            frames = contextlib.ExitStack()
            with frames:
                if not (low.attn and low.attn.persistent) and \
                        not (low.wsloop and low.wsloop.persistent):
                    backwards = longest_first(low, grid) if low.wsloop else None
                    for i, (g, vid) in enumerate(zip(grid, p.kernel.block_vars, strict=True)):
                        bv = T.env_thread(("blockIdx.x", "blockIdx.y", "blockIdx.z")[i])
                        frames.enter_context(T.launch_thread(bv, g))
                        low.vars[vid] = g - 1 - bv if i == backwards else bv
                else:  # persistent: one block per SM at most, walking the program's blocks
                    bv = T.env_thread("blockIdx.x")
                    # The real count, min(blocks, SMs), is known only at launch (the runtime
                    # binds tiled_sm_count); TVM needs only an upper bound here.
                    frames.enter_context(T.launch_thread(bv, tirx.const(2**31 - 1, "int32")))
                    low.block_x = bv
                tx = T.env_thread("threadIdx.x")
                frames.enter_context(T.launch_thread(tx, low.launch_threads))
                low.tx = tx
                if low.pool_bytes:
                    low.pool = T.alloc_buffer((low.pool_bytes,), "uint8", scope=low.pool_scope)
                for b in p.buffers:
                    if b.scope == pb.SHARED and b.id not in low.shared:
                        continue  # a ring tile of the sm90 path: only TMA and wgmma see it
                    if b.id in low.wgmma_ops.panels:
                        tile = low.shared[b.id]
                        low.tir[b.id] = T.decl_buffer(
                            (tile.stages * tile.rows * tile.stride,), tvm_dtype(b.dtype),
                            data=low.pool.data,
                            elem_offset=tile.offset // dtypes.nbytes(b.dtype))
                    elif b.scope == pb.SHARED:
                        tile = low.shared[b.id]
                        low.tir[b.id] = T.decl_buffer(
                            (tile.stages * tile.rows, tile.stride), tvm_dtype(b.dtype),
                            data=low.pool.data,
                            elem_offset=tile.offset // dtypes.nbytes(b.dtype))
                    elif b.scope == pb.FRAGMENT:
                        lay = low.layouts[b.id]  # (Metal's resident accumulator: simdgroup)
                        low.tir[b.id] = source_name(b, T.alloc_buffer(
                            (lay.local_size,), tvm_dtype(b.dtype),
                            scope=getattr(lay, "scope", "local")))
                    elif b.scope == pb.LOCAL:
                        low.tir[b.id] = source_name(b, T.alloc_buffer(
                            [d.size for d in b.shape], tvm_dtype(b.dtype), scope="local"))
                if low.wgmma_ops:
                    T.evaluate(T.call_extern("void", "tiled::sm90::check_panel_pool",
                                             T.address_of(low.pool[0])))
                if low.attn is not None:
                    lower_attn_kernel(low, attn_maps, grid)
                else:
                    low.lower_body()
    return tvm.IRModule({p.name: ib.get()}), low
