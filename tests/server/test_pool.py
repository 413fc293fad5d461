"""CompilePool with real worker processes. Synchronization is by gates (a job that waits for a
file the test creates) and by pool events, never by sleeping in the test."""

import concurrent.futures
import json
import multiprocessing
import threading

import pytest

from tiled import errors
from tiled.errors import CompileError, CompileTimeout, QueueFull, WorkerCrashed
from tiled.server.pool import CompilePool
from tiled.server.worker import ALLOWED_ERRORS, MAX_ERROR_CHARS, error_from_record, error_record

JOBS = "tiled.server.pool_test_jobs:"


class Events:
    """Records on_event calls; `wait_for` blocks until `name` has been seen `count` times."""

    def __init__(self):
        self.seen: list[tuple[str, dict]] = []
        self.cond = threading.Condition()

    def __call__(self, name, fields):
        with self.cond:
            self.seen.append((name, fields))
            self.cond.notify_all()

    def count(self, name):
        return sum(n == name for n, _ in self.seen)

    def wait_for(self, name, count=1, timeout=30):
        with self.cond:
            assert self.cond.wait_for(lambda: self.count(name) >= count, timeout), self.seen


@pytest.fixture
def make_pool():
    pools = []

    def make(**kwargs):
        kwargs.setdefault("workers", 1)
        pools.append(CompilePool(**kwargs))
        return pools[-1]

    yield make
    for pool in pools:
        pool.shutdown(wait=False)
    assert multiprocessing.active_children() == []


@pytest.fixture
def gate(tmp_path):
    """A payload for `_test_gate` and the function that opens it."""
    path = tmp_path / "gate"
    return str(path).encode(), path.touch


def test_echo_round_trip(make_pool):
    pool = make_pool()
    assert pool.submit("k", JOBS + "_test_echo", b"hello").result(30) == b"hello"
    assert pool.stats()["completed_total"] == 1


def test_identical_submits_run_once(make_pool, gate):
    events = Events()
    pool = make_pool(workers=2, on_event=events)
    payload, open_gate = gate
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futures = list(ex.map(lambda _: pool.submit("same", JOBS + "_test_gate", payload),
                              range(50)))
    assert all(f is futures[0] for f in futures)
    open_gate()
    assert [f.result(30) for f in futures] == [payload] * 50
    stats = pool.stats()
    assert (stats["merged_total"], stats["completed_total"], events.count("started")) == (49, 1, 1)
    # once finished, the key starts a new job
    assert pool.submit("same", JOBS + "_test_echo", b"again").result(30) == b"again"
    assert pool.stats()["completed_total"] == 2


def test_different_keys_run_in_parallel_up_to_workers(make_pool, gate):
    events = Events()
    pool = make_pool(workers=2, on_event=events)
    payload, open_gate = gate
    futures = [pool.submit(f"k{i}", JOBS + "_test_gate", payload) for i in range(3)]
    events.wait_for("started", 2)
    stats = pool.stats()
    assert (stats["in_flight"], stats["queued"]) == (2, 1)
    open_gate()
    assert [f.result(30) for f in futures] == [payload] * 3
    assert events.count("started") == 3


def test_queue_full_and_cancel(make_pool, gate):
    events = Events()
    pool = make_pool(queue_limit=2, on_event=events)
    payload, open_gate = gate
    running = pool.submit("run", JOBS + "_test_gate", payload)
    events.wait_for("started")
    queued = [pool.submit(f"q{i}", JOBS + "_test_echo", b"q") for i in range(2)]
    with pytest.raises(QueueFull):
        pool.submit("over", JOBS + "_test_echo", b"x")
    assert pool.submit("q0", JOBS + "_test_echo", b"q") is queued[0]  # merging is not admission
    assert queued[1].cancel()
    assert pool.stats()["queued"] == 1
    open_gate()
    assert running.result(30) == payload and queued[0].result(30) == b"q"
    with pytest.raises(concurrent.futures.CancelledError):
        queued[1].result(0)


def test_cancelling_a_running_job_kills_its_worker(make_pool, gate):
    events = Events()
    pool = make_pool(on_event=events)
    payload, _never_opened = gate
    pid = pool.submit("pid", JOBS + "_test_pid", b"").result(30)
    running = pool.submit("run", JOBS + "_test_gate", payload)
    events.wait_for("started", 2)
    assert running.cancel()
    events.wait_for("replaced")
    assert ("replaced", {"reason": "cancelled"}) in events.seen
    assert pool.submit("pid2", JOBS + "_test_pid", b"").result(30) != pid  # a fresh worker
    stats = pool.stats()
    assert (stats["cancelled_total"], stats["failed_total"], stats["in_flight"]) == (1, 0, 0)


