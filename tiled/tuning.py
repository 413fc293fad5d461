"""`tiled.autotune` (this module, tiled.tuning): picks the fastest of a kernel factory's
configs per shape, once.

    @tiled.autotune(configs=[{"block_M": 128, "block_N": 256}, {"block_M": 64, ...}],
                    key=["M", "N", "K"])
    def matmul(M, N, K, block_M=128, block_N=128):
        @T.prim_func
        def gemm(...): ...
        return gemm

    kernel = matmul(4096, 4096, 4096)   # tuned on the first call for this key, then recorded
    kernel(a, b, c)

The factory returns a kernel (`@tiled.kernel` / `@T.prim_func`) or a `tiled.jit` kernel; a
call binds the factory's arguments, and the values of the `key` arguments (through `bucket`,
when given: a function of them returning the representative values a bucket is tuned at)
name the tuning. On the first call for a key:

1. every config's kernel is built at the key's (representative) shape; a factory that raises
   for a config skips it, logged with the reason;
2. the candidates compile in parallel: with TILED_SERVER set, through the daemon (their
   requests sent together; its pool runs them side by side), else in a local pool of compile
   worker processes (tiled.server.pool), into the kernel cache;
3. each runs on the same inputs (random, from the kernel's signature, or `inputs(*args,
   **config)`: each config's arguments, the same values) on the caller's device; one whose
   outputs differ from the first correct candidate's (relative error above `tolerance`),
   that makes NaNs, or that fails to compile or launch is skipped, logged with the reason,
   never chosen;
4. the others are timed as triton.testing.do_bench times (warm-up, then the median of
   `rep_ms` worth of runs, the L2 flushed before each run on CUDA, where the runs are
   replayed from a CUDA graph so the host's launch cost is not counted); `run(kernel, config,
   args)`, when given, is how the caller runs a candidate (its checks and timings then
   count what the caller does around the kernel: a workspace allocated for split-K, the
   kernel that sums its partials), else `kernel(*args)`;
5. the winner is recorded in the kernel cache under a tuning key: the digest of the
   candidates' programs (the template), the key's bucket, the device's name and SM count
   (CPU: model and cores), the toolchain and the cache namespace. The record is a cache entry
   like a compile's (the winner's manifest, its `notes` holding the record and the config,
   and its artifact), so it reaches other processes and, through Redis, other hosts, which
   reuse it without timing anything.

A config may also carry compile options for its candidate under the key "compile_options"
(`{"BM": 128, "compile_options": {"alternate": 1}}`): they go over the decorator's own
options when that candidate compiles, are not passed to the factory, and are part of the
config the record names, so one factory's kernel built two ways competes as two candidates.

TILED_AUTOTUNE=on (default) tunes on a miss; `cached` uses a recorded winner or else the
first config, never timing; `off` always takes the first config. `STATS` counts what
happened in this process (tunings, candidates timed, record hits), for tests and benchmarks.

Thin at import: neither TVM nor torch is imported until a call needs them.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tiled import config, tuning_record
from tiled.tuning_prebuilt import PrebuiltKernel, attach, compile_candidate, kernel_of, prebuilt
from tiled.tuning_record import device_identity

log = logging.getLogger("tiled.autotune")

OPTIONS_KEY = "compile_options"  # a config's own compile options (module docstring)

STATS = {"tunings": 0, "candidates_timed": 0, "record_hits": 0, "first_config": 0}
_STATS_LOCK = threading.Lock()


def _count(name: str, n: int = 1) -> None:
    with _STATS_LOCK:
        STATS[name] += n


@dataclass
class Candidate:
    index: int
    config: dict
    options: dict = field(default_factory=dict)  # its compile options: the decorator's + its own
    kernel: Any = None  # the factory's result
    kernel_ir: Any = None  # the @tiled.kernel in it
    compiled: Any = None
    us: float | None = None
    skipped: str | None = None  # why it was not chosen

    @property
    def kwargs(self) -> dict:
        return factory_kwargs(self.config)


def factory_kwargs(cfg: Mapping[str, Any]) -> dict:
    """The factory's keyword arguments in config `cfg`: all but its compile options."""
    return {k: v for k, v in cfg.items() if k != OPTIONS_KEY}


