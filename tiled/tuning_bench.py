"""What tiled.autotune does to its candidates: compile them in parallel, then check and time
them on the caller's device. Split from tiled.tuning (the choosing and the record)."""

from __future__ import annotations

import logging
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from tiled import config, tuning_prebuilt
from tiled.runtime.cpu_levels import is_cpu_target

log = logging.getLogger("tiled.autotune")

L2_FLUSH_BYTES = 256 << 20  # what triton.testing.do_bench zeroes before each timed run
COMPILE_TIMEOUT_S = 600.0


def compile_all(cands, target: str, progress) -> None:
    """Sets each candidate's `compiled` (with its own compile `options`), or `skipped` with
    the compile's error. With a daemon configured its compile requests go out together (the
    daemon's pool runs them side by side); else the cache misses compile in a local pool of
    worker processes first."""
    if not config.get("server") and not tuning_prebuilt.active() and len(cands) > 1:
        _precompile_locally(cands, target)
    done = [0]
    settings = {name: config.get(name) for name in config.SETTINGS}  # for the threads

    def one(c):
        try:
            with config.override(**settings):
                c.compiled = tuning_prebuilt.compile_candidate(c.kernel_ir, target, c.options)
        except Exception as e:  # a candidate that does not compile is skipped
            c.skipped = f"compile failed: {type(e).__name__}: {e}"
        done[0] += 1
        progress.update("compiled", done[0])

    for c in cands:
        c.kernel_ir = tuning_prebuilt.kernel_of(c.kernel)
    if not config.get("server"):  # cache hits (or prebuilt) now: in this thread
        for c in cands:
            one(c)
        return
    with ThreadPoolExecutor(max_workers=min(len(cands), 16)) as ex:
        list(ex.map(one, cands))


def _precompile_locally(cands, target: str) -> None:
    """Compiles the candidates the local cache lacks in worker processes (tiled.server.pool:
    each its own process group, time-limited) and stores them, so that the serial
    tiled.compile after is a cache hit. A failure here is left for that compile to report."""
    from tiled.cache.tiered import default_cache
    from tiled.compiler.action import action_of
    from tiled.compiler.registry import parse_target
    from tiled.errors import CacheWriteError
    from tiled.ir import verify
    from tiled.ir.program import as_program
    from tiled.server.pool import CompilePool
    from tiled.server.worker import COMPILE_JOB, compile_payload, compiled_entry

    cache, tgt = default_cache(), parse_target(target)
    misses = {}  # action key -> (program, action, options): a candidate compiled once
    for c in cands:
        try:
            program = as_program(c.kernel_ir)
            verify(program)
            action = action_of(program.digest, tgt, c.options)
        except Exception:  # reported by the serial compile
            continue
        if not cache.contains(action.hex):
            misses.setdefault(action.hex, (program, action, c.options))
    if len(misses) < 2:
        return
    workers = min(len(misses), len(os.sched_getaffinity(0)))
    pool = CompilePool(workers=workers, timeout_s=COMPILE_TIMEOUT_S)
    try:
        jobs = [(action, pool.submit(action.hex, COMPILE_JOB, compile_payload(
            program, tgt, options, action.record))) for program, action, options in
            misses.values()]
        for action, job in jobs:
            try:
                entry, _ = compiled_entry(action.hex, job.result())
            except Exception as e:
                log.info("autotune: a candidate failed in the compile pool: %s", e)
                continue
            try:
                cache.put(entry)
            except CacheWriteError as e:
                log.warning("autotune: could not store a compiled candidate: %s", e)
    finally:
        pool.shutdown()