def test_worker_over_its_memory_budget_is_recycled_after_answering(make_pool):
    events = Events()
    pool = make_pool(recycle_bytes=1, on_event=events)  # every worker is over 1 byte
    first = pool.submit("a", JOBS + "_test_pid", b"").result(30)
    assert pool.submit("b", JOBS + "_test_pid", b"").result(30) != first
    assert ("replaced", {"reason": "recycled"}) in events.seen
    stats = pool.stats()
    assert (stats["completed_total"], stats["failed_total"]) == (2, 0)


@pytest.mark.parametrize("preload", [(), ("json",)])  # spawned, or forked from a fork server
def test_idle_pool_stops_its_workers_and_starts_them_again(make_pool, preload):
    events = Events()
    pool = make_pool(idle_stop_s=0.3, preload=preload, on_event=events)
    first = pool.submit("a", JOBS + "_test_pid", b"").result(30)
    # The idle stop after the job (on a loaded machine the pool may also have stopped idle
    # once before the job reached it, then started again).
    def stopped_after_the_job():
        names = [n for n, _ in events.seen]
        return "finished" in names and "idle_stop" in names[names.index("finished"):]

    with events.cond:
        assert events.cond.wait_for(stopped_after_the_job, 30), events.seen
    assert pool.stats()["live_workers"] == 0
    assert not [p for p in multiprocessing.active_children() if p.name == "tiled-compile-worker"]
    assert pool.submit("b", JOBS + "_test_pid", b"").result(60) != first  # a new worker
    assert pool.stats()["live_workers"] == 1


def test_timeout_replaces_worker(make_pool):
    events = Events()
    # The limit is per job and counts from its start on a worker; 3 s leaves a loaded
    # machine room to run the echo on the replacement worker.
    pool = make_pool(timeout_s=3, on_event=events)
    with pytest.raises(CompileTimeout):
        pool.submit("slow", JOBS + "_test_sleep", b"60").result(30)
    assert pool.submit("next", JOBS + "_test_echo", b"ok").result(30) == b"ok"
    assert pool.stats()["replaced_total"] == 1
    assert ("replaced", {"reason": "timeout"}) in events.seen


def test_killed_worker_fails_only_its_job(make_pool, gate):
    events = Events()
    pool = make_pool(workers=2, on_event=events)
    payload, open_gate = gate
    other = pool.submit("other", JOBS + "_test_gate", payload)
    events.wait_for("started")
    with pytest.raises(WorkerCrashed, match="signal 9"):
        pool.submit("crash", JOBS + "_test_crash", b"").result(30)
    open_gate()
    assert other.result(30) == payload
    assert pool.submit("next", JOBS + "_test_echo", b"ok").result(30) == b"ok"
    stats = pool.stats()
    assert (stats["replaced_total"], stats["failed_total"], stats["completed_total"]) == (1, 1, 2)


def test_memory_limit(make_pool):
    pool = make_pool(memory_bytes=300 << 20)
    assert pool.submit("small", JOBS + "_test_alloc", b"%d" % (10 << 20)).result(30) == b"10485760"
    with pytest.raises(WorkerCrashed, match="ran out of memory"):
        pool.submit("big", JOBS + "_test_alloc", b"%d" % (1 << 30)).result(30)
    assert pool.submit("next", JOBS + "_test_echo", b"ok").result(30) == b"ok"
    assert pool.stats()["replaced_total"] == 1


def test_exception_passthrough_keeps_worker(make_pool):
    pool = make_pool()
    pid = pool.submit("pid1", JOBS + "_test_pid", b"").result(30)
    with pytest.raises(CompileError) as info:
        pool.submit("raise", JOBS + "_test_raise", b"bad tile").result(30)
    assert (info.value.message, info.value.loc) == ("bad tile", "kernel.py:7")
    # a missing function under tiled. is the job's error; not allow-listed, it comes back as
    # RuntimeError naming the worker's exception type
    with pytest.raises(RuntimeError, match=r"^AttributeError: .*no_such_function") as info:
        pool.submit("missing", JOBS + "no_such_function", b"").result(30)
    assert type(info.value) is RuntimeError
    assert pool.submit("pid2", JOBS + "_test_pid", b"").result(30) == pid
    assert pool.stats()["replaced_total"] == 0