@dataclass
class Tuned:
    """The factory's result for the chosen config, compiled for `target`. Calling it launches
    the compiled kernel (a `tiled.jit` result: TileLang's convention, outputs allocated and
    returned)."""

    config: dict
    kernel: Any
    compiled: Any
    target: str
    from_record: bool  # the choice came from a recorded tuning (no timing in this call)
    candidates: list[Candidate] = field(default_factory=list)  # empty unless tuned here

    def __call__(self, *args, **kwargs):
        from tiled.jit import JitKernel

        if isinstance(self.kernel, JitKernel):
            return self.kernel(*args, **kwargs)
        return self.compiled(*args, **kwargs)

    @property
    def manifest(self):
        return self.compiled.manifest


def autotune(configs: Sequence[Mapping[str, Any]] | Callable[[], Any],
             key: Sequence[str] | None = None, *,
             bucket: Callable[..., Sequence[Any]] | None = None, target: str = "auto",
             inputs: Callable[..., Sequence[Any]] | None = None, warmup_ms: float = 25.0,
             rep_ms: float = 100.0, tolerance: float | None = None,
             run: Callable[..., Any] | None = None, warmup: float | None = None,
             rep: float | None = None, **options):
    """The decorator (module docstring). `configs`: a list of keyword dicts for the factory,
    or a callable returning an iterable of them (the space). `key`: names of the factory's
    arguments that select a tuning; by default (TileLang's `@autotune(configs=...)`) every
    argument no config sets. `warmup` / `rep`: TileLang's names of warmup_ms / rep_ms.
    `options`: compile options for every candidate."""
    warmup_ms = warmup if warmup is not None else warmup_ms
    rep_ms = rep if rep is not None else rep_ms
    space = list(configs() if callable(configs) else configs)
    if not space:
        raise ValueError("tiled.autotune needs at least one config")
    for i, c in enumerate(space):
        if not isinstance(c, Mapping):
            raise TypeError(f"tiled.autotune: config #{i} is a {type(c).__name__}, not a dict")
        own = c.get(OPTIONS_KEY, {})
        if not isinstance(own, Mapping) or not all(isinstance(k, str) for k in own):
            raise TypeError(f"tiled.autotune: config #{i}'s {OPTIONS_KEY!r} is "
                            f"{type(own).__name__} {own!r}, not a dict of option names")

    def wrap(factory):
        names = list(key) if key is not None else _untuned_arguments(factory, space)
        return Autotuner(factory, [dict(c) for c in space], names, bucket, target, inputs,
                         warmup_ms, rep_ms, tolerance, options, run)
    return wrap


