"""CompilePool's process groups and temp directories, with real processes and real compiles.

A CUDA compile whose nvcc is a wrapper script (TILED_NVCC) that leaves a tmpxft file, starts a
grandchild that sleeps and then blocks is ended by a timeout, a cancellation, a worker crash,
pool shutdown and a SIGKILL of the daemon itself; afterwards no process of the worker's group
runs (checked in /proc) and no temp file is left. The wrapper reports its pids through a FIFO
once it runs: that is the synchronization, never a sleep in the test."""

import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from multiprocessing import forkserver
from pathlib import Path

import grpc
import pytest

import tiled
import tiled.lang as T
from tests.daemon_util import start_daemon
from tests.server.test_pool import JOBS, Events
from tiled.errors import CompileTimeout, WorkerCrashed
from tiled.server.pool import CompilePool
from tiled.server.worker import encode
from tiled.v1 import compile_pb2 as cpb

REAL_NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
needs_nvcc = pytest.mark.skipif(not os.path.exists(REAL_NVCC), reason="needs nvcc")
PRELOAD = ("tiled.server.preload",)  # as the daemon: workers fork with the compiler loaded


def scale_kernel(scale: float):
    """A small CUDA-able kernel; each `scale` is a different program (a cache miss)."""
    @tiled.kernel
    def scale_by(A: T.Tensor((256,), "float32"), B: T.Tensor((256,), "float32")):
        with T.Kernel(2, threads=128) as bx:
            for i in T.Parallel(128):
                B[bx * 128 + i] = A[bx * 128 + i] * scale

    return scale_by


def compile_payload(scale: float) -> bytes:
    program = scale_kernel(scale).ir
    return encode({"target": "cuda:sm_90a", "options": {}, "action": None}, program.to_bytes())


# -- the process table ---------------------------------------------------------------------------

def proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its reaper."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group(pgid: int) -> list[int]:
    """Every process of group `pgid` that has not exited (zombies do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_exited(pids: list[int], timeout: float = 20.0) -> None:
    """Blocks until every pid has exited (pidfds turn readable), failing after `timeout`."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    try:
        poll = select.poll()
        for fd in fds:
            poll.register(fd, select.POLLIN)
        left = set(fds)
        while left:
            ready = poll.poll(timeout * 1000)
            assert ready, f"processes {pids} still running after {timeout} s"
            for fd, _ in ready:
                poll.unregister(fd)
                left.discard(fd)
    finally:
        for fd in fds:
            os.close(fd)


# -- the slow nvcc ---------------------------------------------------------------------------------

