"""`CompilePool`: compile jobs run in worker processes, so a crash, hang or memory blow-up of one
compile fails that request only.

Invariants:
- One dispatcher thread owns every worker process and pipe: it alone starts, feeds, kills and
  replaces workers. `submit`, `cancel` and `shutdown` only touch the queue and counters under
  `_lock` and wake the dispatcher through a self-pipe.
- A worker runs one job at a time. Workers never fork from the caller (forking a process that
  holds gRPC threads is unsafe): with `preload` modules they fork from multiprocessing's fork
  server, a clean single-threaded process that imported those modules once (so a replacement
  worker is ready in milliseconds and siblings share the compiler's pages); without, they are
  spawned. Each limits its address space to `memory_bytes` (RLIMIT_AS) when given. A worker
  whose private memory exceeds `recycle_bytes` after a job (a compile's heap stays mapped)
  exits after answering and is replaced by a fresh fork ("recycled").
- With `idle_stop_s`, a pool that has had no job for that long stops its workers (and the fork
  server, which holds the preloaded compiler): an idle daemon keeps no compiler in memory. The
  next job starts them again, paying the preload once.
- `fn` is "module:function" with the module inside the `tiled` package; the daemon executes
  nothing else a request names. The check is lexical: nothing is imported in the daemon.
- Single-flight: while a job is queued or running, `_by_key[key]` is that job, and a submit with
  the same key returns the same future (all merged callers share it, cancellation included).
  A key leaves `_by_key` when its job finishes or its future is cancelled.
- Futures stay PENDING while their job runs, so `cancel()` succeeds on a running job too: its
  worker is killed and replaced (a compile nobody waits for does not hold a worker). A queued
  job that is cancelled leaves the queue at once.
- A job ends in exactly one way: result, exception raised by `fn` (re-raised as the same type
  when it pickles, else RuntimeError; the worker stays), `CompileTimeout` (worker killed and
  replaced), `WorkerCrashed` (worker died or reported MemoryError; replaced), or cancellation.
- Futures are resolved and `on_event` is called outside `_lock`; `on_event` never raises into
  the pool (its errors are logged).
- After `shutdown` returns, no worker process of this pool is alive.
"""

from __future__ import annotations

import collections
import concurrent.futures
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import resource
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tiled.errors import CompileError, CompileTimeout, QueueFull, WorkerCrashed

