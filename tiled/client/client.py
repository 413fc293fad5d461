"""The synchronous client of the compile daemon (compile.proto), and the pieces the asyncio
client shares with it: request building, artifact checks, the in-process kernel table, backoff.

    with Client("unix:///run/tiled.sock") as c:
        kernel = c.compile(vadd, "cuda:sm_90a")     # a tiled.runtime kernel, ready to call
        kernel(A, B, C)

Thread-safe: one Client may serve many threads. Every call carries a deadline (`timeout_s`,
TILED_CLIENT_TIMEOUT_SECONDS) and is retried with backoff on UNAVAILABLE only
(TILED_CLIENT_RETRIES); every other failure maps to a tiled error in tiled.client.errors.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc

from tiled import config
from tiled.client.errors import ServerUnavailable, from_rpc_error
from tiled.client.socket_trust import refuse_untrusted_socket
from tiled.errors import LaunchError, TiledError
from tiled.ir.program import Program, as_program
from tiled.runtime import Kernel, Manifest, load
from tiled.v1 import compile_pb2, compile_pb2_grpc

T = TypeVar("T")
MAX_BACKOFF_S = 5.0
# The daemon's unix socket or a host on the LAN: an HTTP proxy from the environment is wrong.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]

TableKey = tuple[str, str, str]


class RemoteKernel:
    """A kernel compiled by the daemon and loaded here: call it like the runtime kernel it
    wraps (`.kernel`). `.manifest`, `.artifact`, `.action_key`, `.cache_hit` (whether the
    daemon answered from its cache) and `.resolved_target` describe where it came from."""

    def __init__(self, kernel: Kernel, artifact: bytes, response: compile_pb2.CompileResponse):
        self.kernel, self.artifact = kernel, artifact
        self.manifest: Manifest = kernel.manifest
        self.action_key: str = response.action_key
        self.cache_hit: bool = response.cache_hit
        self.resolved_target: str = response.resolved_target

    def __call__(self, *args: Any) -> Any:
        return self.kernel(*args)

    def emulate(self, *args: Any) -> None:
        """Runs a rocm or metal kernel on the CPU under tiled's emulation, as
        CompiledKernel.emulate does (needs tiled's compiler package and clang-22 on this
        host; TVM is not loaded)."""
        if self.manifest.backend == "metal":
            from tiled.compiler.targets.metal.emulate import emulate
        else:
            from tiled.compiler.targets.rocm.emulate import emulate

        emulate(self.artifact, self.manifest, args)

    def __getattr__(self, name: str) -> Any:
        if name == "kernel":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"<RemoteKernel {self.kernel!r} action {self.action_key[:12]}>"


def options_json(options: dict | None) -> str:
    """Canonical JSON of backend options ("" for none): equal dicts give equal text."""
    if not options:
        return ""
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def compile_request(kernel_or_program: Any, target: str = "local", options: dict | None = None,
                    *, inline_limit: int = 0, cache_only: bool = False,
                    ) -> compile_pb2.CompileRequest:
    return compile_pb2.CompileRequest(
        program=as_program(kernel_or_program).proto, target=target,
        options_json=options_json(options), inline_limit=inline_limit, cache_only=cache_only)


def table_key(program: Program, target: str, options: dict | None) -> TableKey:
    return (program.digest, target, options_json(options))


def check_artifact(data: bytes, response: compile_pb2.CompileResponse) -> bytes:
    """`data` when it is the blob the response and its manifest name; LaunchError otherwise,
    so a corrupt or truncated transfer never reaches the loader."""
    manifest = Manifest.coerce(response.manifest_json)
    digest = hashlib.sha256(data).hexdigest()
    for what, want in (("response", response.artifact_sha256),
                       ("manifest", manifest.artifact_sha256)):
        if digest != want:
            raise LaunchError(f"{manifest.name}: artifact from the daemon has sha256 {digest} "
                              f"({len(data)} bytes), but the {what} names {want}")
    return data


def warm_requests(requests: Iterable[Any]) -> compile_pb2.WarmRequest:
    """A WarmRequest from CompileRequests or (kernel_or_program, target[, options]) tuples."""
    items = []
    for r in requests:
        items.append(r if isinstance(r, compile_pb2.CompileRequest) else compile_request(*r))
    return compile_pb2.WarmRequest(items=items)


class ChunkAssembler:
    """Reassembles GetArtifact chunks; raises LaunchError on a gap, an overlap or a size that
    disagrees, and on a sha256 that is not the one asked for."""

    def __init__(self, sha256: str):
        self.sha256, self.parts, self.size, self.total = sha256, [], 0, None

    def add(self, chunk: compile_pb2.ArtifactChunk) -> None:
        if chunk.offset != self.size:
            raise LaunchError(f"artifact {self.sha256[:12]}: chunk at offset {chunk.offset}, "
                              f"expected {self.size}")
        if self.total is not None and chunk.total_size != self.total:
            raise LaunchError(f"artifact {self.sha256[:12]}: total size changed mid-stream")
        self.total = chunk.total_size
        self.parts.append(chunk.data)
        self.size += len(chunk.data)

    def result(self) -> bytes:
        data = b"".join(self.parts)
        if self.total is not None and len(data) != self.total:
            raise LaunchError(f"artifact {self.sha256[:12]}: got {len(data)} bytes of "
                              f"{self.total}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise LaunchError(f"artifact {self.sha256[:12]}: received bytes have sha256 "
                              f"{digest}")
        return data


def backoff_delays(retries: int, base_s: float) -> Iterator[float]:
    """`retries` delays: base * 2**n capped at MAX_BACKOFF_S, each jittered to [d/2, d] so
    that clients refused together do not come back together."""
    for n in range(retries):
        d = min(MAX_BACKOFF_S, base_s * 2 ** n)
        yield d / 2 + random.uniform(0, d / 2)


def unavailable(e: BaseException) -> bool:
    return isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE


def channel_credentials(address: str) -> grpc.ChannelCredentials | None:
    """Credentials for a host:port daemon from TILED_TLS_CA and TILED_TOKEN_FILE, or None
    (plaintext; always for unix:// addresses, which the socket's file mode protects, and whose
    owner each call checks: tiled.client.socket_trust). A token is only ever sent over TLS."""
    if address.startswith("unix:"):
        return None
    ca, token_file = config.get("tls_ca"), config.get("token_file")
    if token_file and not ca:
        raise TiledError(f"TILED_TOKEN_FILE is set but TILED_TLS_CA is not: the bearer token "
                         f"would cross the network to {address} in plaintext")
    if not ca:
        return None
    try:
        roots = None if ca == "system" else Path(ca).read_bytes()
        token = Path(token_file).read_text().strip() if token_file else None
    except OSError as e:
        raise TiledError(f"daemon credentials: {e}") from None
    creds = grpc.ssl_channel_credentials(root_certificates=roots)
    if token:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    return creds


def configure(client: Any, address: str | None, timeout_s: float | None, retries: int | None,
              backoff_s: float | None, inline_limit: int) -> None:
    """Sets a client's address, deadline, retry and inline settings: arguments, else config."""
    client.address = address or config.get("server")
    if not client.address:
        raise TiledError("no daemon address: pass one or set TILED_SERVER "
                         "(unix:///path or host:port)")
    client.timeout_s = timeout_s if timeout_s is not None else config.get(
        "client_timeout_seconds")
    client.retries = retries if retries is not None else config.get("client_retries")
    client.backoff_s = backoff_s if backoff_s is not None else config.get(
        "client_backoff_seconds")
    client.inline_limit = inline_limit


