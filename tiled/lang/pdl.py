"""Programmatic dependent launch (TileLang's T.pdl_sync / T.pdl_trigger): a kernel that holds a
T.pdl_sync() may start while the kernels before it in its stream are still running, and waits
for them where the statement stands. What comes before it may only touch memory those kernels
neither write nor read (its own scratch, weights, tables): loading a weight tile, setting up
barriers. T.pdl_trigger() lets the next kernel start early; it changes no value, only when the
next kernel's blocks may be scheduled.

On CUDA sm_90 and newer they are griddepcontrol.wait / griddepcontrol.launch_dependents, and the
runtime launches a kernel holding a T.pdl_sync() with programmatic stream serialization (also
inside a captured CUDA graph). Elsewhere (older GPUs, ROCm, Metal, CPU) kernels start in stream
order and both do nothing.
"""

from __future__ import annotations

from tiled.lang.builder import current
from tiled.v1 import tile_ir_pb2 as pb


def _emit(trigger: bool) -> None:
    stmt = pb.Stmt()
    stmt.grid_dependency.trigger = trigger
    current().emit(stmt)


def pdl_sync() -> None:
    """Waits until the kernels before this one in its stream have finished and their writes are
    visible. Every thread of the block runs it; place it before the first access of anything
    those kernels write or read.

    >>> T.pdl_sync()
    """
    _emit(False)


def pdl_trigger() -> None:
    """Lets the kernels after this one in its stream start launching (each still waits at its
    own T.pdl_sync until this kernel has finished). `T.pdl_trigger()`"""
    _emit(True)