log = logging.getLogger(__name__)
_FN = re.compile(r"tiled(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _private_bytes() -> int:
    """This process's private resident memory (pages no other process shares), 0 if unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) * 1024 for line in f
                       if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except OSError:
        return 0


def _worker_main(conn: multiprocessing.connection.Connection, memory_bytes: int | None,
                 recycle_bytes: int | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the daemon: the parent shuts us down
    importlib.import_module("tiled.compiler")  # pay the import cost once per worker
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the parent went away
            return
        if job is None:
            return
        fn, payload = job
        try:
            module, _, name = fn.partition(":")
            result = getattr(importlib.import_module(module), name)(payload)
            retire = recycle_bytes is not None and _private_bytes() > recycle_bytes
            conn.send(("ok", result, retire))
            if retire:  # a compile's heap stays mapped: a fresh fork is smaller
                return
        except MemoryError:
            conn.send(("oom", None))
            return  # the heap may be in a bad state: the pool replaces us
        except Exception as exc:
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:  # an exception that does not round-trip comes back as its text
                exc = RuntimeError(f"{type(exc).__qualname__}: {exc}")
            conn.send(("error", exc))


@dataclass(eq=False)
class _Job:
    key: str
    fn: str
    payload: bytes
    timeout_s: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    started: float = 0.0


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    job: _Job | None = None


class CompilePool:
    """A pool of compile worker processes. `submit`, `stats` and `shutdown` are thread-safe."""

    def __init__(self, workers: int | None = None, timeout_s: float = 600.0,
                 memory_bytes: int | None = None, queue_limit: int = 256,
                 on_event: Callable[[str, dict], None] | None = None,
                 preload: tuple[str, ...] = (), recycle_bytes: int | None = None,
                 idle_stop_s: float | None = None):
        self.workers = max(1, workers or len(os.sched_getaffinity(0)))  # read-only after init
        self.queue_limit = queue_limit
        self._timeout_s, self._memory_bytes = timeout_s, memory_bytes
        self._recycle_bytes = recycle_bytes
        self._idle_stop_s, self._preload = idle_stop_s, preload
        self._last_busy = time.monotonic()
        self._on_event = on_event
        if preload:  # the fork server is per process: the first pool's preload list wins
            self._ctx = multiprocessing.get_context("forkserver")
            self._ctx.set_forkserver_preload(list(preload))
        else:
            self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._by_key: dict[str, _Job] = {}
        self._counts = dict.fromkeys(
            ("merged_total", "completed_total", "failed_total", "cancelled_total",
             "replaced_total"), 0)
        self._in_flight = 0
        self._closing = False
        self._kill_running = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._workers = [self._start_worker() for _ in range(self.workers)]
        self._thread = threading.Thread(target=self._dispatch, name="tiled-compile-pool",
                                        daemon=True)
        self._thread.start()

    # -- public API --------------------------------------------------------------------------

    def submit(self, key: str, fn: str, payload: bytes,
               timeout_s: float | None = None) -> concurrent.futures.Future:
        """Run `fn(payload) -> bytes` in a worker; returns a future of the bytes. Raises
        ValueError for a function outside `tiled.`, QueueFull when `queue_limit` jobs wait,
        RuntimeError after shutdown."""
        if not _FN.fullmatch(fn):
            raise ValueError(f"compile function {fn!r} is not a 'tiled.module:function'")
        with self._lock:
            if self._closing:
                raise RuntimeError("CompilePool is shut down")
            job = self._by_key.get(key)
            merged = job is not None
            if merged:
                self._counts["merged_total"] += 1
            elif len(self._queue) >= self.queue_limit:
                raise QueueFull(f"compile queue is full ({self.queue_limit} jobs waiting)")
            else:
                job = _Job(key, fn, payload, self._timeout_s if timeout_s is None else timeout_s)
                self._queue.append(job)
                self._by_key[key] = job
                self._wake()
        if merged:
            self._emit("merged", key=key)
        else:
            job.future.add_done_callback(lambda _, job=job: self._forget(job))
            self._emit("queued", key=key)
        return job.future

    def stats(self) -> dict:
        with self._lock:
            return {"workers": self.workers, "live_workers": len(self._workers),
                    "queued": len(self._queue),
                    "in_flight": self._in_flight, **self._counts}

    def shutdown(self, wait: bool = True, cancel_pending: bool = True) -> None:
        """Stop the pool. `cancel_pending` fails queued jobs with CancelledError (else they still
        run). `wait=True` lets running jobs finish; `wait=False` kills them and cancels every
        unfinished job. Either way no worker process is left when this returns."""
        with self._lock:
            self._closing = True
            self._kill_running = self._kill_running or not wait
            dropped = list(self._queue) if cancel_pending or not wait else []
            if self._wake_w >= 0:
                self._wake()
        for job in dropped:
            job.future.cancel()  # the done callback takes the job off the queue
        self._thread.join()
        with self._lock:
            if self._wake_w >= 0:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    # -- dispatcher ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        wake_r = self._wake_r
        while True:
            with self._lock:
                killed = [w for w in self._workers if w.job] if self._kill_running else []
                dropped = list(self._queue) if self._kill_running else []
                done = self._closing and not self._queue and not self._in_flight and not killed
                starts = []
                for w in self._workers:
                    if self._queue and w.job is None:
                        w.job = self._queue.popleft()
                        w.job.started = time.monotonic()
                        self._in_flight += 1
                        starts.append(w)
            if done:
                break
            if self._queue and not self._workers:  # stopped while idle: start again
                self._workers = [self._start_worker() for _ in range(self.workers)]
                continue
            for job in dropped:
                job.future.cancel()
            for w in killed:  # only on shutdown(wait=False): the worker is not replaced
                self._kill(w)
                self._workers.remove(w)
                with self._lock:
                    self._in_flight -= 1
                w.job.future.cancel()
            if killed:
                continue  # re-check `done` now that nothing runs
            for w in starts:
                self._start_job(w)
            now = time.monotonic()
            deadlines = [w.job.started + w.job.timeout_s for w in self._workers if w.job]
            if any(w.job for w in self._workers) or self._queue:
                self._last_busy = now
            elif self._idle_stop_s is not None and self._workers:
                if now - self._last_busy >= self._idle_stop_s:
                    self._stop_idle()
                    continue
                deadlines.append(self._last_busy + self._idle_stop_s)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            waitables = [wake_r] + [w.conn for w in self._workers] + \
                [w.process.sentinel for w in self._workers]
            ready = set(multiprocessing.connection.wait(waitables, timeout))
            if wake_r in ready:
                self._drain_wake()
            for i, w in enumerate(self._workers):
                if w.job is not None and w.job.future.cancelled():
                    self._finish(i, w, None, "cancelled")
                elif w.conn in ready or w.process.sentinel in ready:
                    self._collect(i, w)
                elif w.job is not None and time.monotonic() >= w.job.started + w.job.timeout_s:
                    job = w.job
                    self._finish(i, w, CompileTimeout(
                        f"compile {job.key!r} ran past its {job.timeout_s:g} s limit"), "timeout")
        for w in self._workers:
            self._stop(w)

    def _stop_idle(self) -> None:
        """Stops every (idle) worker and the fork server after `idle_stop_s` without a job."""
        for w in self._workers:
            self._stop(w)
        with self._lock:
            self._workers = []
        if self._preload:
            from multiprocessing import forkserver

            # The fork server holds the preloaded compiler; the next worker start restarts it.
            # (_stop is multiprocessing's own way to stop it, used by its tests.)
            forkserver._forkserver._stop()
        log.info("compile workers stopped after %.0f s idle", self._idle_stop_s)
        self._emit("idle_stop")

    def _start_job(self, w: _Worker) -> None:
        job = w.job
        if job.future.cancelled():  # cancelled between leaving the queue and starting
            with self._lock:
                w.job = None
                self._in_flight -= 1
            return
        try:
            w.conn.send((job.fn, job.payload))
        except OSError:  # the idle worker had died: run the job on its replacement
            self._kill(w)
            self._workers[self._workers.index(w)] = self._start_worker()
            with self._lock:
                self._queue.appendleft(job)
                self._in_flight -= 1
                self._counts["replaced_total"] += 1
            self._emit("replaced", reason="crashed")
            return
        self._emit("started", key=job.key)

    def _collect(self, i: int, w: _Worker) -> None:
        """A worker's pipe is readable or its process ended: take its answer. A sentinel that
        fires with nothing to read means the process is gone, or (forked workers) its fork
        server is: the worker is treated as crashed, killed and replaced, never waited on."""
        try:
            if not w.conn.poll():
                raise EOFError
            kind, value, *retire = w.conn.recv()
        except (EOFError, OSError):
            if w.process.is_alive():  # orphaned by a dead fork server: not ours to keep
                w.process.kill()
            w.process.join(5)
            code = w.process.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self._finish(i, w, WorkerCrashed(f"compile worker died: {how}"), "crashed")
            return
        if kind == "oom":
            limit = f" (limit {self._memory_bytes} bytes)" if self._memory_bytes else ""
            self._finish(i, w, WorkerCrashed(f"compile worker ran out of memory{limit}"), "oom")
        else:
            self._finish(i, w, value, "recycled" if retire and retire[0] else None,
                         ok=kind == "ok")

    def _finish(self, i: int, w: _Worker, value: object, replace: str | None,
                ok: bool = False) -> None:
        """End `w`'s job with `value` (result or exception); replace the worker if `replace`."""
        job = w.job
        if replace is not None:
            self._kill(w)
            self._workers[i] = self._start_worker()
        with self._lock:
            w.job = None
            if job is not None:
                self._in_flight -= 1
                self._counts["completed_total" if ok else "cancelled_total"
                             if replace == "cancelled" else "failed_total"] += 1
            if replace is not None:
                self._counts["replaced_total"] += 1
        if replace is not None:
            self._emit("replaced", reason=replace)
        if job is None:
            return
        self._forget(job)
        result = "ok" if ok else replace if replace in ("timeout", "cancelled") else "error"
        self._emit("finished", key=job.key, seconds=time.monotonic() - job.started, ok=ok,
                   result=result)
        if job.future.set_running_or_notify_cancel():  # False: cancelled, the result is dropped
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)

    # -- helpers -------------------------------------------------------------------------------

    def _forget(self, job: _Job) -> None:
        """Take a finished or cancelled job off the queue and out of single-flight; a cancelled
        job that runs wakes the dispatcher, which kills its worker."""
        dequeued = False
        with self._lock:
            if self._by_key.get(job.key) is job:
                del self._by_key[job.key]
            if job.future.cancelled():
                if job in self._queue:
                    self._queue.remove(job)
                    dequeued = True
                elif job.started and self._wake_w >= 0:
                    self._wake()
        if dequeued:
            self._emit("dequeued", key=job.key)

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main,
                                    args=(child, self._memory_bytes, self._recycle_bytes),
                                 name="tiled-compile-worker", daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    @staticmethod
    def _kill(w: _Worker) -> None:
        w.process.kill()
        w.process.join()
        w.conn.close()

    @staticmethod
    def _stop(w: _Worker) -> None:
        try:
            w.conn.send(None)
        except OSError:  # already dead: join below reaps it
            pass
        w.process.join(5)
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
        w.conn.close()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full, so a wake-up is already pending
            pass

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _emit(self, name: str, **fields: object) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(name, fields)
        except Exception:
            log.exception("CompilePool on_event(%r) raised", name)


# Job functions that exist for tests only (tests/server/test_pool.py): they must live under
# `tiled.` to pass the allow-list.

def _test_echo(payload: bytes) -> bytes:
    return payload


def _test_pid(payload: bytes) -> bytes:
    return str(os.getpid()).encode()


def _test_sleep(payload: bytes) -> bytes:
    time.sleep(float(payload))
    return payload


def _test_gate(payload: bytes) -> bytes:
    """Block until the file named by `payload` exists (the test opens the gate)."""
    while not os.path.exists(payload):
        time.sleep(0.01)
    return payload


def _test_crash(payload: bytes) -> bytes:
    os.kill(os.getpid(), signal.SIGKILL)
    return b""


def _test_alloc(payload: bytes) -> bytes:
    return str(len(bytearray(int(payload)))).encode()


def _test_raise(payload: bytes) -> bytes:
    raise CompileError(payload.decode(), loc="kernel.py:7")