def check_and_time(cands, bound, target: str, tuner, progress) -> None:
    """Runs every compiled candidate on the same inputs, skips those whose outputs differ from
    the first correct one's, and times the rest (`us`)."""
    live = [c for c in cands if c.skipped is None]
    run = tuner.run or (lambda kernel, config, args: kernel(*args))
    ref = None
    for i, c in enumerate(live):
        # Each candidate's own arguments (configs may differ in an output's dtype), the same
        # values for all: `inputs` seeds its own generator, random_inputs always seeds 0.
        try:
            pristine = (list(tuner.inputs(*bound.args, **{**bound.kwargs, **c.kwargs}))
                        if tuner.inputs else random_inputs(c.compiled.manifest, target))
        except Exception as e:  # no inputs for it: it cannot be checked, so not chosen
            c.skipped = f"no inputs: {type(e).__name__}: {e}"
            continue
        args = [_clone(a) for a in pristine]

        def launch(c=c, args=args):
            run(c.compiled, c.config, args)
        try:
            launch()
            _sync(target)
        except Exception as e:  # a launch that fails skips the candidate
            c.skipped = f"launch failed: {type(e).__name__}: {e}"
            continue
        if ref is None:
            # The first correct candidate's outputs, told from its inputs by what it changed,
            # stay where they are (the GPU): a weight is never copied to the host.
            changed = {j: a for j, (a, p) in enumerate(zip(args, pristine, strict=True))
                       if _is_array(a) and not _equal(a, p)}
            if any(_has_nan(a) and not _has_nan(pristine[j]) for j, a in changed.items()):
                c.skipped = "its outputs hold NaN"
                continue
            ref = changed
        else:
            problem = _differs(args, pristine, ref, tuner.tolerance)
            if problem:
                c.skipped = f"wrong result: {problem} (against the first correct config)"
                continue
        c.us = _time(launch, target, tuner.warmup_ms, tuner.rep_ms)
        progress.update("timed", i + 1)


def random_inputs(manifest, target: str) -> list:
    """Arguments for a kernel from its manifest: random tensors of the params' shapes and
    dtypes (torch on the target's device when torch is there, else numpy on cpu)."""
    import numpy as np

    try:
        import torch
    except ImportError:
        torch = None
    if not is_cpu_target(target) and torch is None:
        raise ValueError("timing on a GPU needs torch")
    rng = np.random.default_rng(0)
    out = []
    for p in manifest.params:
        if p.kind != "tensor":
            raise ValueError(f"{manifest.name}: scalar parameter {p.name}: pass inputs= to "
                             "tiled.autotune")
        if any(isinstance(d, str) for d in p.shape):
            raise ValueError(f"{manifest.name}: {p.name} has symbolic dims {list(p.shape)}: "
                             "pass inputs= to tiled.autotune")
        shape = tuple(p.shape)
        if p.dtype.startswith(("int", "uint")):
            lo = 0 if p.dtype.startswith("u") else -8
            data = rng.integers(lo, 8, size=shape)
        elif p.dtype == "bool":
            data = rng.integers(0, 2, size=shape).astype(bool)
        else:
            data = rng.standard_normal(shape).astype(np.float32)
        if torch is not None:
            from tiled.jit import _torch_dtype

            t = torch.from_numpy(np.ascontiguousarray(data))
            out.append(t.to(device="cpu" if is_cpu_target(target) else "cuda",
                            dtype=_torch_dtype(torch, p.dtype)))
        else:
            from tiled.jit import _numpy_dtype

            out.append(data.astype(_numpy_dtype(np, p.dtype)))
    return out


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch")


def _clone(a):
    if _is_torch(a):
        return a.clone()
    return a.copy() if hasattr(a, "copy") else a


def _is_array(a) -> bool:
    return _is_torch(a) or (hasattr(a, "dtype") and hasattr(a, "shape"))


def _equal(a, b) -> bool:
    if _is_torch(a):
        import torch

        return bool(torch.equal(a, b))
    import numpy as np

    return bool(np.array_equal(a, b))


def _has_nan(a) -> bool:
    if _is_torch(a):
        import torch

        return a.is_floating_point() and bool(torch.isnan(a).any())
    import numpy as np

    return np.issubdtype(a.dtype, np.floating) and bool(np.isnan(a).any())


