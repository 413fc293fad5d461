"""The Compiler gRPC service: answers from the cache or compiles in the worker pool.

Thread-safe: gRPC calls the methods from its thread pool. Every failure goes through
`status.status_of`, so each error has one gRPC code. Compiles run in worker processes
(tiled.server.pool); the cache (memory -> disk -> Redis) lives in this process, and an entry is
stored once its compile finishes.

Admission: a request that must wait for a compile (its own, or one it merged onto) holds a gRPC
handler thread while it waits, so at most `max_waiting` requests may wait at once (a Warm call
counts as one for its whole stream); the next gets RESOURCE_EXHAUSTED. The daemon sizes its
handler pool above `max_waiting` (tiled.server.app), so waiting compiles can never take the
threads that cache hits, health and status need. A merged request that goes away (cancelled,
deadline passed) frees its thread and slot at once; the owner of a compile stays until the
compile ends when others still wait on it, as it stores the entry for them.

Memory: every per-request memo is bounded in bytes and keyed by digests, never by the text a
client sent; options_json is refused past MAX_OPTIONS_BYTES before it is parsed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import threading
import time

import grpc

import tiled
from tiled import config
from tiled.cache.entry import Entry, sha256_hex
from tiled.compiler.cached import compile_action
from tiled.compiler.registry import get_backend, parse_target
from tiled.errors import CacheWriteError, CompileTimeout, QueueFull, UnsupportedTarget
from tiled.ir import SCHEMA_VERSION, verify
from tiled.ir.program import Program
from tiled.server import heap
from tiled.server.status import abort, status_of
from tiled.server.worker import decode, encode
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import compile_pb2_grpc

log = logging.getLogger("tiled.server")
DEFAULT_INLINE = 1 << 20
KEY_MEMO_BYTES = 32 << 20  # requests remembered as verified and keyed (~700 bytes each)
RESPONSE_MEMO_BYTES = 64 << 20  # serialized hit responses remembered by request bytes
MEMO_ENTRY_OVERHEAD = 512  # dict slot, tuple, digest and key objects of one memo entry
ARTIFACT_INDEX_ENTRIES = 100_000  # artifact digests -> action key, for GetArtifact (~300 B)
MAX_CHUNK = 3 << 20
# Compile options are a few flags (tiled.compiler.registry.Option): a request carrying more
# than this is refused before its text is parsed or remembered.
MAX_OPTIONS_BYTES = 4096
MAX_OPTIONS_DEPTH = 4  # {"a": [{"b": 1}]} is 3 deep
TRIM_AFTER_BYTES = 1 << 20  # a request this large hands its freed heap back to the OS


def resolve_local() -> str:
    """The host's own device as a target: the CUDA arch of GPU 0 read from the driver
    (sm_90 -> sm_90a), else "cpu"."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return "cpu"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return "cpu"
        err, dev = cu.cuDeviceGet(0)
        attr = cu.CUdevice_attribute
        _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    except Exception as e:
        log.info("no CUDA device (%s); target 'local' is cpu", e)
        return "cpu"
    arch = f"sm_{major}{minor}"
    return f"cuda:{'sm_90a' if arch == 'sm_90' else arch}"


class _Flight:
    """One compile in progress: the future of its entry, how many requests wait for it, and
    the pool job (cancelled when the last waiting request goes away)."""

    def __init__(self):
        self.entry: concurrent.futures.Future = concurrent.futures.Future()
        self.waiters = 1
        self.job: concurrent.futures.Future | None = None


class _Waiter:
    """Ties one request to the flight it waits on, so that the request's gRPC termination
    (cancelled by the client, deadline passed) can leave it. `gone` is resolved then, which
    frees a request merged onto another's compile from waiting (and its handler thread)."""

    def __init__(self):
        self.key: str | None = None
        self.flight: _Flight | None = None
        self.gone: concurrent.futures.Future = concurrent.futures.Future()


