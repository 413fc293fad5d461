"""What a compile worker process runs, and the bytes that cross the pool's process boundary.

Every message between the daemon and a worker is one `send_bytes` frame: a JSON header line,
then raw bytes (`encode` / `decode`). Nothing is pickled in either direction, so the daemon
never unpickles, and so never imports, anything a worker produced: a compile error raised
inside TVM arrives as data and is rebuilt only as an allow-listed tiled error class
(`ALLOWED_ERRORS`); any other exception becomes a RuntimeError "TypeName: message".

Frames, daemon -> worker:
    {"fn": "tiled.module:function", "tmp": "<the job's temp dir>"} + payload    run one job
    b"" (empty)                                                                 exit
Frames, worker -> daemon (one per job):
    {"kind": "ok", "retire": bool} + result      retire: the worker exits after this frame
    {"kind": "error", "error": <error record>}
    {"kind": "oom"}                              MemoryError: the worker exits after this frame
An error record is {"type": <class name>, "message": str, <its constructor fields>}, e.g.
{"type": "CompileError", "message": "...", "loc": "kernel.py:7"}; for a class outside the
allow-list {"type": "<module>.<qualname>", "message": str, "traceback": str}. Every text is
capped at MAX_ERROR_CHARS (fields at MAX_FIELD_CHARS), in the worker and again in the daemon.

`compile_job` is the compile itself: {"target", "options", "action"} + Tile IR program bytes
-> {"manifest", "stages"} + artifact. The program travels as Tile IR bytes and is decoded and
verified here before the compiler sees it; nothing a request contains is executed.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import traceback

from tiled.errors import (
    CompileError,
    CompileTimeout,
    ConfigError,
    IRDecodeError,
    KernelDefinitionError,
    LaunchError,
    ToolchainError,
    UnsupportedTarget,
    VerifyError,
)

ALLOWED_ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    CompileError, ToolchainError, VerifyError, CompileTimeout, UnsupportedTarget,
    KernelDefinitionError, IRDecodeError, LaunchError, ConfigError)}
# Constructor keyword fields beyond the message, per class (subclasses inherit their entry).
_FIELDS: dict[type[Exception], tuple[str, ...]] = {
    KernelDefinitionError: ("file", "line", "column", "source_line"),
    VerifyError: ("path", "loc"), CompileError: ("loc",)}
MAX_ERROR_CHARS = 4096
MAX_FIELD_CHARS = 1024
# The watchdog that shares the worker's process group: its stdin is the read end of a pipe
# whose only writer is the daemon, so when the daemon exits in any way (SIGKILL included) the
# read ends and the whole group, the worker and everything its job started, is killed.
_WATCHDOG = ["/bin/sh", "-c", "read _; kill -s KILL 0"]
_PR_SET_PDEATHSIG = 1


def encode(header: dict, body: bytes = b"") -> bytes:
    return json.dumps(header, sort_keys=True).encode() + b"\n" + body


def decode(data: bytes) -> tuple[dict, bytes]:
    """(header, body) of a frame; raises ValueError when the header is not a JSON object."""
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    if not isinstance(header, dict):
        raise ValueError("frame header is not a JSON object")
    return header, body


# -- errors as data -----------------------------------------------------------------------------

def capped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` cut in the middle to at most about `limit` characters (the head names what
    failed, the tail of a tool's output holds its error)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head - 40
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def _fields(cls: type) -> tuple[str, ...]:
    return next((_FIELDS[c] for c in cls.__mro__ if c in _FIELDS), ())


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as e:  # a broken __str__ must not lose the error itself
        return f"<str() raised {type(e).__name__}>"


def error_record(exc: BaseException) -> dict:
    """`exc` as JSON data: its nearest allow-listed class with the constructor fields, or its
    type name, text and traceback."""
    cls = next((c for c in type(exc).__mro__ if ALLOWED_ERRORS.get(c.__name__) is c), None)
    if cls is None:
        kind = type(exc)
        name = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        return {"type": name, "message": capped(_text(exc)),
                "traceback": capped("".join(traceback.format_exception(exc)))}
    message = getattr(exc, "message", None)
    if not isinstance(message, str):
        message = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) \
            else _text(exc)
    record: dict = {"type": cls.__name__, "message": capped(message)}
    for name in _fields(cls):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            record[name] = capped(value, MAX_FIELD_CHARS)
        elif isinstance(value, int) and not isinstance(value, bool):
            record[name] = value
    return record


def error_from_record(record: object) -> Exception:
    """The exception an error record describes: an allow-listed tiled error with its fields,
    else RuntimeError("TypeName: message"). Never imports anything; never raises."""
    if not isinstance(record, dict):
        return RuntimeError(f"compile worker sent an unreadable error: {capped(repr(record))}")
    name, message = str(record.get("type"))[:200], record.get("message")
    message = capped(message) if isinstance(message, str) else capped(repr(message))
    cls = ALLOWED_ERRORS.get(name)
    if cls is not None:
        fields: dict[str, str | int] = {}
        for field in _fields(cls):
            value = record.get(field)
            if isinstance(value, str):
                fields[field] = capped(value, MAX_FIELD_CHARS)
            elif isinstance(value, int) and not isinstance(value, bool):
                fields[field] = value
        try:
            return cls(message, **fields)
        except TypeError:  # a record that does not fit the class: keep its text
            pass
    return RuntimeError(capped(f"{name}: {message}"))


# -- the worker process -------------------------------------------------------------------------

def private_bytes() -> int:
    """This process's private resident memory (pages no other process shares), 0 if unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) * 1024 for line in f
                       if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except OSError:
        return 0


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: SIGKILL this process when its parent (the fork server) exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone covers the daemon's death
        pass