class SlowNvcc:
    """TILED_NVCC for tests. `--version` is the real nvcc's; a compile fails when the file
    `fail` exists, else it leaves a tmpxft file in its TMPDIR, starts `sleep 600`, writes
    "<its pid> <sleep's pid> <TMPDIR>" to the FIFO `started` and waits (it never finishes)."""

    def __init__(self, base: Path):
        self.fifo, self.fail_marker, self.script = base / "started", base / "fail", base / "nvcc"
        os.mkfifo(self.fifo)
        self.script.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            case "$1" in --version) exec {REAL_NVCC} "$@";; esac
            if [ -e {self.fail_marker} ]; then echo "slow nvcc: failing on purpose" >&2; exit 3; fi
            touch "$TMPDIR/tmpxft_tiled_test_$$"
            sleep 600 &
            echo "$$ $! $TMPDIR" > {self.fifo}
            wait
            """))
        self.script.chmod(0o755)
        # O_RDWR: this process is a writer too, so the FIFO never reads as closed meanwhile
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)

    def started(self, timeout: float = 60.0) -> tuple[int, int, int, Path]:
        """Waits for a compile to reach the wrapper: (wrapper pid, sleep pid, their process
        group, the wrapper's TMPDIR)."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        assert ready, f"nvcc was not started within {timeout} s"
        wrapper, sleeper, tmp = os.read(self._fd, 4096).decode().split()
        fields = proc_stat(int(wrapper))
        assert fields is not None, "the wrapper exited before it was seen"
        return int(wrapper), int(sleeper), int(fields[2]), Path(tmp)

    def close(self):
        os.close(self._fd)


@pytest.fixture
def slow_nvcc(tmp_path, monkeypatch):
    nvcc = SlowNvcc(tmp_path)
    monkeypatch.setenv("TILED_NVCC", str(nvcc.script))
    monkeypatch.setenv("TILED_CUDA_COMPILER", "nvcc")
    # The fork server copies the environment once, when it starts: start a fresh one that
    # sees TILED_NVCC, and stop it afterwards so that no later test inherits the wrapper.
    forkserver._forkserver._stop()
    yield nvcc
    forkserver._forkserver._stop()
    nvcc.close()


def assert_clean(pool: CompilePool, wrapper: int, sleeper: int, pgid: int, tmp: Path):
    assert pgid not in (os.getpgrp(), 0, 1)
    assert group(pgid) == [], f"group {pgid} still runs"
    assert not running(wrapper) and not running(sleeper)
    assert not tmp.exists()
    left = list(pool.temp_dir.iterdir()) if pool.temp_dir.exists() else []
    assert left == [], left


# -- the kill paths --------------------------------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("how", ["timeout", "cancel", "crash", "shutdown"])
def test_killed_cuda_compile_leaves_no_process_and_no_temp_file(how, slow_nvcc, tmp_path):
    events = Events()
    pool = CompilePool(workers=1, preload=PRELOAD, on_event=events, temp_root=tmp_path / "jobs")
    try:
        # 5 s: the compile reaches nvcc in about 0.3 s once the worker is up (10x margin)
        future = pool.submit("k", "tiled.server.worker:compile_job", compile_payload(2.0),
                             timeout_s=5.0 if how == "timeout" else 120.0)
        wrapper, sleeper, pgid, tmp = slow_nvcc.started()
        assert tmp.parent.parent == pool.temp_dir and tmp.name.startswith("tiled-nvcc-")
        assert any(p.name.startswith("tmpxft_") for p in tmp.iterdir())
        assert pgid != os.getpgrp() and running(pgid)  # the worker leads the group
        if how == "timeout":
            with pytest.raises(CompileTimeout):
                future.result(60)
        elif how == "cancel":
            assert future.cancel()
            events.wait_for("finished")
        elif how == "crash":
            os.kill(pgid, signal.SIGKILL)  # the worker alone: its children must not outlive it
            with pytest.raises(WorkerCrashed, match="signal 9"):
                future.result(60)
        else:
            pool.shutdown(wait=False)
            assert future.cancelled() and not pool.temp_dir.exists()
        assert_clean(pool, wrapper, sleeper, pgid, tmp)
        if how != "shutdown":
            reason = {"crash": "crashed", "cancel": "cancelled"}.get(how, how)
            assert ("replaced", {"reason": reason}) in events.seen
            assert pool.submit("next", JOBS + "_test_echo", b"ok").result(60) == b"ok"
    finally:
        pool.shutdown(wait=False)
    assert not pool.temp_dir.exists()


# -- the daemon ------------------------------------------------------------------------------------

def mapped_tvm(pid: int) -> list[str]:
    """The TVM libraries (libtvm*, tvm_ffi's extension) mapped into process `pid`."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if "libtvm" in line or "tvm_ffi" in line})


@needs_nvcc
def test_daemon_keeps_tvm_out_and_its_sigkill_takes_the_compiles_along(
        slow_nvcc, tmp_path, monkeypatch, library_memo):
    """A real `tiled serve`: a compile that fails inside the worker comes back as data (no TVM
    in the daemon); then a compile in nvcc, and the daemon is SIGKILLed: the worker's whole
    group dies with it, and the next pool's start-up sweep removes the dead daemon's dirs."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the daemon's temp root
    d = start_daemon(tmp_path / "daemon", "--workers", "1", library_memo=library_memo)
    try:
        slow_nvcc.fail_marker.touch()
        with pytest.raises(grpc.RpcError) as e:
            d["stub"].Compile(cpb.CompileRequest(program=scale_kernel(3.0).ir.proto,
                                                 target="cuda:sm_90a"), timeout=120)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert "slow nvcc: failing on purpose" in e.value.details()  # the worker's ToolchainError
        assert mapped_tvm(d["proc"].pid) == []

        slow_nvcc.fail_marker.unlink()
        pending = d["stub"].Compile.future(
            cpb.CompileRequest(program=scale_kernel(4.0).ir.proto, target="cuda:sm_90a"),
            timeout=120)
        wrapper, sleeper, pgid, tmp = slow_nvcc.started()
        pool_dir = tmp.parent.parent
        assert pool_dir.parent == tmp_path / "tmp" / f"tiled-jobs-{os.getuid()}"
        servers = [p for p in group(os.getpgrp())  # the fork server
                   if (proc_stat(p) or ["", ""])[1] == str(d["proc"].pid)]
        assert servers
        d["proc"].kill()
        d["proc"].wait(30)
        with pytest.raises(grpc.RpcError):
            pending.result(60)
        wait_exited([pgid, wrapper, sleeper, *servers])  # watchdog, PR_SET_PDEATHSIG
        assert group(pgid) == []
        assert pool_dir.exists()  # nobody removed it: the next start does
        pool = CompilePool(workers=1, temp_root=pool_dir.parent)
        try:
            assert not pool_dir.exists() and pool.temp_dir.exists()
        finally:
            pool.shutdown(wait=False)
    finally:
        d["channel"].close()
        if d["proc"].poll() is None:
            d["proc"].kill()
            d["proc"].wait(30)


def test_an_error_raised_inside_tvm_does_not_load_tvm_in_the_daemon(tmp_path):
    """A daemon-like process (no TVM imported) whose job fails inside TVM's C++ code gets a
    RuntimeError naming tvm.error.InternalError, and still has no TVM (modules, mappings)."""
    code = textwrap.dedent("""\
        import json, sys
        from tiled.server.pool import CompilePool
        pool = CompilePool(workers=1, preload=("tiled.server.preload",), temp_root=sys.argv[1])
        try:
            pool.submit("k", "tiled.compiler.pool_probe:_test_raise_tvm", b"").result(120)
        except Exception as e:
            error = [type(e).__name__, str(e)]
        pool.shutdown()
        maps = open("/proc/self/maps").read()
        print(json.dumps({"error": error, "modules": sorted(
            m for m in sys.modules if m.split(".")[0] in ("tvm", "tvm_ffi")),
            "mapped": "libtvm" in maps or "tvm_ffi" in maps}))
        """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "jobs")], check=True,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    result = json.loads(out.stdout.splitlines()[-1])
    kind, message = result["error"]
    assert kind == "RuntimeError"
    assert message.startswith("tvm.error.InternalError: ") and "Divide by zero" in message
    assert (result["modules"], result["mapped"]) == ([], False)