def _rel_err(o, r) -> float:
    """||o - r|| / ||r|| in float64, NaNs as zeros, where the arrays live."""
    if _is_torch(o):
        import torch

        o, r = torch.nan_to_num(o.double()), torch.nan_to_num(r.double())
        return float(torch.linalg.vector_norm(o - r)) / (float(torch.linalg.vector_norm(r))
                                                           or 1.0)
    import numpy as np

    o, r = np.nan_to_num(o.astype(np.float64)), np.nan_to_num(r.astype(np.float64))
    return float(np.linalg.norm(o - r)) / (float(np.linalg.norm(r)) or 1.0)


def _differs(args, pristine, ref: dict, tolerance: float | None) -> str | None:
    """What is wrong with a candidate's arguments after its run, against the reference's
    outputs `ref` (argument index -> array): None when nothing is."""
    tol = tolerance if tolerance is not None else 2e-2
    for i, (a, p) in enumerate(zip(args, pristine, strict=True)):
        if not _is_array(a):
            continue
        if i not in ref:
            if not _equal(a, p):
                return f"it wrote argument {i}, which the reference left as it was"
            continue
        if _has_nan(a) != _has_nan(ref[i]):
            return f"argument {i} holds NaN where the reference does not (or not)"
        err = _rel_err(a, ref[i])
        if err > tol:
            return f"argument {i} relative error {err:.2e} > {tol:.0e}"
    return None


def _sync(target: str) -> None:
    if not is_cpu_target(target):
        import torch

        torch.cuda.synchronize()


def _time(fn, target: str, warmup_ms: float, rep_ms: float) -> float:
    """Median microseconds of one call: warm-up for about `warmup_ms`, then runs for about
    `rep_ms` (at least 5), each after an L2 flush on CUDA (there replayed from a CUDA graph
    where fn can be captured: _graph_time)."""
    if is_cpu_target(target):
        fn()
        t0 = time.perf_counter()
        fn()
        est = max(time.perf_counter() - t0, 1e-7)
        for _ in range(max(1, int(warmup_ms / 1e3 / est))):
            fn()
        samples = []
        for _ in range(max(5, int(rep_ms / 1e3 / est))):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples) * 1e6
    import torch

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    graphed = _graph_time(torch, fn, flush[:GRAPH_FLUSH_BYTES], warmup_ms, rep_ms)
    if graphed is not None:
        return graphed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-4)  # ms, flush included
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(5, int(rep_ms / est))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3


GRAPH_CALLS = 10
GRAPH_FLUSH_BYTES = 64 << 20  # more than an H100 / H200 L2 (50 MiB), a quarter of the noise


def _graph_time(torch, fn, flush, warmup_ms: float, rep_ms: float) -> float | None:
    """Microseconds of one call as the device runs it, without the host's launch cost (which
    for a kernel of a few microseconds is most of an event-timed call, and differs with how
    many launches a candidate's `run` makes): GRAPH_CALLS x (L2 flush, fn) captured in a CUDA
    graph, less a graph of the flushes alone, the median over replays. None when fn cannot be
    captured (it synchronizes, or compiles)."""
    def capture(body):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(GRAPH_CALLS):
                body()
        return g

    def flush_only():
        flush.zero_()

    def flush_and_call():
        flush.zero_()
        fn()

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graphs = [capture(flush_only), capture(flush_and_call)]
    except Exception as e:  # not capturable: the caller times it launch by launch
        log.debug("autotune: timing without a CUDA graph: %s", e)
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay_ms(g) -> float:
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    est = max(replay_ms(graphs[1]), 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        graphs[1].replay()
    diffs = []
    for _ in range(max(5, int(rep_ms / est))):
        base, with_fn = replay_ms(graphs[0]), replay_ms(graphs[1])
        diffs.append(max(with_fn - base, 0.0) / GRAPH_CALLS)
    return statistics.median(diffs) * 1e3