def _untuned_arguments(factory, space) -> list[str]:
    """The factory's arguments that no config sets: the default key."""
    tuned = {name for c in space for name in c if name != OPTIONS_KEY}
    return [p.name for p in inspect.signature(factory).parameters.values()
            if p.name not in tuned and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


class Autotuner:
    """A factory under tiled.autotune; `autotuner(*args)` returns a Tuned. Thread-safe: one
    tuning per key at a time, its result shared."""

    def __init__(self, factory, configs, key, bucket, target, inputs, warmup_ms, rep_ms,
                 tolerance, options, run=None):
        self.factory, self.configs, self.key = factory, configs, key
        self.run = run
        self.bucket, self.target, self.inputs = bucket, target, inputs
        self.warmup_ms, self.rep_ms, self.tolerance = warmup_ms, rep_ms, tolerance
        self.options = options
        self._signature = inspect.signature(factory)
        for name in key:
            if name not in self._signature.parameters:
                raise ValueError(f"tiled.autotune: key {name!r} is not an argument of "
                                 f"{factory.__name__}")
        self._choices: dict[tuple, tuple[dict, bool, list]] = {}  # per bucket
        self._tuned: dict[tuple, Tuned] = {}  # per exact call
        self._lock = threading.Lock()
        self._key_locks: dict[tuple, threading.Lock] = {}

    def __repr__(self) -> str:
        return f"<tiled.autotune {self.factory.__name__} over {len(self.configs)} configs>"

    def _bind(self, args, kwargs):
        """(the call's bound arguments, its key values, the bucket's representative values)."""
        bound = self._signature.bind_partial(*args, **kwargs)
        for name in self.key:
            if name not in bound.arguments:
                raise TypeError(f"{self.factory.__name__}: key argument {name!r} not given")
        values = tuple(bound.arguments[n] for n in self.key)
        rep = tuple(self.bucket(*values)) if self.bucket else values
        if len(rep) != len(values):
            raise ValueError(f"tiled.autotune: bucket{values} returned {len(rep)} values, "
                             f"not {len(values)}")
        return bound, values, rep

    def __call__(self, *args, **kwargs) -> Tuned:
        bound, values, rep = self._bind(args, kwargs)
        target = self._resolve_target()
        rest = _freeze(bound.arguments, self.key)
        exact = (values, target, rest)
        with self._lock:
            if exact in self._tuned:
                return self._tuned[exact]
            lock = self._key_locks.setdefault((rep, target, rest), threading.Lock())
        with lock:  # one tuning per bucket at a time; the others wait and share it
            choice = self._choices.get((rep, target, rest))
            if choice is None:
                choice = self._choices[(rep, target, rest)] = self._choose(bound, rep, target)
            cfg, from_record, candidates = choice
            tuned = self._final(bound, cfg, target, from_record)
            tuned.candidates = candidates
            with self._lock:
                self._tuned[exact] = tuned
            return tuned

    def candidate_programs(self, *args, **kwargs) -> list[tuple[int, dict, Any]]:
        """(config index, config, Program) of every config that builds at the call's bucket
        shape: what a tuning of this call compiles (`tiled warm` sends them ahead)."""
        bound, _, rep = self._bind(args, kwargs)
        return [(c.index, c.config, kernel_of(c.kernel).ir)
                for c in self._build(self._with_key(bound, rep)) if c.skipped is None]

    # -- choosing ------------------------------------------------------------------------

    def _choose(self, bound, rep, target: str) -> tuple[dict, bool, list[Candidate]]:
        """(the config, whether a record chose it, the candidates tuned here)."""
        mode = config.get("autotune")
        if mode == "off":
            return self._first("TILED_AUTOTUNE=off")
        at_rep = self._with_key(bound, rep)
        candidates = self._build(at_rep)
        built = [c for c in candidates if c.skipped is None]
        if not built:
            raise ValueError(f"tiled.autotune {self.factory.__name__}: no config builds: " +
                             "; ".join(f"#{c.index} {c.skipped}" for c in candidates))
        record, tkey = self._tuning_key(built, rep, target)
        found = self._recorded(tkey, record)
        if found is not None:
            _count("record_hits")
            return found, True, []
        if mode == "cached":
            return self._first("TILED_AUTOTUNE=cached and no recorded tuning")
        winner = self._tune(candidates, at_rep, target)
        self._record(tkey, record, winner, candidates)
        return winner.config, False, candidates

    def _first(self, why: str) -> tuple[dict, bool, list]:
        _count("first_config")
        log.info("tiled.autotune %s: first config (%s)", self.factory.__name__, why)
        return self.configs[0], False, []

    def options_of(self, cfg: Mapping[str, Any]) -> dict:
        """The compile options config `cfg`'s candidate compiles with: the decorator's, then
        the config's own (OPTIONS_KEY) over them."""
        return {**self.options, **cfg.get(OPTIONS_KEY, {})}

    def _make(self, bound, cfg: Mapping[str, Any]):
        """The factory's result for config `cfg` (its compile options left out)."""
        return self.factory(*bound.args, **{**bound.kwargs, **factory_kwargs(cfg)})

    def _final(self, bound, cfg: dict, target: str, from_record: bool) -> Tuned:
        """The factory's result for `cfg` at the call's own arguments, compiled (a cache hit
        when the call's shape is the bucket's representative)."""
        result = self._make(bound, cfg)
        kernel = kernel_of(result)
        compiled = compile_candidate(kernel, target, self.options_of(cfg))
        attach(result, target, compiled)
        return Tuned(dict(cfg), result, compiled, target, from_record)

    def _with_key(self, bound, rep):
        b = self._signature.bind_partial(*bound.args, **bound.kwargs)
        for name, v in zip(self.key, rep, strict=True):
            b.arguments[name] = v
        return b

    def _build(self, bound) -> list[Candidate]:
        out = []
        for i, cfg in enumerate(self.configs):
            c = Candidate(i, cfg, self.options_of(cfg))
            try:
                c.kernel = self._make(bound, cfg)
                kernel_of(c.kernel)
            except Exception as e:  # a config the factory refuses is skipped
                c.skipped = f"the factory raised {type(e).__name__}: {e}"
            out.append(c)
        return out

    # -- the record (tiled.tuning_record) -----------------------------------------------------

    def _tuning_key(self, built: list[Candidate], rep, target: str) -> tuple[dict, str]:
        return tuning_record.tuning_key(
            [kernel_of(c.kernel) for c in built], [c.config for c in built],
            dict(zip(self.key, tuning_record.plain(rep), strict=True)), target, self.options,
            [c.options for c in built])

    def _recorded(self, tkey: str, record: dict) -> dict | None:
        return tuning_record.recorded(tkey, record, self.configs, self.factory.__name__)

    def _record(self, tkey: str, record: dict, winner: Candidate,
                candidates: list[Candidate]) -> None:
        tuning_record.record(tkey, record, winner.compiled, {
            "record": record, "config": winner.config, "factory": self.factory.__qualname__,
            "us": {str(c.index): c.us for c in candidates if c.us is not None},
            "skipped": {str(c.index): c.skipped for c in candidates if c.skipped}},
            self.factory.__name__)

    # -- tuning ------------------------------------------------------------------------------

    def _tune(self, candidates: list[Candidate], bound, target: str) -> Candidate:
        from tiled.tuning_bench import check_and_time, compile_all

        _count("tunings")
        name = self.factory.__name__
        t0 = time.perf_counter()
        live = [c for c in candidates if c.skipped is None]
        progress = _Progress(name, len(live))
        compile_all(live, target, progress)
        check_and_time(live, bound, target, self, progress)
        progress.done()
        timed = [c for c in live if c.skipped is None and c.us is not None]
        for c in candidates:  # a config the factory refuses for this shape is expected
            if c.skipped:
                level = logging.INFO if c.skipped.startswith("the factory raised") else \
                    logging.WARNING
                log.log(level, "tiled.autotune %s: config #%d %s skipped: %s", name, c.index,
                        c.config, c.skipped)
        if not timed:
            raise ValueError(f"tiled.autotune {name}: every config failed: " +
                             "; ".join(f"#{c.index} {c.skipped}" for c in candidates))
        _count("candidates_timed", len(timed))
        winner = min(timed, key=lambda c: c.us)
        log.info("tiled.autotune %s: config #%d %s wins (%.1f us; %d timed, %.1f s)", name,
                 winner.index, winner.config, winner.us, len(timed),
                 time.perf_counter() - t0)
        return winner

    def _resolve_target(self) -> str:
        if self.target != "auto":
            return self.target
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            from tiled.jit import _local_cuda_target

            return _local_cuda_target(torch.empty(0, device="cuda"))
        return "cpu"


class _Progress:
    """One self-rewriting line on stderr while tuning, when stderr is a terminal."""

    def __init__(self, name: str, n: int):
        self.name, self.n, self.tty = name, n, sys.stderr.isatty()

    def update(self, stage: str, i: int) -> None:
        if self.tty:
            sys.stderr.write(f"\rtiled.autotune {self.name}: {stage} {i}/{self.n}\x1b[K")
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _freeze(arguments: Mapping[str, Any], key: Sequence[str]) -> tuple:
    """The call's non-key arguments, hashable (they change the kernel, so they split the
    memo): repr of anything unhashable."""
    out = []
    for name, v in sorted(arguments.items()):
        if name in key:
            continue
        try:
            hash(v)
            out.append((name, v))
        except TypeError:
            out.append((name, repr(v)))
    return tuple(out)


__all__ = ["STATS", "Autotuner", "Candidate", "PrebuiltKernel", "Tuned", "autotune",
           "device_identity", "prebuilt"]
