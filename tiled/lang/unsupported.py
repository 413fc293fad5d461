"""TileLang names tiled lacks: `tiled.lang`'s module `__getattr__`.

A TileLang spelling of something tiled has under another name (`T.Serial`, `T.float`) answers
with that thing. A TileLang feature the Tile IR cannot express answers with an object that
raises a located KernelDefinitionError ("TileLang feature T.X is not supported by tiled: why,
and what to write instead") where the author uses it: called, subscripted, or read further
(`T.WSRole.PRODUCER`), so a kernel that merely mentions one in an untaken branch still traces.
Any other unknown name is an AttributeError that suggests the nearest known names.
"""

from __future__ import annotations

import difflib
import os
import sys

from tiled.lang.builder import definition_error, user_frame

_TILED_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# TileLang spellings of what tiled has: name -> tiled.lang attribute.
ALIASES = {
    "Serial": "serial", "Unroll": "unroll", "bool": "bool_", "float": "float32",
    "half": "float16", "double": "float64", "int": "int32", "Cast": "cast",
}

_THREADS = ("tiled's tile operations are block-collective and the Tile IR has no thread "
            "index; write per-element work as a T.Parallel loop and use T.reduce_* for "
            "cross-thread reductions")
_SYNC = ("tiled places the synchronization and picks the instructions itself; write the "
         "data movement as T.copy and the math as T.gemm / T.Parallel")
_WS = ("TileLang's warp-specialization schedule API has no Tile IR form; schedule by hand with "
       "`with T.ws(group, regs=...)` and T.alloc_barrier / T.mbarrier_*, or let tiled "
       "warp-specialize a T.Pipelined loop on cuda:sm_90a")
_POINTERS = ("the Tile IR addresses buffers by index only (no pointers, views or buffer "
             "reinterpretation; T.reinterpret reads one value's bits as another dtype); pass "
             "the data as another T.Tensor parameter")
_SM100 = "tiled targets cuda:sm_80 and cuda:sm_90a; Blackwell tensor memory and tcgen05 are not"
_CLUSTER = "thread-block clusters have no Tile IR form; launch independent blocks"
_DTYPE = ("the Tile IR has no such dtype (it has bool, int8..int64, uint8..uint64, float16, "
          "bfloat16, float32, float64, float8_e4m3, float8_e5m2)")
_EAGER = ("TileLang's eager @tilelang.jit style (T.const shapes, T.empty outputs) is not "
          "tiled's: write a @T.prim_func with T.Tensor parameters (T.dyn for sizes known at "
          "launch) and compile it with tiled.jit(out_idx=[...])")
_EXTERN = "the daemon compiles Tile IR only and runs no code a request carries"
_ATOMICS = "write one T.atomic_add per element"
_REDUCER = "reduce with T.reduce_* into a fragment, or T.atomic_add into a global tensor"
_OPERATOR = "write it with Python's operator: {}"

UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys((
        "get_thread_binding", "get_thread_bindings", "get_thread_extent", "get_thread_extents",
        "thread_binding", "get_lane_idx", "get_warp_idx", "get_warp_idx_sync", "shfl_sync",
        "shfl_xor", "shfl_down", "shfl_up", "tvm_warp_shuffle", "any_sync", "all_sync",
        "ballot", "ballot_sync", "activemask", "syncthreads_and", "syncthreads_or",
        "syncthreads_count", "warp_reduce_sum", "warp_reduce_max", "warp_reduce_min",
        "warp_reduce_bitand", "warp_reduce_bitor", "tvm_thread_allreduce"), _THREADS),
    **dict.fromkeys((
        "sync_threads", "sync_warp", "sync_global", "sync_grid", "barrier_arrive",
        "barrier_wait", "cp_async_barrier_noinc", "ptx_cp_async", "ptx_commit_group",
        "ptx_wait_group", "wait_wgmma", "wgmma_gemm", "async_copy", "mma_gemm_blockscaled"),
        _SYNC),
    **dict.fromkeys((
        "WSSync", "WSID", "WSPipeline", "WSRole", "WSScope", "WSSchedule", "WSInstr", "WSOpRef",
        "WSSyncKind", "annotate_ws_schedule", "ws_op", "set_max_nreg", "no_set_max_nreg",
        "disable_warp_group_reg_alloc", "annotate_producer_reg_dealloc",
        "annotate_consumer_reg_alloc"), _WS),
    **dict.fromkeys((
        "access_ptr", "ptr", "make_tensor", "make_tensor_from_addr", "view",
        "reshape", "StridedTensor", "address_of"), _POINTERS),
    **dict.fromkeys((
        "alloc_tmem", "tcgen05_gemm", "tcgen05_gemm_blockscaled", "tcgen05_mma_arrive",
        "tcgen05_cp_warpx4", "tcgen05_sf_warp_transpose"), _SM100),
    **dict.fromkeys((
        "ClusterKernel", "alloc_cluster_barrier", "block_rank_in_cluster",
        "clc_try_cancel_multicast", "clc_is_canceled", "clc_get_first_ctaid_x"), _CLUSTER),
    **dict.fromkeys((
        "float4_e2m1fn", "float4_e2m1_unpacked", "int4", "uint4", "tfloat32",
        "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fnuz",
        "float8_e5m2fnuz"), _DTYPE),
    **dict.fromkeys(("const", "empty"), _EAGER),
    **dict.fromkeys(("call_extern", "import_source", "evaluate", "attr", "call_intrin",
                     "call_packed"), _EXTERN),
    **dict.fromkeys(("atomic_addx2", "atomic_addx4", "atomic_load", "atomic_store",
                     "atomic_or"), _ATOMICS),
    **dict.fromkeys(("alloc_reducer", "finalize_reducer", "reducer_init", "reducer_update",
                     "comm_reducer"), _REDUCER),
    "alloc_global": "global workspaces are not allocated by kernels; pass a T.Tensor parameter",
    "get_block_binding": "use the targets of `with T.Kernel(...) as (bx, by)`",
    "get_block_bindings": "use the targets of `with T.Kernel(...) as (bx, by)`",
    "Persistent": "persistent scheduling has no Tile IR form; launch one block per tile",
    "PersistentTileScheduler": "persistent scheduling has no Tile IR form; launch one block "
                               "per tile",
    "loop_break": "tiled loops always run to their extent; guard the rest of the body with an if",
    "gemm_sp": "structured-sparse gemm has no Tile IR form; use T.gemm on dense tiles",
    "dp4a": "multiply int8 elements in a T.Parallel loop, or T.gemm on int8 tiles",
    "rng_init": "random numbers have no Tile IR form; pass them in as a tensor",
    "rng_rand": "random numbers have no Tile IR form; pass them in as a tensor",
    "device_assert": "device-side asserts have no Tile IR form; check on the host",
    "print": "device-side printing has no Tile IR form; copy the value to an output tensor",
    "assume": "the Tile IR carries no assumptions; tiled's guards keep accesses in bounds",
    "annotate_safe_value": "tiled guards global accesses itself; tails read as 0",
    "annotate_restrict_buffers": "tiled's tensor parameters never alias in its generated code",
    "index_to_coordinates": _OPERATOR.format("`i // n` and `i % n`"),
    "floordiv": _OPERATOR.format("`a // b`"), "floormod": _OPERATOR.format("`a % b`"),
    "truncdiv": _OPERATOR.format("`a // b` on non-negative values"),
    "shift_left": _OPERATOR.format("`a << b`"), "shift_right": _OPERATOR.format("`a >> b`"),
    "bitwise_and": _OPERATOR.format("`a & b`"), "bitwise_or": _OPERATOR.format("`a | b`"),
    "bitwise_xor": _OPERATOR.format("`a ^ b`"), "Select": "use T.if_then_else(cond, a, b)",
    "inline": "call a @T.macro, or a plain Python function, instead",
    "Ref": "a @T.macro takes its arguments as they are: pass the buffer (or T.alloc_var) and "
           "the indices, and assign through them",
    "mbarrier_arrive_expect_tx": "write T.mbarrier_expect_tx(bar, nbytes), then "
                                 "T.mbarrier_arrive(bar)",
}


class Unsupported:
    """Stands for TileLang feature T.<name>; any use raises the located error."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def error(self):
        # The author's frame: a dtype object is read inside tiled.ir too (dtypes.canonical_name).
        frame = sys._getframe(1)
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
                _TILED_DIR + os.sep):
            frame = frame.f_back
        return definition_error(
            f"TileLang feature T.{self._name} is not supported by tiled: {self._why}",
            frame or user_frame())

    def __call__(self, *args, **kwargs):
        raise self.error()

    def __getitem__(self, key):
        raise self.error()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self.error()

    def __repr__(self):
        return f"<TileLang feature T.{self._name}, not supported by tiled>"


def module_getattr(module, name: str):
    """`tiled.lang.<name>` for a name the module does not define."""
    if name in ALIASES:
        return getattr(module, ALIASES[name])
    if name in UNSUPPORTED:
        return Unsupported(name, UNSUPPORTED[name])
    known = [n for n in dir(module) if not n.startswith("_")]
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join('T.' + c for c in close)}?" if close else ""
    raise AttributeError(f"module 'tiled.lang' has no attribute {name!r}{hint}")
