"""`tiled serve`: the daemon process. A gRPC server on a Unix socket (mode 0600) and optionally
on TCP (TLS, bearer token), the compile worker pool, the cache, health, reflection, metrics.

Start-up refuses (ServeRefused: one line, exit 2) rather than guess: the socket's directory must
be the daemon user's own and closed to others (it is created 0700 when missing); nothing at the
socket path is deleted unless it is a stale socket (a live daemon there, a file, a directory or a
symlink is an error); `--tcp` needs a non-empty token file and TLS unless `--insecure-no-auth`
says otherwise out loud. docs/daemon.md is the operator's account of these rules.

Front end: one handler pool serves both listeners, with `max_waiting + RESERVE_THREADS` threads.
The service lets at most `max_waiting` requests wait for compiles, so RESERVE_THREADS threads
are always left for cache hits, health checks and status, however many compiles are queued.

Shutdown (SIGTERM / SIGINT): stop accepting, let in-flight RPCs finish for `grace` seconds,
cancel queued compiles, stop the workers, remove the socket if it is still the one this process
bound. The cache needs no shutdown step: every entry is published atomically, so it is
consistent at any instant.
"""

from __future__ import annotations

import errno
import faulthandler
import fcntl
import hmac
import json
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from tiled.errors import TiledError
from tiled.server import heap
from tiled.server.pool import DEFAULT_MEMORY_BYTES, DEFAULT_TIMEOUT_S

log = logging.getLogger("tiled.server")
RESERVE_THREADS = 32  # handler threads no waiting compile can take: hits, health, status


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (structured logs)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname,
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class ServeRefused(TiledError, RuntimeError):
    """The daemon will not start as asked; the message says why and what to change."""


@dataclass
class ServeOptions:
    socket: str
    tcp: str | None = None  # host:port
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    insecure_no_auth: bool = False  # serve --tcp without a token (logged as a warning)
    workers: int | None = None
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"  # 0.0.0.0 in a container, for a scraper outside it
    compile_timeout_s: float = DEFAULT_TIMEOUT_S  # sized from measured compiles (pool.py)
    memory_bytes: int | None = DEFAULT_MEMORY_BYTES  # per-worker RLIMIT_AS; None: no limit
    queue_limit: int = 256
    max_waiting: int | None = None  # requests waiting on compiles; None: queue_limit + workers
    max_request_bytes: int = 64 << 20
    grace_s: float = 10.0
    recycle_bytes: int | None = 64 << 20  # replace a worker whose own memory grew past this
    idle_stop_s: float | None = 300.0  # stop the compile processes after this long idle