def test_foreign_errors_come_back_as_bounded_runtime_errors(make_pool):
    pool = make_pool()
    with pytest.raises(RuntimeError) as info:
        pool.submit("big", JOBS + "_test_raise_foreign", b"x" * 1_000_000).result(30)
    assert type(info.value) is RuntimeError and str(info.value).startswith("LookupError: xxx")
    assert len(str(info.value)) <= MAX_ERROR_CHARS + 100 and "characters cut" in str(info.value)


ERRORS = [
    errors.CompileError("bad tile", loc="k.py:3"),
    errors.ToolchainError("nvcc failed (1):\nerror", loc=""),
    errors.VerifyError("index out of range", path="kernel.body.stmts[2]", loc="k.py:9"),
    errors.KernelDefinitionError("no such op", "k.py", 4, 7, "    T.nope(x)"),
    errors.CompileTimeout("ran past 1 s"), errors.UnsupportedTarget("no backend 'tpu'"),
    errors.IRDecodeError("schema 9"), errors.LaunchError("shape"), errors.ConfigError("TILED_X"),
]


@pytest.mark.parametrize("exc", ERRORS, ids=lambda e: type(e).__name__)
def test_allowed_errors_cross_as_data_with_their_fields(exc):
    record = json.loads(json.dumps(error_record(exc)))  # what travels is plain JSON
    back = error_from_record(record)
    assert type(back) is type(exc) and ALLOWED_ERRORS[record["type"]] is type(exc)
    assert (str(back), back.args) == (str(exc), exc.args)


def test_error_records_rebuild_only_allow_listed_classes():
    class Subclass(errors.VerifyError):  # a subclass defined elsewhere: its nearest allowed base
        pass

    back = error_from_record(error_record(Subclass("m", path="p")))
    assert type(back) is errors.VerifyError and back.path == "p"
    for name in ("os.system", "builtins.eval", "WorkerCrashed", "TiledError", None):
        back = error_from_record({"type": name, "message": "boom"})
        assert type(back) is RuntimeError and str(back) == f"{name}: boom"
    # fields of the wrong type are dropped, never passed on
    back = error_from_record({"type": "CompileError", "message": "m", "loc": {"x": 1}})
    assert type(back) is CompileError and back.loc == ""
    assert type(error_from_record(["not", "a", "record"])) is RuntimeError


@pytest.mark.parametrize("fn", ["os:system", "subprocess:run", "tiledx.evil:f", "tiled.server.pool",
                                "tiled.server.pool_test_jobs:_test_echo; import os", ""])
def test_functions_outside_tiled_are_rejected(make_pool, fn):
    pool = make_pool()
    with pytest.raises(ValueError):
        pool.submit("k", fn, b"")


def test_shutdown_cancels_pending_and_leaves_no_processes(gate):
    events = Events()
    pool = CompilePool(workers=1, on_event=events)
    payload, open_gate = gate
    running = pool.submit("run", JOBS + "_test_gate", payload)
    events.wait_for("started")
    queued = pool.submit("queued", JOBS + "_test_echo", b"q")
    threading.Timer(0, open_gate).start()  # shutdown(wait=True) waits for the running job
    pool.shutdown(wait=True, cancel_pending=True)
    assert running.result(0) == payload
    with pytest.raises(concurrent.futures.CancelledError):
        queued.result(0)
    assert multiprocessing.active_children() == []
    with pytest.raises(RuntimeError):
        pool.submit("late", JOBS + "_test_echo", b"")


def test_shutdown_without_wait_kills_running_jobs():
    events = Events()
    pool = CompilePool(workers=2, on_event=events)
    futures = [pool.submit(f"k{i}", JOBS + "_test_sleep", b"60") for i in range(3)]
    events.wait_for("started", 2)
    pool.shutdown(wait=False)
    assert all(f.cancelled() for f in futures)
    assert multiprocessing.active_children() == []


def test_raising_event_hook_does_not_break_the_pool(make_pool):
    def hook(name, fields):
        raise RuntimeError("metrics are down")

    pool = make_pool(on_event=hook)
    assert pool.submit("k", JOBS + "_test_echo", b"ok").result(30) == b"ok"
