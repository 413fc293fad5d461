"""Process groups and process identity, read from procfs: which members of a group still run,
killing a group and waiting until it is gone, and telling a process from a later one that got
its pid.

A compile worker leads its own process group, so everything a job starts (nvcc, cicc, ptxas,
fatbinary, the C compiler, ld) ends with one `kill_group` (tiled.server.pool). A pid alone may
be reused; (pid, start time) names one process, within one PID namespace (`pid_namespace`).

Without procfs (`HAVE_PROCFS` false) the checks are coarser but never err towards a kill or a
delete: a group that still answers signal 0 counts as running, and a live pid is taken for the
process asked about. Nothing here holds state; every function may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time

log = logging.getLogger(__name__)
HAVE_PROCFS = os.path.isdir("/proc/self")  # without: fewer checks, never a wrong kill or delete


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...); None
    when the process is gone or procfs cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot); None when it is gone."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields is not None else None


def pid_namespace() -> int:
    """This process's PID namespace (the inode of /proc/self/ns/pid); 0 when unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_alive(pid: int, started: int) -> bool:
    """Whether the process `pid` that started at `started` (as `start_time` reads it) still
    runs; a later process with the same pid is not it."""
    if HAVE_PROCFS:
        return start_time(pid) == started
    try:  # no start times to compare: a live pid is taken for the process asked about
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def group_members(pgid: int) -> list[int]:
    """Pids of the processes of group `pgid` that have not exited (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:  # a member we may not signal: still look for it
        pass
    if not HAVE_PROCFS:
        return [pgid]  # somebody is left; zombies cannot be told apart here
    members = []
    for name in os.listdir("/proc"):
        fields = proc_stat(int(name)) if name.isdigit() else None
        if fields is not None and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(name))
    return members


def _wait_any_exit(pids: list[int], timeout: float) -> None:
    """Returns when one of `pids` has exited (a pidfd turns readable) or after `timeout`."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return
        poll = select.poll()
        for fd in fds:
            poll.register(fd, select.POLLIN)
        poll.poll(timeout * 1000)
    except (AttributeError, OSError):  # no pidfd (kernel < 5.3): look again shortly
        time.sleep(min(timeout, 0.01))
    finally:
        for fd in fds:
            os.close(fd)


def kill_group(pgid: int, wait_s: float = 5.0) -> bool:
    """SIGKILLs every process of group `pgid` and waits until none runs; False (logged) when
    some member still ran after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)  # again each round: a member may have forked
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        members = group_members(pgid)
        left = deadline - time.monotonic()
        if not members:
            return True
        if left <= 0:
            log.warning("process group %d: %s still running %.0f s after SIGKILL", pgid,
                        members, wait_s)
            return False
        _wait_any_exit(members, min(left, 0.5))
