"""The compile pool's temp directories, and the start-up sweep that clears up after pools that
died.

Layout: `temp_root` (by default `<tempfile.gettempdir()>/tiled-jobs-<uid>`; 0700 and this
user's, refused otherwise: `private_dir`) holds one directory per pool,
`pool-<pid>-<start time>-<PID namespace>-<random>` (0700, `make_pool_dir`), which holds one
`job-<n>` directory per job (0700, `make_job_dir`): the job's TMPDIR.

A pool directory's name says whose it is. Its pool is dead when no process of that pid and
start time runs in this PID namespace (tiled.server.procgroups); then `sweep_temp_root` may
remove it. Another namespace's pids cannot be checked from here, so its directories are left
alone, and so is any name this module did not make. Before it removes a dead pool's
directories the sweep kills what still runs in them: a job's children inherit TMPDIR, so a
process that escaped its group, or outlived a watchdog killed from outside
(tiled.server.worker), is found by the TMPDIR in its environment.

Removing is best effort: `remove_tree` takes what is already gone as removed and logs any other
failure instead of raising; the next pool's sweep tries again.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
from pathlib import Path

from tiled.server.procgroups import (
    HAVE_PROCFS,
    kill_group,
    pid_namespace,
    proc_stat,
    process_alive,
    start_time,
)

log = logging.getLogger(__name__)
_POOL_DIR = re.compile(r"pool-(\d+)-(\d+)-(\d+)-[0-9a-f]+")


def default_temp_root() -> Path:
    return Path(tempfile.gettempdir()) / f"tiled-jobs-{os.getuid()}"


def private_dir(path: Path) -> Path:
    """`path` as a directory of this user's that nobody else may enter (created 0700). Raises
    PermissionError for a symlink, a non-directory or another user's directory."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # a file (or a link to one) is there: refused below
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"compile temp root {path} is not a directory of uid {os.getuid()}"
                              "; remove it, or point TMPDIR elsewhere")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def make_pool_dir(root: Path) -> Path:
    """A new directory under `root` for a pool of this process, named as the sweep reads it."""
    pid = os.getpid()
    path = root / f"pool-{pid}-{start_time(pid) or 0}-{pid_namespace()}-{secrets.token_hex(4)}"
    path.mkdir(mode=0o700)
    return path


def make_job_dir(root: Path, pool_dir: Path, n: int) -> Path:
    """Makes `pool_dir/job-<n>` (0700) and returns it. When a temp cleaner removed `pool_dir`,
    makes it again (and `root`, as `private_dir` does). Raises OSError when that fails."""
    path = pool_dir / f"job-{n}"
    try:
        path.mkdir(mode=0o700)
    except FileNotFoundError:  # a temp cleaner removed the pool's directory: make it again
        private_dir(root)
        pool_dir.mkdir(mode=0o700, exist_ok=True)
        path.mkdir(mode=0o700)
    return path


def remove_tree(path: Path) -> None:
    def missing_is_fine(_func, _path, exc_info):
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    try:
        shutil.rmtree(path, onerror=missing_is_fine)
    except OSError as e:
        log.warning("could not remove %s (the next pool start sweeps it): %s", path, e)


def _kill_processes_in(dirs: list[Path]) -> None:
    """Kills every process of this user whose TMPDIR lies in one of `dirs` (what a killed
    daemon's job left running: a job's children inherit TMPDIR), with its whole group when the
    group's leader is gone or is such a process too (a dead worker's group)."""
    prefixes = tuple(f"TMPDIR={d}/".encode() for d in dirs)
    found: dict[int, int] = {}  # pid -> pgid
    for name in os.listdir("/proc") if HAVE_PROCFS else ():
        try:
            if not name.isdigit() or os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        fields = proc_stat(int(name))
        if fields is not None and any(v.startswith(prefixes) for v in env):
            found[int(name)] = int(fields[2])
    for pid, pgid in found.items():
        leader = proc_stat(pgid)
        if pgid not in (0, 1, os.getpgrp()) and (pgid in found or leader is None
                                                  or leader[0] in ("Z", "X")):
            log.warning("killing process group %d left running by a dead compile pool", pgid)
            kill_group(pgid)
        else:
            log.warning("killing process %d left running by a dead compile pool", pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def sweep_temp_root(root: Path) -> list[Path]:
    """Removes the directories under `root` of pools whose process is gone, after killing what
    still runs in them; returns them. A live pool's directories, another PID namespace's and
    names this module did not make are left alone."""
    namespace, dead = pid_namespace(), []
    with os.scandir(root) as entries:
        for entry in entries:
            m = _POOL_DIR.fullmatch(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False):
                continue
            pid, started, ns = map(int, m.groups())
            if ns == namespace and not process_alive(pid, started):
                dead.append(Path(entry.path))
    if dead:
        _kill_processes_in(dead)
        for path in dead:
            remove_tree(path)
        log.info("removed %d temp directories of compile pools that are gone", len(dead))
    return dead
