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
  spawned. Each limits its address space to `memory_bytes` (RLIMIT_AS, inherited by nvcc,
  cicc, ptxas and the C compiler) when given. A worker whose private memory exceeds
  `recycle_bytes` after a job (a compile's heap stays mapped) exits after answering and is
  replaced by a fresh fork ("recycled").
- Every worker leads its own process group (and session) from its first instruction, so
  everything a job starts (nvcc, cicc, ptxas, fatbinary, the C compiler, ld) is in that group.
  Timeout, cancellation, replacement (crash, oom, recycle, a bad answer), idle stop and
  shutdown end the whole group: SIGKILL to the group, then a wait until no member runs
  (tiled.server.procgroups).
- A daemon that dies without shutting down (SIGKILL included) takes its groups with it: each
  group holds a watchdog that kills it when the daemon's end of its lifeline pipe closes
  (tiled.server.worker), and a forked worker also dies with its fork server
  (PR_SET_PDEATHSIG). A process that escapes both (it left its group, or its watchdog was
  killed from outside) is found by the next pool's start-up sweep while it still runs with
  its TMPDIR in a swept directory (tiled.server.jobdirs).
- Every job has a temp directory of its own (TMPDIR and `tempfile.tempdir` in the worker)
  under this pool's `temp_dir` (0700), inside `temp_root` (0700, this user's, refused
  otherwise). It is removed however the job ends (result, error, timeout, cancel, crash,
  shutdown), after its group is gone when the group was killed; `temp_dir` itself goes at
  shutdown. A new pool removes the directories of pools whose process is gone, never a live
  pool's (tiled.server.jobdirs: the layout, and how a dead pool is told from a live one).