class _TokenInterceptor(grpc.ServerInterceptor):
    """Rejects TCP calls without `authorization: Bearer <token>` (the Unix socket relies on
    its file mode instead). The comparison takes the same time wherever the first wrong byte
    is, so the token cannot be guessed a byte at a time."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(given, str):
            given = given.encode("utf-8", "replace")
        if hmac.compare_digest(given, self.expected):
            return continuation(details)
        return self._deny


def _grpc_server(opts: ServeOptions, service, interceptors: list,
                 handlers: futures.ThreadPoolExecutor) -> grpc.Server:
    """A gRPC server with the Compiler service, health (one name per backend) and reflection,
    running its handlers on `handlers` (shared by every listener)."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from tiled.server.service import add_to_server
    from tiled.v1 import compile_pb2

    msg_opts = [("grpc.max_receive_message_length", opts.max_request_bytes),
                ("grpc.max_send_message_length", 4 << 20)]
    server = grpc.server(handlers, options=msg_opts, interceptors=interceptors)
    add_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    serving = health_pb2.HealthCheckResponse.SERVING
    health_servicer.set("", serving)
    health_servicer.set("tiled.v1.Compiler", serving)
    for backend in ("cpu", "cuda", "rocm", "metal"):
        health_servicer.set(f"tiled.v1.Compiler/{backend}", serving)
    names = (compile_pb2.DESCRIPTOR.services_by_name["Compiler"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    return server


# -- the Unix socket ---------------------------------------------------------------------------

def _check_socket_dir(d: Path) -> None:
    """Refuses a socket directory another user could tamper with: it must be a directory owned
    by this user (a symlink to one is followed only when the link itself is this user's or
    root's), with no write permission for group or others. Whoever can write the directory can
    replace the socket, and clients load what the socket sends them."""
    uid = os.geteuid()
    try:
        link = os.lstat(d)
        st = os.stat(d)
    except FileNotFoundError:
        raise ServeRefused(f"socket directory {d} does not exist") from None
    except OSError as e:
        raise ServeRefused(f"socket directory {d}: {e.strerror}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, uid):
        raise ServeRefused(f"socket directory {d} is a symlink owned by uid {link.st_uid}, "
                           "who could point it elsewhere; use a directory of your own")
    if not stat.S_ISDIR(st.st_mode):
        raise ServeRefused(f"socket directory {d} is not a directory")
    if st.st_uid != uid:
        raise ServeRefused(f"socket directory {d} belongs to uid {st.st_uid}, not this user "
                           f"({uid}): its owner could replace the socket; remove it or pass "
                           "--socket in a directory of your own")
    if st.st_mode & 0o022:
        raise ServeRefused(f"socket directory {d} is writable by group or others (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}): run chmod go-w {d}, or pass "
                           "--socket in a directory of your own")


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket at `path` (a live daemon)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as e:  # EAGAIN (backlog full), a timeout: alive, only busy
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()


class UnixSocket:
    """The daemon's claim on its socket path, from before the bind to after the unlink.

    `claim()` makes or checks the directory, takes `PATH.lock` (flock, held while the process
    lives: two daemons starting at once cannot both pass the checks below), and clears the path:
    absent is fine, a stale socket (nothing answers) is removed, anything else is refused.
    gRPC binds `bind_path` (a name of this process's own in the same directory) and `bound()`
    renames that socket onto the path, recording its inode: gRPC unlinks whatever socket is at
    the path it bound when it stops, and that path is then empty. `remove()` unlinks the path
    only while it is still that inode, so a daemon never deletes a socket another one created.
    The lock file stays (removing it would let a third daemon lock a fresh file while a second
    holds the old one).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(os.path.abspath(path))
        self.bind_path = self.path.with_name(f".{os.getpid()}.sock")
        self._lock_fd = -1
        self._ident: tuple[int, int] | None = None

    def claim(self) -> None:
        d = self.path.parent
        if not os.path.lexists(d):
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                d.mkdir(mode=0o700)
            except FileExistsError:  # created meanwhile, maybe by someone else: checked below
                pass
        _check_socket_dir(d)
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            self._lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServeRefused(f"another tiled serve holds {lock}: it serves {self.path}; stop "
                               "it first, or pass another --socket") from None
        except OSError as e:
            raise ServeRefused(f"cannot lock {lock}: {e.strerror}") from None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        what = self.path
        if stat.S_ISLNK(st.st_mode):
            raise ServeRefused(f"{what} is a symlink (to {os.readlink(what)}); refusing to use "
                               "or delete it: remove it, or pass --socket another path")
        if stat.S_ISDIR(st.st_mode):
            raise ServeRefused(f"{what} is a directory; --socket names the socket file itself")
        if not stat.S_ISSOCK(st.st_mode):
            raise ServeRefused(f"{what} exists and is not a socket; not deleting it: remove it, "
                               "or pass --socket another path")
        if _answers(self.path):
            raise ServeRefused(f"a daemon is already listening on {what}; stop it first, or "
                               "pass --socket another path")
        log.info("removing stale socket %s (nothing listens on it)", what)
        self.path.unlink()

    def bound(self) -> None:
        st = os.lstat(self.bind_path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise ServeRefused(f"{self.bind_path} is not the socket this daemon bound")
        os.rename(self.bind_path, self.path)  # atomic: clients see no socket, then this one
        self._ident = (st.st_dev, st.st_ino)

    def remove(self) -> None:
        if self._ident is None:
            return
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._ident:
            self.path.unlink()
        else:
            log.warning("%s is no longer the socket this daemon bound; leaving it", self.path)
        self._ident = None


# -- TCP ---------------------------------------------------------------------------------------

def _check_tcp_options(opts: ServeOptions) -> str | None:
    """The bearer token TCP calls must carry (None: --insecure-no-auth), after refusing every
    combination that would serve the network weaker than asked or than a client assumes."""
    tls = bool(opts.tls_cert or opts.tls_key)
    if not opts.tcp:
        extra = [f for f, v in (("--tls-cert", opts.tls_cert), ("--tls-key", opts.tls_key),
                                ("--token-file", opts.token_file),
                                ("--insecure-no-auth", opts.insecure_no_auth)) if v]
        if extra:
            raise ServeRefused(f"{', '.join(extra)} only apply to --tcp (the Unix socket is "
                               "protected by its file mode)")
        return None
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise ServeRefused("--tls-cert and --tls-key go together")
    if opts.insecure_no_auth:
        if opts.token_file:
            raise ServeRefused("--insecure-no-auth and --token-file contradict each other")
        log.warning("INSECURE: --tcp %s serves anyone who can reach it, with no token%s: they "
                    "can compile and fetch kernels (--insecure-no-auth)", opts.tcp,
                    "" if tls else " and no TLS (traffic is plaintext)")
        return None
    if not opts.token_file:
        raise ServeRefused(f"--tcp {opts.tcp} needs --token-file (and --tls-cert/--tls-key): "
                           "without a token anyone who can reach the port may compile; pass "
                           "--insecure-no-auth to allow that explicitly")
    if not tls:
        raise ServeRefused("--token-file needs --tls-cert and --tls-key: a bearer token must "
                           "not cross the network in plaintext (clients refuse to send it)")
    try:
        text = Path(opts.token_file).read_text()
        mode = stat.S_IMODE(os.stat(opts.token_file).st_mode)
    except (OSError, UnicodeDecodeError) as e:
        raise ServeRefused(f"--token-file {opts.token_file}: {getattr(e, 'strerror', e)}") \
            from None
    token = text.strip()
    if not token:
        raise ServeRefused(f"--token-file {opts.token_file} is empty: an empty token would "
                           "let every caller in")
    if mode & 0o077:
        log.warning("token file %s is readable by group or others (mode %04o)",
                    opts.token_file, mode)
    return token


def _tls_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as e:
        raise ServeRefused(f"TLS: {e.filename}: {e.strerror}") from None
    return grpc.ssl_server_credentials([pair])


def build_server(opts: ServeOptions):
    """Creates (servers, service, pool, metrics, metrics_http, unix_socket) without starting the
    servers: one on the Unix socket, and one on TCP when asked for. They are separate servers
    because the TCP one alone checks the bearer token; both serve the same service, pool and
    cache, on one handler pool. Raises ServeRefused before starting anything when the options,
    the socket path or a port are not usable."""
    from tiled.cache.tiered import open_default_cache
    from tiled.server.metrics import Metrics
    from tiled.server.pool import CompilePool
    from tiled.server.service import CompilerService

    token = _check_tcp_options(opts)
    creds = _tls_credentials(opts.tls_cert, opts.tls_key) \
        if opts.tcp and opts.tls_cert and opts.tls_key else None
    unix = UnixSocket(opts.socket)
    unix.claim()
    metrics = Metrics()
    pool = CompilePool(workers=opts.workers, timeout_s=opts.compile_timeout_s,
                       memory_bytes=opts.memory_bytes, queue_limit=opts.queue_limit,
                       on_event=metrics.pool_event, preload=("tiled.server.preload",),
                       recycle_bytes=opts.recycle_bytes, idle_stop_s=opts.idle_stop_s)
    try:
        max_waiting = opts.max_waiting if opts.max_waiting is not None else \
            opts.queue_limit + pool.workers
        cache = open_default_cache(events=metrics.cache_events())
        service = CompilerService(cache, pool, metrics, max_request_bytes=opts.max_request_bytes,
                                  compile_timeout_s=opts.compile_timeout_s,
                                  max_waiting=max_waiting)
        metrics.set_limits(pool.workers, opts.queue_limit, max_waiting)
        handlers = futures.ThreadPoolExecutor(max_workers=max_waiting + RESERVE_THREADS,
                                              thread_name_prefix="tiled-rpc")
        servers = [_grpc_server(opts, service, [], handlers)]
        old = os.umask(0o177)  # the socket is created 0600: only this user may compile
        try:
            servers[0].add_insecure_port(f"unix://{unix.bind_path}")
        except RuntimeError as e:  # e.g. a path past the 107 bytes a socket address holds
            raise ServeRefused(f"cannot bind a socket in {unix.path.parent}: {e}") from None
        finally:
            os.umask(old)
        unix.bound()
        if opts.tcp:
            interceptors = [_TokenInterceptor(token)] if token is not None else []
            tcp = _grpc_server(opts, service, interceptors, handlers)
            try:
                if creds is not None:
                    tcp.add_secure_port(opts.tcp, creds)
                else:
                    tcp.add_insecure_port(opts.tcp)
            except RuntimeError as e:
                raise ServeRefused(f"cannot listen on --tcp {opts.tcp}: {e}") from None
            servers.append(tcp)
        try:
            http = metrics.start_http(opts.metrics_port, opts.metrics_addr) \
                if opts.metrics_port is not None else None
        except OSError as e:
            raise ServeRefused(f"cannot serve metrics on {opts.metrics_addr}:"
                               f"{opts.metrics_port}: {e.strerror}") from None
    except BaseException:
        unix.remove()
        pool.shutdown(wait=False)
        raise
    return servers, service, pool, metrics, http, unix


def serve(opts: ServeOptions) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: stacks to stderr
    heap.tune()  # a large request's memory goes back to the OS once it is answered
    servers, service, pool, _metrics, http, unix = build_server(opts)
    for server in servers:
        server.start()
    memory = f"{opts.memory_bytes / 2**30:.1f} GiB" if opts.memory_bytes else "no memory limit"
    log.info("serving on unix://%s%s (local target %s, %s workers, each compile %g s and %s "
             "at most, %s requests may wait for compiles%s)", unix.path,
             f" and {opts.tcp}" if opts.tcp else "", service.local_target,
             pool.stats().get("workers"), opts.compile_timeout_s, memory, service.max_waiting,
             f", metrics on {opts.metrics_addr}:{http.server_port}" if http is not None
             else "")
    done = threading.Event()

    def stop(signum, _frame):
        log.info("signal %d: shutting down (grace %.0f s)", signum, opts.grace_s)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not done.wait(0.5):
        pass
    t0 = time.monotonic()
    for stopped in [server.stop(opts.grace_s) for server in servers]:
        stopped.wait()
    pool.shutdown(wait=True, cancel_pending=True)
    if http is not None:
        _metrics.stop_http()
    unix.remove()
    log.info("stopped in %.1f s", time.monotonic() - t0)
    return 0
