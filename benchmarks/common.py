"""What the daemon benchmarks share: the machine record written into every result, percentiles,
a real `tiled serve` process on a Unix socket, and the resident memory of a process tree read
from /proc (Linux only; no psutil)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    """CPU, cores, Python and the versions that decide the numbers. Versions come from package
    metadata, so nothing heavy (TVM) is imported to read them."""
    sys.path.insert(0, str(ROOT))
    import tiled

    return {
        "host": platform.node(), "cpu": cpu_model(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "versions": {"tiled": tiled.__version__, "grpcio": version("grpcio"),
                     "protobuf": version("protobuf"), "apache-tvm": version("apache-tvm"),
                     "apache-tvm-ffi": version("apache-tvm-ffi")},
        "load_average_at_start": load_average(),
    }


def header(argv: list[str]) -> dict:
    return {"command": " ".join([Path(sys.executable).name, *argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine()}


def percentiles(samples: list[float], scale: float = 1e6, unit: str = "us") -> dict:
    """p50 / p90 / p99 / mean / max of `samples` (seconds), in `unit` (`scale` per second)."""
    s = sorted(samples)
    if not s:
        return {"n": 0}

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] * scale, 1)

    return {"n": len(s), f"p50_{unit}": round(statistics.median(s) * scale, 1),
            f"p90_{unit}": at(0.90), f"p99_{unit}": at(0.99),
            f"mean_{unit}": round(statistics.fmean(s) * scale, 1), f"max_{unit}": at(1.0)}


# -- /proc ----------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """VmRSS of `pid`, 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def hwm_bytes(pid: int) -> int:
    """VmHWM (peak resident set) of `pid`, 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, found by scanning /proc/*/stat for parent ids."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def pss_bytes(pid: int) -> int:
    """Pss of `pid` (/proc/PID/smaps_rollup): its private pages plus its share of each page it
    shares (libraries, the fork server's copy-on-write pages). Summed over a process tree it is
    what the tree costs the machine. 0 when it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_memory(pid: int) -> dict:
    """RSS and PSS of `pid` and of each of its descendants (the multiprocessing fork server, the
    compile workers forked from it, a resource tracker), in MB. RSS counts a shared page in every
    process that maps it, so an RSS total overstates what the tree costs; the PSS total does
    not (each shared page is split among its sharers)."""
    procs = []
    for c in descendants(pid):
        line = cmdline(c)
        parent = _parent(c)
        role = ("resource_tracker" if "resource_tracker" in line else
                "fork_server" if "forkserver" in line and parent == pid else
                "worker" if "forkserver" in line or "spawn_main" in line else "other")
        procs.append({"pid": c, "role": role, "rss_mb": round(rss_bytes(c) / 2**20, 1),
                      "pss_mb": round(pss_bytes(c) / 2**20, 1)})
    main, main_pss = rss_bytes(pid) / 2**20, pss_bytes(pid) / 2**20
    return {"main_rss_mb": round(main, 1), "main_pss_mb": round(main_pss, 1),
            "main_hwm_mb": round(hwm_bytes(pid) / 2**20, 1),
            "workers_rss_mb": round(sum(p["rss_mb"] for p in procs if p["role"] == "worker"), 1),
            "total_rss_mb": round(main + sum(p["rss_mb"] for p in procs), 1),
            "total_pss_mb": round(main_pss + sum(p["pss_mb"] for p in procs), 1),
            "children": procs}


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rindex(")") + 2:].split()[1])


def wait_settled(pid: int, workers: int, timeout_s: float = 120.0) -> float:
    """Waits until `workers` worker processes exist and the tree's RSS has stopped growing
    (under 1% over three samples a second apart). Returns seconds waited."""
    t0 = time.monotonic()
    seen: list[float] = []
    while time.monotonic() - t0 < timeout_s:
        mem = tree_memory(pid)
        n = sum(1 for p in mem["children"] if p["role"] == "worker")
        seen = [*seen[-2:], mem["total_rss_mb"]] if n >= workers else []
        if len(seen) == 3 and max(seen) - min(seen) < 0.01 * max(seen):
            return time.monotonic() - t0
        time.sleep(1.0)
    return time.monotonic() - t0


# -- the daemon ------------------------------------------------------------------------------
class Daemon:
    """`python -m tiled.cli serve --socket PATH --workers N` with its own TILED_CACHE_DIR (a
    fresh temp dir unless given), started on enter and stopped (SIGTERM) on exit."""

    def __init__(self, workers: int = 2, cache_dir: Path | None = None,
                 env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        self.workers, self.args = workers, args
        self.base = Path(tempfile.mkdtemp(prefix="tiled-daemon-bench-"))
        self.cache_dir = cache_dir or self.base / "cache"
        self.socket = self.base / "tiled.sock"
        self.address = f"unix://{self.socket}"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(self.cache_dir),
                    **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = self.base / "daemon.log"
        self.started_s = 0.0

    def __enter__(self) -> Daemon:
        import grpc

        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tiled.cli", "serve", "--socket", str(self.socket),
             "--workers", str(self.workers), "--timeout", "600", *self.args],
            env=self.env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(channel).result(timeout=120)
        except grpc.FutureTimeoutError:
            self.proc.kill()
            raise RuntimeError(f"daemon did not start:\n{self.log.read_text()}") from None
        finally:
            channel.close()
        self.started_s = time.perf_counter() - t0
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