# -- the temp root ---------------------------------------------------------------------------------

def test_jobs_run_in_private_temp_dirs_removed_after_each_job(tmp_path):
    pool = CompilePool(workers=1, temp_root=tmp_path / "jobs")
    try:
        assert stat.S_IMODE(pool.temp_root.stat().st_mode) == 0o700
        assert stat.S_IMODE(pool.temp_dir.stat().st_mode) == 0o700
        seen = [json.loads(pool.submit(f"t{i}", JOBS + "_test_tmp", b"x").result(60))
                for i in range(2)]
        for where in seen:
            job = Path(where["tempfile"])
            assert job.parent == pool.temp_dir and where["TMPDIR"] == where["child"] == str(job)
            assert Path(where["file"]).parent == job and not job.exists()
        assert seen[0]["tempfile"] != seen[1]["tempfile"]  # one directory per job
        assert list(pool.temp_dir.iterdir()) == []
    finally:
        pool.shutdown()
    assert not pool.temp_dir.exists() and pool.temp_root.exists()


def test_start_up_sweep_removes_only_the_dirs_of_dead_pools(tmp_path):
    root = tmp_path / "jobs"
    live = CompilePool(workers=1, temp_root=root)
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
        exited = subprocess.Popen(["true"])
        exited.wait()
        dead = [root / f"pool-{exited.pid}-12345-{ns}-0badf00d",  # its process is gone
                root / f"pool-{os.getpid()}-1-{ns}-deadbeef"]  # pid reused by a newer process
        kept = [root / f"pool-{exited.pid}-12345-{ns + 1}-00000000",  # another PID namespace
                root / "not-a-pool", live.temp_dir]
        for path in dead + kept:
            (path / "job-1").mkdir(parents=True, exist_ok=True)
            (path / "job-1" / "tmpxft_left").write_bytes(b"x")
        # a compile child left running by the dead pool, in a group of its own
        straggler = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                     env={**os.environ, "TMPDIR": str(dead[0] / "job-1")})
        swept = CompilePool(workers=1, temp_root=root)
        try:
            assert straggler.wait(30) == -signal.SIGKILL
            assert [p.exists() for p in dead] == [False, False]
            assert all((p / "job-1" / "tmpxft_left").exists() for p in kept)
        finally:
            swept.shutdown()
    finally:
        live.shutdown()
        if straggler.poll() is None:
            straggler.kill()


def test_a_temp_root_that_is_not_private_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="not a directory of uid"):
        CompilePool(workers=1, temp_root=tmp_path / "link")
    lax = tmp_path / "lax"
    lax.mkdir(mode=0o777)
    lax.chmod(0o777)
    pool = CompilePool(workers=1, temp_root=lax)  # ours, but open to others: made private
    try:
        assert stat.S_IMODE(lax.stat().st_mode) == 0o700
    finally:
        pool.shutdown()
