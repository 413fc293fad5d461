"""`tiled serve`: the daemon process. A gRPC server on a Unix socket (mode 0600) and optionally
on TCP (TLS, bearer token), the compile worker pool, the cache, health, reflection, metrics.

Shutdown (SIGTERM / SIGINT): stop accepting, let in-flight RPCs finish for `grace` seconds,
cancel queued compiles, stop the workers. The cache needs no shutdown step: every entry is
published atomically, so it is consistent at any instant.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("tiled.server")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (structured logs)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname,
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


@dataclass
class ServeOptions:
    socket: str
    tcp: str | None = None  # host:port
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    workers: int | None = None
    metrics_port: int | None = None
    compile_timeout_s: float = 600.0
    memory_bytes: int | None = None
    queue_limit: int = 256
    max_request_bytes: int = 64 << 20
    grace_s: float = 10.0
    recycle_bytes: int | None = 64 << 20  # replace a worker whose own memory grew past this
    idle_stop_s: float | None = 300.0  # stop the compile processes after this long idle


class _TokenInterceptor(grpc.ServerInterceptor):
    """Rejects TCP calls without `authorization: Bearer <token>` (the Unix socket relies on
    its file mode instead)."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}"

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        peer_md = dict(details.invocation_metadata or ())
        if peer_md.get("authorization") == self.expected:
            return continuation(details)
        return self._deny


def _grpc_server(opts: ServeOptions, service, interceptors: list) -> grpc.Server:
    """A gRPC server with the Compiler service, health (one name per backend) and reflection."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from tiled.server.service import add_to_server
    from tiled.v1 import compile_pb2

    msg_opts = [("grpc.max_receive_message_length", opts.max_request_bytes),
                ("grpc.max_send_message_length", 4 << 20)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=msg_opts,
                         interceptors=interceptors)
    add_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    serving = health_pb2.HealthCheckResponse.SERVING
    health_servicer.set("", serving)
    health_servicer.set("tiled.v1.Compiler", serving)
    for backend in ("cpu", "cuda"):
        health_servicer.set(f"tiled.v1.Compiler/{backend}", serving)
    names = (compile_pb2.DESCRIPTOR.services_by_name["Compiler"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    return server


def build_server(opts: ServeOptions):
    """Creates (servers, service, pool, metrics, metrics_http) without starting the servers:
    one on the Unix socket, and one on TCP when asked for. They are separate servers because
    the TCP one alone checks the bearer token; both serve the same service, pool and cache."""
    from tiled.cache.tiered import open_default_cache
    from tiled.server.metrics import Metrics
    from tiled.server.pool import CompilePool
    from tiled.server.service import CompilerService

    metrics = Metrics()
    pool = CompilePool(workers=opts.workers, timeout_s=opts.compile_timeout_s,
                       memory_bytes=opts.memory_bytes, queue_limit=opts.queue_limit,
                       on_event=metrics.pool_event, preload=("tiled.server.preload",),
                       recycle_bytes=opts.recycle_bytes, idle_stop_s=opts.idle_stop_s)
    cache = open_default_cache(events=metrics.cache_events())
    service = CompilerService(cache, pool, metrics, max_request_bytes=opts.max_request_bytes,
                              compile_timeout_s=opts.compile_timeout_s)
    servers = [_grpc_server(opts, service, [])]
    sock = Path(opts.socket)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists():
        sock.unlink()  # a stale socket from a previous daemon
    old = os.umask(0o177)  # the socket is created 0600: only this user may compile
    try:
        servers[0].add_insecure_port(f"unix://{sock}")
    finally:
        os.umask(old)
    if opts.tcp:
        interceptors = []
        if opts.token_file:
            interceptors.append(_TokenInterceptor(Path(opts.token_file).read_text().strip()))
        tcp = _grpc_server(opts, service, interceptors)
        if opts.tls_cert and opts.tls_key:
            creds = grpc.ssl_server_credentials(
                [(Path(opts.tls_key).read_bytes(), Path(opts.tls_cert).read_bytes())])
            tcp.add_secure_port(opts.tcp, creds)
        else:
            log.warning("TCP listener %s without TLS: use only on a trusted network", opts.tcp)
            tcp.add_insecure_port(opts.tcp)
        servers.append(tcp)
    http = metrics.start_http(opts.metrics_port) if opts.metrics_port is not None else None
    return servers, service, pool, metrics, http


def serve(opts: ServeOptions) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: stacks to stderr
    servers, service, pool, _metrics, http = build_server(opts)
    for server in servers:
        server.start()
    log.info("serving on unix://%s%s (local target %s, %s workers%s)", opts.socket,
             f" and {opts.tcp}" if opts.tcp else "", service.local_target,
             pool.stats().get("workers"),
             f", metrics on :{http.server_port}" if http is not None else "")
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
    if Path(opts.socket).exists():
        Path(opts.socket).unlink()
    log.info("stopped in %.1f s", time.monotonic() - t0)
    return 0