def _start_watchdog(lifeline) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(_WATCHDOG, stdin=lifeline.fileno(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError as e:
        print(f"tiled compile worker {os.getpid()}: no watchdog ({e}); a SIGKILLed daemon may "
              "leave this worker's processes running", file=sys.stderr)
        return None


def serve(conn, lifeline, memory_bytes: int | None, recycle_bytes: int | None,
          forked: bool) -> None:
    """The worker's main loop (a multiprocessing target): one job frame in, one answer out.
    `lifeline` is the read end of the daemon's pipe for this worker; `forked`: started by the
    fork server (then the fork server's death kills us too)."""
    os.setsid()  # lead a new group (and session: no terminal job control) before starting any
    if forked:
        _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the daemon: the parent stops us
    _watchdog = _start_watchdog(lifeline)  # kept for as long as this process lives
    lifeline.close()
    importlib.import_module("tiled.compiler")  # pay the import cost once per worker
    if memory_bytes is not None:  # inherited by every child (nvcc, cicc, ptxas, cc, ld)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    default_tmp = os.environ.get("TMPDIR"), tempfile.tempdir
    while True:
        try:
            frame = conn.recv_bytes()
        except (EOFError, OSError):  # the daemon went away
            return
        if not frame:
            return
        try:
            header, payload = decode(frame)
            _enter_job_dir(header["tmp"])
            module, _, name = header["fn"].partition(":")
            result = getattr(importlib.import_module(module), name)(payload)
            if not isinstance(result, bytes):
                raise TypeError(f"{header['fn']} returned {type(result).__name__}, not bytes")
            retire = recycle_bytes is not None and private_bytes() > recycle_bytes
            conn.send_bytes(encode({"kind": "ok", "retire": retire}, result))
            if retire:  # a compile's heap stays mapped: a fresh fork is smaller
                return
        except MemoryError:
            conn.send_bytes(encode({"kind": "oom"}))
            return  # the heap may be in a bad state: the pool replaces us
        except Exception as exc:
            conn.send_bytes(encode({"kind": "error", "error": error_record(exc)}))
        finally:
            _leave_job_dir(*default_tmp)


def _enter_job_dir(path: str) -> None:
    """Temp files of this job go to `path`: Python's tempfile (which caches its first answer
    in `tempfile.tempdir`) and every child, through TMPDIR (nvcc's tmpxft files, cc, LLVM)."""
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path


def _leave_job_dir(tmpdir_env: str | None, tempdir: str | None) -> None:
    if tmpdir_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir_env
    tempfile.tempdir = tempdir


COMPILE_JOB = "tiled.server.worker:compile_job"


def compile_payload(program, target, options: dict, action_record: dict) -> bytes:
    """compile_job's payload for `program` compiled for `target` under its action record."""
    return encode({"target": str(target), "options": options, "action": action_record},
                  program.to_bytes())


def compiled_entry(key: str, result: bytes):
    """(the cache Entry of compile_job's answer filed under `key`, its stages' seconds)."""
    from tiled.cache.entry import Entry, sha256_hex

    header, artifact = decode(result)
    entry = Entry(key, header["manifest"].encode(), {sha256_hex(artifact): artifact})
    return entry, header.get("stages", {})


def compile_job(payload: bytes) -> bytes:
    """payload: {"target", "options", "action"} + program bytes -> {"manifest", "stages"} +
    artifact."""
    from tiled.compiler import compile_program
    from tiled.ir.program import Program

    header, program_bytes = decode(payload)
    program = Program.from_bytes(program_bytes)
    compiled = compile_program(program, header["target"], action=header.get("action"),
                               **header["options"])
    return encode({"manifest": compiled.manifest.to_json(), "stages": compiled.stages},
                  compiled.artifact)