class Client:
    """A connection to the compile daemon at `address` ("unix:///path" or "host:port";
    default TILED_SERVER). Compiled kernels are kept in an in-process table keyed by
    (program digest, target, canonical options), so a repeat compile makes no call."""

    def __init__(self, address: str | None = None, timeout_s: float | None = None, *,
                 retries: int | None = None, backoff_s: float | None = None,
                 inline_limit: int = 0):
        configure(self, address, timeout_s, retries, backoff_s, inline_limit)
        creds = channel_credentials(self.address)
        self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS) \
            if creds is None else grpc.secure_channel(self.address, creds, CHANNEL_OPTIONS)
        self._stub = compile_pb2_grpc.CompilerStub(self._channel)
        self._table: dict[TableKey, RemoteKernel] = {}
        self._lock = threading.Lock()

    def _call(self, fn: Callable[[], T]) -> T:
        """fn(), retried on UNAVAILABLE with backoff, within the deadline's time; every
        failure left is raised as a tiled error. Each attempt first checks a unix: socket's
        owner and directory (UntrustedSocket, not retried: tiled.client.socket_trust)."""
        start = time.monotonic()
        delays = backoff_delays(self.retries, self.backoff_s)
        while True:
            refuse_untrusted_socket(self.address)
            try:
                return fn()
            except grpc.RpcError as e:
                delay = next(delays, None) if unavailable(e) else None
                if delay is None or time.monotonic() - start + delay > self.timeout_s:
                    raise from_rpc_error(e, self.address) from None
            time.sleep(delay)

    def compile(self, kernel_or_program: Any, target: str = "local",
                options: dict | None = None) -> RemoteKernel:
        """Compiles on the daemon (or takes its cached result) and loads the artifact here.
        Raises VerifyError, UnsupportedTarget, CompileTimeout, ServerBusy, ServerUnavailable
        or LaunchError (an artifact that does not match its manifest is never loaded)."""
        program = as_program(kernel_or_program)
        key = table_key(program, target, options)
        with self._lock:
            hit = self._table.get(key)
        if hit is not None:
            return hit
        # Not held across the call: two threads racing on one key both ask (the daemon merges
        # identical in-flight compiles) and both get the kernel stored first.
        response, artifact = self.compile_raw(program, target, options)
        kernel = RemoteKernel(load(artifact, response.manifest_json), artifact, response)
        with self._lock:
            return self._table.setdefault(key, kernel)

    def compile_raw(self, kernel_or_program: Any, target: str = "local",
                    options: dict | None = None, *, cache_only: bool = False,
                    ) -> tuple[compile_pb2.CompileResponse, bytes]:
        """The daemon's CompileResponse and the checked artifact bytes (fetched with
        GetArtifact when not inlined). Bypasses the in-process table."""
        request = compile_request(kernel_or_program, target, options,
                                  inline_limit=self.inline_limit, cache_only=cache_only)
        response = self._call(lambda: self._stub.Compile(request, timeout=self.timeout_s))
        data = response.artifact or self.get_artifact(response.artifact_sha256)
        return response, check_artifact(data, response)

    def get_artifact(self, sha256: str, chunk_bytes: int = 0) -> bytes:
        """The blob `sha256`, streamed in chunks and checked. ArtifactNotFound when the
        daemon does not hold it; LaunchError when the bytes received are not it."""
        request = compile_pb2.GetArtifactRequest(sha256=sha256, chunk_bytes=chunk_bytes)

        def fetch() -> bytes:
            assembler = ChunkAssembler(sha256)
            for chunk in self._stub.GetArtifact(request, timeout=self.timeout_s):
                assembler.add(chunk)
            return assembler.result()

        return self._call(fetch)

    def find_missing(self, keys: Iterable[str]) -> list[str]:
        """The action keys among `keys` the daemon has not cached."""
        request = compile_pb2.FindMissingRequest(action_keys=list(keys))
        response = self._call(lambda: self._stub.FindMissing(request, timeout=self.timeout_s))
        return list(response.missing)

    def warm(self, requests: Iterable[Any]) -> Iterator[compile_pb2.WarmResult]:
        """Compiles a list of requests on the daemon (CompileRequests or (kernel_or_program,
        target[, options]) tuples); yields one WarmResult per item as each finishes. A failed
        item is a result with a nonzero `code`, not an exception (see errors.error_for_code).
        Retried on UNAVAILABLE only before the first result."""
        request = warm_requests(requests)
        stream = self._call(lambda: self._first(self._stub.Warm(request,
                                                                timeout=self.timeout_s)))
        try:
            yield from stream
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None

    @staticmethod
    def _first(stream: Iterator[T]) -> Iterator[T]:
        # Pulls the first item so that a refused connection surfaces inside the retry loop.
        first = next(stream, None)
        if first is None:
            return iter(())
        return _chain(first, stream)

    def lookup(self, request: compile_pb2.CompileRequest) -> compile_pb2.CompileResponse | None:
        """Asks whether `request` is cached, compiling nothing: the daemon decodes, verifies
        and keys it (the toolchain digest is daemon-side) and looks the key up. The response
        (artifact not inlined) on a hit, None on a miss; VerifyError, UnsupportedTarget, ...
        for a request that would fail."""
        probe = compile_pb2.CompileRequest()
        probe.CopyFrom(request)
        probe.cache_only, probe.inline_limit = True, 1  # every artifact is > 1 byte

        def call() -> compile_pb2.CompileResponse | None:
            try:
                return self._stub.Compile(probe, timeout=self.timeout_s)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise

        return self._call(call)

    def capabilities(self) -> compile_pb2.CapabilitiesResponse:
        return self._call(lambda: self._stub.Capabilities(compile_pb2.CapabilitiesRequest(),
                                                          timeout=self.timeout_s))

    def health(self, service: str = "") -> str:
        """The daemon's grpc.health.v1 status of `service` ("" is the whole daemon): "SERVING",
        "NOT_SERVING", ..., or "SERVICE_UNKNOWN" for a name it does not serve. Needs
        grpcio-health-checking (ImportError without it)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        request = health_pb2.HealthCheckRequest(service=service)

        def call() -> str:
            try:
                status = stub.Check(request, timeout=self.timeout_s).status
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return "SERVICE_UNKNOWN"
                raise
            return health_pb2.HealthCheckResponse.ServingStatus.Name(status)

        return self._call(call)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tiled.client.Client {self.address}>"


def _chain(first: T, rest: Iterator[T]) -> Iterator[T]:
    yield first
    yield from rest


__all__ = ["Client", "RemoteKernel", "ServerUnavailable"]
