"""Compile stage timing shared by every backend: a backend wraps each part of its compile in
`timed(stage)`, and `compile_program` collects the seconds per stage for the manifest-free
`CompiledKernel.stages`, which the daemon exports as tiled_compile_duration_seconds{stage}.

    with timed("lower"):
        mod = lower(program)
        with timed("codegen"):       # nested: its seconds are not also counted as "lower"
            ex = tvm.compile(mod)

Times are exclusive: a stage nested in another is subtracted from the outer one, so the stages
of one compile add up to its wall time. Outside `recording()` `timed` measures nothing. State
is per thread (compiles run in worker processes, or in a caller's thread in process)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

STAGES = ("verify", "lower", "codegen", "toolchain", "store")
_local = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[dict[str, float]]:
    """A dict that fills with {stage: seconds} from the `timed` blocks run inside this one."""
    outer = getattr(_local, "record", None), getattr(_local, "stack", [])
    _local.record, _local.stack = {}, []
    try:
        yield _local.record
    finally:
        _local.record, _local.stack = outer


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Adds this block's own seconds (nested `timed` blocks excluded) to `stage`. Raises
    ValueError for a stage outside STAGES: the metric's label set is fixed."""
    if stage not in STAGES:
        raise ValueError(f"compile stage {stage!r} is not one of {STAGES}")
    record = getattr(_local, "record", None)
    if record is None:
        yield
        return
    frame = [time.perf_counter(), 0.0]  # start, seconds spent in nested stages
    _local.stack.append(frame)
    try:
        yield
    finally:
        _local.stack.pop()
        spent = time.perf_counter() - frame[0]
        record[stage] = record.get(stage, 0.0) + spent - frame[1]
        if _local.stack:
            _local.stack[-1][1] += spent
