"""Single-flight compiles, and the bound on requests waiting for them.

Single flight: the first request for an action key owns its compile (and the store of its
entry); requests for the same key arriving meanwhile wait for the owner's entry instead of
compiling again. A waiting request that goes away (cancelled, deadline passed) leaves at once;
when the last one leaves, the pool job is cancelled and the flight forgotten.

Admission: a request that must wait for a compile (its own, or one it merged onto) holds a gRPC
handler thread while it waits, so at most `max_waiting` requests may wait at once (a Warm call
counts as one for its whole stream); the next gets QueueFull (RESOURCE_EXHAUSTED). The daemon
sizes its handler pool above `max_waiting` (tiled.server.app), so waiting compiles can never
take the threads that cache hits, health and status need. A merged request that goes away
frees its thread and slot at once; the owner of a compile stays until the compile ends when
others still wait on it, as it stores the entry for them.

Thread-safe: one lock guards the flights, their waiter counts and the waiting count.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tiled.errors import CompileTimeout, QueueFull

log = logging.getLogger("tiled.server")


class Flight:
    """One compile in progress: the future of its entry, how many requests wait for it, and
    the pool job (cancelled when the last waiting request goes away)."""

    def __init__(self):
        self.entry: concurrent.futures.Future = concurrent.futures.Future()
        self.waiters = 1
        self.job: concurrent.futures.Future | None = None


class Waiter:
    """Ties one request to the flight it waits on, so that the request's gRPC termination
    (cancelled by the client, deadline passed) can leave it. `gone` is resolved then, which
    frees a request merged onto another's compile from waiting (and its handler thread)."""

    def __init__(self):
        self.key: str | None = None
        self.flight: Flight | None = None
        self.gone: concurrent.futures.Future = concurrent.futures.Future()


class Flights:
    """The compiles in flight by action key, and the count of requests waiting on them (at
    most `max_waiting`; None: no bound, for in-process use)."""

    def __init__(self, max_waiting: int | None = None, metrics: Any = None):
        self.max_waiting, self.metrics = max_waiting, metrics
        self.merged = 0  # requests answered by another request's compile
        self._waiting = 0
        self._inflight: dict[str, Flight] = {}  # key -> the compile of it now running
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def waiting_slot(self, counted: bool = True) -> Iterator[None]:
        """One of `max_waiting` for the request about to wait on a compile; QueueFull when
        every one is taken, so a flood of cold compiles is refused rather than queued behind
        the handler threads. `counted=False` takes none (a Warm item: its call holds one)."""
        if not counted or self.max_waiting is None:
            yield
            return
        with self._lock:
            full = self._waiting >= self.max_waiting
            if not full:
                self._waiting += 1
            waiting = self._waiting
        if full:
            if self.metrics is not None:
                self.metrics.refused("waiting")
            raise QueueFull(f"{self.max_waiting} requests already wait for compiles (the "
                            "daemon's --max-waiting); retry later")
        if self.metrics is not None:
            self.metrics.set_waiting(waiting)
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                waiting = self._waiting
            if self.metrics is not None:
                self.metrics.set_waiting(waiting)

    def once(self, key: str, waiter: Waiter, time_left: float | None,
             produce: Callable[[Flight], tuple[Any, str]]) -> tuple[Any, str]:
        """(entry, outcome) for `key`: the first request runs `produce(flight)`, which returns
        the entry and "hit" or "compiled" (it looks the cache up again, so a request that
        missed just before the previous owner stored and left is a hit, not a second
        compile); requests arriving meanwhile wait for its entry, for at most `time_left`
        seconds (CompileTimeout), and get (entry, "merged"). A waiter that went away
        (`abandon`) raises CancelledError."""
        with self._lock:
            flight = self._inflight.get(key)
            owner = flight is None
            if flight is None:
                flight = self._inflight[key] = Flight()
            else:
                flight.waiters += 1
            waiter.key, waiter.flight = key, flight
        if not owner:
            with self._lock:
                self.merged += 1
            if self.metrics is not None:
                self.metrics.pool_event("merged", {})
            done, _ = concurrent.futures.wait((flight.entry, waiter.gone), timeout=time_left,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            if flight.entry in done:
                return flight.entry.result(), "merged"  # not from the cache, not compiled
            if waiter.gone in done:
                raise concurrent.futures.CancelledError("the request went away")
            raise CompileTimeout("the deadline passed while waiting for an identical compile")
        try:
            entry, outcome = produce(flight)
            flight.entry.set_result(entry)
            return entry, outcome
        except BaseException as e:
            flight.entry.set_exception(e)
            raise
        finally:
            with self._lock:
                if self._inflight.get(key) is flight:
                    del self._inflight[key]

    def attach(self, key: str, flight: Flight, job: concurrent.futures.Future) -> bool:
        """Records the pool job compiling `flight`; True when every request already left it
        (the caller cancels the job then)."""
        with self._lock:
            flight.job = job
            return flight.waiters == 0 or self._inflight.get(key) is not flight

    def abandon(self, waiter: Waiter) -> None:
        """The request behind `waiter` ended without waiting for its compile (the client
        cancelled or its deadline passed). The last one to leave cancels the pool job, which
        kills its worker; a later request for the key starts afresh."""
        if not waiter.gone.done():
            waiter.gone.set_result(None)
        with self._lock:
            flight, waiter.flight, key = waiter.flight, None, waiter.key
            if flight is None or key is None or flight.entry.done():
                return
            flight.waiters -= 1
            if flight.waiters > 0:
                return
            if self._inflight.get(key) is flight:
                del self._inflight[key]
            job = flight.job
        log.info("compile %s cancelled: no request waits for it", key[:12])
        if job is not None:
            job.cancel()