- Nothing crosses the process boundary as pickle: jobs and answers are frames of a JSON
  header and bytes (tiled.server.worker), so the daemon never imports what a worker raised
  (TVM's errors included).
- `fn` is "module:function" with the module inside the `tiled` package; the daemon executes
  nothing else a request names. The check is lexical: nothing is imported in the daemon.
- Single-flight: while a job is queued or running, `_by_key[key]` is that job, and a submit with
  the same key returns the same future (all merged callers share it, cancellation included).
  A key leaves `_by_key` when its job finishes or its future is cancelled.
- Futures stay PENDING while their job runs, so `cancel()` succeeds on a running job too: its
  worker is killed and replaced (a compile nobody waits for does not hold a worker). A queued
  job that is cancelled leaves the queue at once.
- A job ends in exactly one way: result, exception raised by `fn` (an allow-listed tiled error,
  tiled.server.worker.ALLOWED_ERRORS, comes back as its class with its fields, anything else as
  RuntimeError "TypeName: message"; the worker stays), `CompileTimeout` (worker killed and
  replaced), `WorkerCrashed` (worker died, reported MemoryError, or sent an unreadable or
  oversized answer; replaced), or cancellation.
- Futures are resolved and `on_event` is called outside `_lock`; `on_event` never raises into
  the pool (its errors are logged).
- After `shutdown` returns, no process of any worker's group is alive and `temp_dir` is gone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiled.errors import CompileTimeout, QueueFull, WorkerCrashed
from tiled.server import worker as worker_process
from tiled.server.jobdirs import (
    default_temp_root,
    make_job_dir,
    make_pool_dir,
    private_dir,
    remove_tree,
    sweep_temp_root,
)
from tiled.server.procgroups import kill_group
from tiled.server.worker import decode, encode, error_from_record

log = logging.getLogger(__name__)
_FN = re.compile(r"tiled(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
# Defaults sized from real compiles (examples/gemm.py, examples/flash_attention.py for
# cuda:sm_90a, CPU kernels): a worker peaks at 1.1 GB of address space (1.45 GB with NVRTC)
# and 0.45-0.73 GB resident, nvcc's children at 0.17 GB, and compiles take 0.1-2.3 s.
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_BYTES = 4 << 30
MAX_ANSWER_BYTES = 1 << 30  # a worker's answer (artifact + manifest) larger than this: crashed


@dataclass(eq=False)
class _Job:
    key: str
    fn: str
    payload: bytes
    timeout_s: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    started: float = 0.0
    tmp: Path | None = None  # its temp directory while it runs


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    lifeline: multiprocessing.connection.Connection  # the write end; closing it kills the group
    pgid: int
    job: _Job | None = None


class CompilePool:
    """A pool of compile worker processes. `submit`, `stats` and `shutdown` are thread-safe.
    `temp_root` defaults to `<tempfile.gettempdir()>/tiled-jobs-<uid>`; raises
    PermissionError when it is not a private directory of this user."""

    def __init__(self, workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_bytes: int | None = DEFAULT_MEMORY_BYTES, queue_limit: int = 256,
                 on_event: Callable[[str, dict], None] | None = None,
                 preload: tuple[str, ...] = (), recycle_bytes: int | None = None,
                 idle_stop_s: float | None = None,
                 temp_root: str | os.PathLike | None = None):
        self.workers = max(1, workers or len(os.sched_getaffinity(0)))  # read-only after init
        self.queue_limit = queue_limit
        self._timeout_s, self._memory_bytes = timeout_s, memory_bytes
        self._recycle_bytes = recycle_bytes
        self._idle_stop_s, self._preload = idle_stop_s, preload
        self._last_busy = time.monotonic()
        self._on_event = on_event
        self.temp_root = private_dir(Path(temp_root) if temp_root else default_temp_root())
        sweep_temp_root(self.temp_root)
        self.temp_dir = make_pool_dir(self.temp_root)  # read-only after init
        self._job_dirs = 0
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
        unfinished job. Either way, when this returns no process of any worker's group is left
        and `temp_dir` is removed."""
        with self._lock:
            self._closing = True
            self._kill_running = self._kill_running or not wait
            dropped = list(self._queue) if cancel_pending or not wait else []
            if self._wake_w >= 0:
                self._wake()
        for job in dropped:
            job.future.cancel()  # the done callback takes the job off the queue
        self._thread.join()
        remove_tree(self.temp_dir)
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
                self._drop_job_dir(w.job)
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
            self._emit("dequeued", key=job.key)  # it left the queue without running
            return
        try:
            job.tmp = self._new_job_dir()
        except OSError as e:  # the temp root is gone or full: this job fails, the worker stays
            self._finish(self._workers.index(w), w, e, None)
            return
        try:
            w.conn.send_bytes(encode({"fn": job.fn, "tmp": str(job.tmp)}, job.payload))
        except OSError:  # the idle worker had died: run the job on its replacement
            self._kill(w)
            self._drop_job_dir(job)
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
            header, body = decode(w.conn.recv_bytes(MAX_ANSWER_BYTES))
            kind = header.get("kind")
        except (EOFError, ConnectionError):
            if w.process.is_alive():  # orphaned by a dead fork server: not ours to keep
                w.process.kill()
            w.process.join(5)
            code = w.process.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self._finish(i, w, WorkerCrashed(f"compile worker died: {how}"), "crashed")
            return
        except (OSError, ValueError) as e:  # over MAX_ANSWER_BYTES, or not a frame
            self._finish(i, w, WorkerCrashed(f"compile worker sent a bad answer: {e}"),
                         "crashed")
            return
        if kind == "ok":
            self._finish(i, w, body, "recycled" if header.get("retire") else None, ok=True)
        elif kind == "error":
            record = header.get("error")
            exc = error_from_record(record)
            if isinstance(record, dict) and isinstance(record.get("traceback"), str):
                log.warning("compile %s failed in the worker: %s\n%s",
                            w.job.key[:12] if w.job else "-", exc, record["traceback"])
            self._finish(i, w, exc, None)
        elif kind == "oom":
            limit = f" (limit {self._memory_bytes} bytes)" if self._memory_bytes else ""
            self._finish(i, w, WorkerCrashed(f"compile worker ran out of memory{limit}"), "oom")
        else:
            self._finish(i, w, WorkerCrashed(f"compile worker sent an answer of kind {kind!r}"),
                         "crashed")

    def _finish(self, i: int, w: _Worker, value: object, replace: str | None,
                ok: bool = False) -> None:
        """End `w`'s job with `value` (result or exception); replace the worker if `replace`."""
        job = w.job
        if replace is not None:
            self._kill(w)
            self._workers[i] = self._start_worker()
        self._drop_job_dir(job)  # after the group is gone: nothing writes there any more
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

    def _new_job_dir(self) -> Path:
        self._job_dirs += 1
        return make_job_dir(self.temp_root, self.temp_dir, self._job_dirs)

    @staticmethod
    def _drop_job_dir(job: _Job | None) -> None:
        if job is not None and job.tmp is not None:
            remove_tree(job.tmp)
            job.tmp = None

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        life_r, life_w = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=worker_process.serve, name="tiled-compile-worker", daemon=True,
            args=(child, life_r, self._memory_bytes, self._recycle_bytes, bool(self._preload)))
        process.start()
        child.close()
        life_r.close()  # the daemon keeps only the write end: its exit closes the lifeline
        assert process.pid is not None  # started
        return _Worker(process, parent, life_w, process.pid)

    @staticmethod
    def _kill(w: _Worker) -> None:
        """Kills `w`'s group and waits until none of it runs."""
        try:
            os.killpg(w.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        w.process.kill()  # a worker that does not lead its group yet has started nothing
        w.process.join()
        kill_group(w.pgid)  # its watchdog (which keeps the group id taken) and any straggler
        w.lifeline.close()
        w.conn.close()

    @staticmethod
    def _stop(w: _Worker) -> None:
        """Asks an idle `w` to exit, then ends what is left of its group (its watchdog)."""
        try:
            w.conn.send_bytes(b"")
        except OSError:  # already dead: join below reaps it
            pass
        w.process.join(5)
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
        kill_group(w.pgid)
        w.lifeline.close()
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