class CompilerService(compile_pb2_grpc.CompilerServicer):
    def __init__(self, cache, pool, metrics=None, local_target: str | None = None,
                 max_request_bytes: int = 64 << 20, compile_timeout_s: float = 120.0,
                 max_waiting: int | None = None):
        self.cache, self.pool, self.metrics = cache, pool, metrics
        self.local_target = local_target or resolve_local()
        self.max_request_bytes = max_request_bytes
        self.compile_timeout_s = compile_timeout_s
        # requests allowed to wait for a compile at once (None: no bound, for in-process use)
        self.max_waiting = max_waiting
        self._waiting = 0
        # artifact sha256 -> action key that names it, most recent last: GetArtifact reads the
        # artifact through its entry; one no longer here is read by digest (cache.get_blob)
        self._artifacts: collections.OrderedDict[str, str] = collections.OrderedDict()
        # sha256 of (program bytes, target, options, namespace) -> (action key, target, size)
        self._keys: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()
        self._key_bytes = 0
        # sha256 of a Compile request's bytes -> (action key, target, its hit response's bytes)
        self._responses: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()
        self._response_bytes = 0
        self._inflight: dict[str, _Flight] = {}  # key -> the compile of it now running
        self._lock = threading.Lock()
        self._hits = self._merged = 0  # requests answered from the cache / by another's compile
        self._started = time.monotonic()  # Capabilities reports the uptime

    # -- helpers ----------------------------------------------------------------------------
    def _target(self, text: str):
        return parse_target(self.local_target if text in ("", "local") else text)

    def _options(self, text: str) -> dict:
        """The options a request's options_json holds; ValueError (INVALID_ARGUMENT) for text
        past MAX_OPTIONS_BYTES, not JSON, nested past MAX_OPTIONS_DEPTH or not an object."""
        if not text:
            return {}
        _check_options_size(text)
        try:
            options = json.loads(text)
        except ValueError as e:
            raise ValueError(f"options_json is not JSON: {e}") from None
        except RecursionError:  # json's decoder recurses once per level
            raise ValueError(f"options_json nests deeper than {MAX_OPTIONS_DEPTH} levels") \
                from None
        if not isinstance(options, dict):
            raise ValueError("options_json must be a JSON object")
        if _depth(options) > MAX_OPTIONS_DEPTH:
            raise ValueError(f"options_json nests deeper than {MAX_OPTIONS_DEPTH} levels")
        return options

    def _admit(self, request: cpb.CompileRequest):
        """(ActionKey, target, program, options) of a request: the program is decoded and
        verified, the target resolved and the options parsed, then keyed. A request seen before
        (same program bytes, target text, options text and namespace) is answered from a memo
        instead, with program and options None: a verified program stays verified, and this
        process's toolchain digest does not change while it runs (tiled.compiler.toolchain
        .digest memoizes it per process too). So a cache hit costs a hash, not a verify."""
        options_text, target_text = request.options_json, request.target
        _check_options_size(options_text)  # before it is hashed, parsed or quoted
        h = hashlib.sha256(request.program.SerializeToString(deterministic=True))
        for text in (target_text, options_text, config.get("cache_namespace")):
            data = text.encode()
            h.update(len(data).to_bytes(8, "little") + data)  # length-prefixed: unambiguous
        memo_key = h.digest()
        with self._lock:
            known = self._keys.get(memo_key)
            if known is not None:
                self._keys.move_to_end(memo_key)
                return known[0], known[1], None, None
        program = Program(request.program)
        verify(program)
        target = self._target(target_text)
        options = self._options(options_text)
        key = compile_action(program, target, options)
        size = MEMO_ENTRY_OVERHEAD + len(options_text) + len(config.get("cache_namespace"))
        with self._lock:
            if memo_key not in self._keys:
                self._keys[memo_key] = (key, target, size)
                self._key_bytes += size
            while self._key_bytes > KEY_MEMO_BYTES:
                self._key_bytes -= self._keys.popitem(last=False)[1][2]
        return key, target, program, options

    def _observe(self, target, stages: dict, result: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_compile(target.backend, target.arch, stages, result)

    def compile(self, request: cpb.CompileRequest, time_left: float | None,
                waiter: _Waiter | None = None, *, counted: bool = True) -> cpb.CompileResponse:
        """One Compile, raising tiled errors (the caller maps them to statuses). `waiter`, when
        given, lets `abandon` withdraw this request from a compile it waits for. `counted`:
        waiting for a compile takes one of `max_waiting` (QueueFull when none is left); Warm
        passes False, as its whole call holds one."""
        t0 = time.perf_counter()
        action, target, program, options = self._admit(request)
        key = action.hex
        entry = self.cache.get(key)
        hit = entry is not None
        stages: dict[str, float] = {"verify": time.perf_counter() - t0}
        if entry is None:
            if request.cache_only:
                raise KeyError(f"action {key} is not cached")
            if program is None:  # admitted before (memo), evicted since: decode it again
                program, options = Program(request.program), self._options(request.options_json)
            with self._waiting_slot(counted):
                entry, hit = self._compile_once(action, program, target, options, time_left,
                                                stages, t0, waiter or _Waiter())
        manifest_json = entry.manifest.decode()
        artifact_sha = json.loads(manifest_json)["artifact_sha256"]
        artifact = entry.blobs[artifact_sha]
        with self._lock:
            self._artifacts[artifact_sha] = key
            self._artifacts.move_to_end(artifact_sha)
            if len(self._artifacts) > ARTIFACT_INDEX_ENTRIES:
                self._artifacts.popitem(last=False)
            self._hits += hit
        stages["total"] = time.perf_counter() - t0
        self._observe(target, stages, "hit" if hit else "ok")
        limit = request.inline_limit or DEFAULT_INLINE
        return cpb.CompileResponse(
            action_key=key, manifest_json=manifest_json, artifact_sha256=artifact_sha,
            artifact_size=len(artifact), artifact=artifact if len(artifact) <= limit else b"",
            cache_hit=hit, resolved_target=str(target), stage_seconds=stages)

    @contextlib.contextmanager
    def _waiting_slot(self, counted: bool = True):
        """One of `max_waiting` for the request about to wait on a compile; QueueFull when
        every one is taken, so a flood of cold compiles is refused rather than queued behind
        the handler threads."""
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

    def _compile_once(self, action, program, target, options, time_left, stages, t0, waiter):
        """Single-flight over compile *and* store: the first request for a key compiles and
        stores; requests arriving meanwhile wait for its entry. The owner looks the cache up
        again after registering, so a request that missed just before the previous owner
        stored and left is a hit, not a second compile. When every waiting request has gone
        (`abandon`), the pool job is cancelled and the flight forgotten."""
        key = action.hex
        with self._lock:
            flight = self._inflight.get(key)
            owner = flight is None
            if owner:
                flight = self._inflight[key] = _Flight()
            else:
                flight.waiters += 1
            waiter.key, waiter.flight = key, flight
        if not owner:
            with self._lock:
                self._merged += 1
            if self.metrics is not None:
                self.metrics.pool_event("merged", {})
            done, _ = concurrent.futures.wait((flight.entry, waiter.gone), timeout=time_left,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            if flight.entry in done:
                return flight.entry.result(), False  # merged: not from the cache, not compiled
            if waiter.gone in done:
                raise concurrent.futures.CancelledError("the request went away")
            raise CompileTimeout("the deadline passed while waiting for an identical compile")
        try:
            entry = self.cache.get(key)
            hit = entry is not None
            if entry is None:
                entry = self._compile_and_store(action, program, target, options, time_left,
                                                stages, t0, flight)
            flight.entry.set_result(entry)
            return entry, hit
        except BaseException as e:
            flight.entry.set_exception(e)
            raise
        finally:
            with self._lock:
                if self._inflight.get(key) is flight:
                    del self._inflight[key]

    def abandon(self, waiter: _Waiter) -> None:
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

    def _compile_and_store(self, action, program, target, options, time_left, stages, t0,
                           flight):
        key = action.hex
        timeout = self.compile_timeout_s if time_left is None else \
            max(0.001, min(self.compile_timeout_s, time_left))
        payload = encode({"target": str(target), "options": options, "action": action.record},
                         program.to_bytes())
        try:
            job = self.pool.submit(key, "tiled.server.worker:compile_job", payload,
                                   timeout_s=timeout)
            with self._lock:
                flight.job = job
                abandoned = flight.waiters == 0 or self._inflight.get(key) is not flight
            if abandoned:  # every request left before the job existed
                job.cancel()
            result = job.result()
        except Exception:
            self._observe(target, {"total": time.perf_counter() - t0}, "error")
            raise
        header, artifact = decode(result)
        for stage, seconds in header.get("stages", {}).items():  # the worker verifies again
            stages[stage] = stages.get(stage, 0.0) + seconds
        entry = Entry(key, header["manifest"].encode(), {sha256_hex(artifact): artifact})
        t_store = time.perf_counter()
        try:
            self.cache.put(entry)
        except CacheWriteError as e:
            log.warning("could not store %s: %s", key[:12], e)
        stages["store"] = time.perf_counter() - t_store
        return entry

    # -- RPCs -------------------------------------------------------------------------------
    def compile_rpc(self, request: _RawCompile, context) -> bytes:
        """The Compile RPC on the request's bytes (see `add_to_server`). A request whose exact
        bytes were answered before, and whose entry the cache still holds, gets the response
        remembered then: no decode, verify, key or serialization, which is most of a hit's
        cost. Anything else is decoded and goes through `compile`.

        A failed request is released before its status is set: gRPC keeps an aborted call's
        exception, and through its traceback every frame below the abort, in a reference
        cycle that lives until the cyclic collector runs, so a 60 MB request that failed
        would otherwise stay resident until then."""
        try:
            return self._compile_rpc(request, context)
        except Exception as e:
            status = status_of(e)
        finally:
            if len(request.data) >= TRIM_AFTER_BYTES:
                heap.trim_soon()  # a moment after this request's buffers are gone
        request.release()
        return context.abort(*status)  # raises

    def _compile_rpc(self, request: _RawCompile, context) -> bytes:
        t0 = time.perf_counter()
        digest = hashlib.sha256(request.data).digest()
        with self._lock:
            known = self._responses.get(digest)
            if known is not None:
                self._responses.move_to_end(digest)
        if known is not None:
            key, target, body = known
            if self.cache.contains(key):  # evicted or cleared since: answer the long way
                seconds = time.perf_counter() - t0
                with self._lock:
                    self._hits += 1
                self.cache.events.lookup("response", "hit")
                self._observe(target, {"verify": seconds, "total": seconds}, "hit")
                return body  # as remembered: no stage_seconds (nothing was staged)
            self._forget_response(digest)
        if isinstance(request.message, _Undecodable):
            raise ValueError(request.message.message)
        response = self._compile_call(request.message, context)
        hit = cpb.CompileResponse()
        hit.CopyFrom(response)
        hit.cache_hit = True
        hit.ClearField("stage_seconds")
        body = hit.SerializeToString(deterministic=True)
        with self._lock:
            if digest not in self._responses and len(body) <= RESPONSE_MEMO_BYTES // 16:
                self._responses[digest] = (response.action_key, self._target(
                    response.resolved_target), body)
                self._response_bytes += len(body) + MEMO_ENTRY_OVERHEAD
                while self._response_bytes > RESPONSE_MEMO_BYTES:
                    _, (_, _, old) = self._responses.popitem(last=False)
                    self._response_bytes -= len(old) + MEMO_ENTRY_OVERHEAD
        return response.SerializeToString()

    def _compile_call(self, request: cpb.CompileRequest, context) -> cpb.CompileResponse:
        """`compile` for a gRPC call: the call's deadline bounds the compile, and its end
        (cancelled, deadline passed) withdraws it from the compile it waits for."""
        waiter = _Waiter()
        context.add_callback(lambda: self.abandon(waiter))  # runs when the RPC ends, any way
        response = self.compile(request, context.time_remaining(), waiter)
        waiter.flight = None  # answered: ending the RPC now abandons nothing
        return response

    def _forget_response(self, digest: bytes) -> None:
        with self._lock:
            known = self._responses.pop(digest, None)
            if known is not None:
                self._response_bytes -= len(known[2]) + MEMO_ENTRY_OVERHEAD

    def Compile(self, request, context):
        """Compile on a decoded request (the daemon registers `compile_rpc` instead)."""
        try:
            return self._compile_call(request, context)
        except Exception as e:
            status = status_of(e)
        context.abort(*status)

    def memo_bytes(self) -> dict[str, int]:
        """The bytes each per-request memo accounts for (tests, `tiled status` tooling)."""
        with self._lock:
            return {"keys": self._key_bytes, "responses": self._response_bytes}

    def GetArtifact(self, request, context):
        with self._lock:
            key = self._artifacts.get(request.sha256)
        entry = self.cache.get(key) if key else None
        data = entry.blobs.get(request.sha256) if entry else None
        if data is None:  # not answered by this process (e.g. before a restart): by digest
            data = self.cache.get_blob(request.sha256)
        if data is None:
            abort(context, grpc.StatusCode.NOT_FOUND,
                  f"artifact {request.sha256[:64]} is not held by this daemon")
        chunk = min(request.chunk_bytes or DEFAULT_INLINE, MAX_CHUNK)
        for off in range(0, len(data), chunk):
            yield cpb.ArtifactChunk(offset=off, data=data[off:off + chunk], total_size=len(data))

    def FindMissing(self, request, context):
        return cpb.FindMissingResponse(
            missing=[k for k in request.action_keys if not self.cache.contains(k)])

    def Warm(self, request, context):
        """Streams one WarmResult per item. The call holds one waiting slot for its whole
        stream (its handler thread waits throughout); its items compile on threads of its own
        and queue in the pool like any compile."""
        with self._waiting_slot():
            yield from self._warm(request)

    def _warm(self, request):
        workers = max(1, self.pool.workers * 2)  # compiles queue in the pool, hits return
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            futures = {ex.submit(self.compile, item, None, counted=False): i
                       for i, item in enumerate(request.items)}
            for fut in concurrent.futures.as_completed(futures):
                i = futures[fut]
                try:
                    r = fut.result()
                    yield cpb.WarmResult(index=i, code=0, action_key=r.action_key,
                                         cache_hit=r.cache_hit)
                except Exception as e:
                    code, message = status_of(e)
                    yield cpb.WarmResult(index=i, code=code.value[0], message=message)

    def Capabilities(self, request, context):
        from tiled.compiler.toolchain.digest import toolchain_digest

        backends = []
        for name in ("cpu", "cuda"):
            try:
                b = get_backend(name)
                digest = toolchain_digest(parse_target(name if name == "cpu" else
                                                       f"cuda:{b.archs[-1]}"))
            except (UnsupportedTarget, ImportError):
                continue
            backends.append(cpb.Backend(name=name, archs=list(b.archs), toolchain_digest=digest))
        stats = self.pool.stats()
        with self._lock:
            hits, merged = self._hits, self._merged
        tiers = []
        for tier in getattr(self.cache, "tiers", [self.cache]):
            entry = cpb.CapabilitiesResponse.CacheTier(
                name=getattr(tier, "name", type(tier).__name__),
                remote=bool(getattr(tier, "remote", False)))
            if not entry.remote:  # a remote tier is not measured: no network call here
                entry.max_bytes = int(getattr(tier, "max_bytes", 0) or 0)
                try:  # disk: the ledger's O(1) count; memory: its byte count
                    entry.bytes = int(tier.total_bytes() if hasattr(tier, "total_bytes")
                                      else getattr(tier, "nbytes", 0))
                except OSError as e:  # a status call never fails on a cache read
                    log.warning("cache tier %s: size unreadable: %s", entry.name, e)
            tiers.append(entry)
        return cpb.CapabilitiesResponse(
            version=tiled.__version__, backends=backends, local_target=self.local_target,
            tile_ir_schema_version=SCHEMA_VERSION, max_request_bytes=self.max_request_bytes,
            max_inline_bytes=DEFAULT_INLINE, workers=int(stats.get("workers", 0)),
            queue_limit=self.pool.queue_limit,
            uptime_seconds=max(1e-6, time.monotonic() - self._started),
            queued=int(stats.get("queued", 0)), in_flight=int(stats.get("in_flight", 0)),
            compiles_total=int(stats.get("completed_total", 0)),
            compile_failures_total=int(stats.get("failed_total", 0)),
            merged_total=merged + int(stats.get("merged_total", 0)), cache_hits_total=hits,
            workers_replaced_total=int(stats.get("replaced_total", 0)), cache_tiers=tiers)


class _RawCompile:
    """A Compile request as it arrived: its bytes (the hit fast path keys on them), decoded
    only when needed (`message`: a CompileRequest, or _Undecodable)."""

    __slots__ = ("_message", "data")

    def __init__(self, data: bytes, message=None):
        self.data, self._message = data, message

    @property
    def message(self):
        if self._message is None:
            self._message = _parse_compile_request(self.data)
        return self._message

    def release(self) -> None:
        """Drops the bytes and the decoded message (the request has been answered)."""
        self.data, self._message = b"", _Undecodable("the request was released")


class _Undecodable:
    """What a request that is not valid protobuf deserializes to, so that the service (not
    gRPC's INTERNAL "Exception deserializing request!") answers INVALID_ARGUMENT."""

    def __init__(self, message: str):
        self.message = message


def _lenient(message_cls):
    def deserialize(data: bytes):
        try:
            return message_cls.FromString(data)
        except Exception as e:  # DecodeError, or RecursionError for absurd nesting
            return _Undecodable(f"the request is not a valid {message_cls.DESCRIPTOR.full_name}: "
                                f"{e or type(e).__name__}")
    return deserialize


def _checked(method, streaming: bool):
    if streaming:
        def stream(request, context):
            if isinstance(request, _Undecodable):
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:
                yield from method(request, context)
            except QueueFull as e:  # Warm past max_waiting: refused before its first result
                abort(context, *status_of(e))
        return stream

    def unary(request, context):
        if isinstance(request, _Undecodable):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return method(request, context)
    return unary


def add_to_server(service: CompilerService, server: grpc.Server) -> None:
    """Registers `service` for every method of tiled.v1.Compiler (read from the proto's
    descriptor), with requests decoded by the service so that bad bytes are INVALID_ARGUMENT."""
    desc = cpb.DESCRIPTOR.services_by_name["Compiler"]
    handlers = {"Compile": grpc.unary_unary_rpc_method_handler(
        service.compile_rpc, request_deserializer=_RawCompile,
        response_serializer=lambda data: data)}  # compile_rpc returns the response's bytes
    for m in desc.methods:
        if m.name in handlers:
            continue
        make = grpc.unary_stream_rpc_method_handler if m.server_streaming else \
            grpc.unary_unary_rpc_method_handler
        handlers[m.name] = make(
            _checked(getattr(service, m.name), m.server_streaming),
            request_deserializer=_lenient(getattr(cpb, m.input_type.name)),
            response_serializer=getattr(cpb, m.output_type.name).SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name,
                                                                          handlers),))
    server.add_registered_method_handlers(desc.full_name, handlers)


_parse_compile_request = _lenient(cpb.CompileRequest)


def _check_options_size(text: str) -> None:
    # A character is at most 4 UTF-8 bytes: short text needs no encode to be known small.
    if len(text) > MAX_OPTIONS_BYTES // 4 and (size := len(text.encode())) > MAX_OPTIONS_BYTES:
        raise ValueError(f"options_json is {size} bytes; the limit is {MAX_OPTIONS_BYTES} "
                         "(compile options are a few flags)")


def _depth(value) -> int:
    """How deep JSON data nests, without recursion (a scalar is 0, {} is 1)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
