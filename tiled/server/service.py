"""The Compiler gRPC service: answers from the cache or compiles in the worker pool.

Thread-safe: gRPC calls the methods from its thread pool. Every failure goes through
`status.status_of`, so each error has one gRPC code. Compiles run in worker processes
(tiled.server.pool); the cache (memory -> disk -> Redis) lives in this process, and an entry is
stored once its compile finishes.

The pieces: identical compiles run once, and at most `max_waiting` requests wait for compiles
(tiled.server.flights); repeat requests skip the verify and the decode through memos bounded
in bytes and keyed by digests (tiled.server.memos); requests are decoded and options_json
bounded before anything trusts them, and `add_to_server` registers the handlers
(tiled.server.wire).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import threading
import time

import grpc

import tiled
from tiled import config
from tiled.cache.entry import Entry
from tiled.compiler.cached import compile_action
from tiled.compiler.registry import get_backend, parse_target
from tiled.errors import CacheWriteError, ToolchainError, UnsupportedTarget
from tiled.ir import SCHEMA_VERSION, verify
from tiled.ir.program import Program
from tiled.server import heap
from tiled.server.flights import Flight, Flights, Waiter
from tiled.server.memos import ArtifactIndex, KeyMemo, ResponseMemo, request_digest
from tiled.server.status import abort, status_of
from tiled.server.wire import (
    RawCompile,
    Undecodable,
    add_to_server,
    check_options_size,
    parse_options,
)
from tiled.server.worker import COMPILE_JOB, compile_payload, compiled_entry
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import compile_pb2_grpc

log = logging.getLogger("tiled.server")
DEFAULT_INLINE = 1 << 20
MAX_CHUNK = 3 << 20
TRIM_AFTER_BYTES = 1 << 20  # a request this large hands its freed heap back to the OS


def resolve_local() -> str:
    """The host's own device as a target: the CUDA arch of GPU 0 read from the driver
    (sm_90 -> sm_90a), else the gfx arch of ROCm device 0 read from the HIP runtime
    ("rocm:gfx942" where tiled has that backend's arch), else the Apple GPU family of the
    default Metal device ("metal:apple9"; macOS with PyObjC's Metal), else "cpu"."""
    cuda = _local_cuda()
    if cuda is not None:
        return cuda
    from tiled.compiler.targets.rocm.backend import ARCHS as ROCM_ARCHS
    from tiled.runtime.rocm import local_arch

    arch = local_arch()
    if arch is None:
        from tiled.runtime.metal import local_arch as metal_arch

        apple = metal_arch()
        return f"metal:{apple}" if apple is not None else "cpu"
    if arch not in ROCM_ARCHS:
        log.info("ROCm device %s has no tiled backend arch (%s); target 'local' is cpu", arch,
                 ", ".join(ROCM_ARCHS))
        return "cpu"
    return f"rocm:{arch}"


def _local_cuda() -> str | None:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return None
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        err, dev = cu.cuDeviceGet(0)
        attr = cu.CUdevice_attribute
        _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    except Exception as e:
        log.info("no CUDA device (%s)", e)
        return None
    arch = f"sm_{major}{minor}"
    return f"cuda:{'sm_90a' if arch == 'sm_90' else arch}"


class CompilerService(compile_pb2_grpc.CompilerServicer):
    def __init__(self, cache, pool, metrics=None, local_target: str | None = None,
                 max_request_bytes: int = 64 << 20, compile_timeout_s: float = 120.0,
                 max_waiting: int | None = None):
        self.cache, self.pool, self.metrics = cache, pool, metrics
        self.local_target = local_target or resolve_local()
        self.max_request_bytes = max_request_bytes
        self.compile_timeout_s = compile_timeout_s
        # max_waiting: requests allowed to wait for compiles at once (None: no bound, for
        # in-process use)
        self.flights = Flights(max_waiting, metrics)
        self._artifacts = ArtifactIndex()  # for GetArtifact
        self._keys = KeyMemo()  # requests verified and keyed before
        self._responses = ResponseMemo()  # hit responses by request bytes
        self._lock = threading.Lock()
        self._hits = 0  # requests answered from the cache
        self._started = time.monotonic()  # Capabilities reports the uptime

    @property
    def max_waiting(self) -> int | None:
        return self.flights.max_waiting

    # -- helpers ----------------------------------------------------------------------------
    def _target(self, text: str):
        return parse_target(self.local_target if text in ("", "local") else text)

    def _options(self, text: str) -> dict:
        return parse_options(text)

    def _admit(self, request: cpb.CompileRequest):
        """(ActionKey, target, program, options) of a request: the program is decoded and
        verified, the target resolved and the options parsed, then keyed. A request seen before
        (same program bytes, target text, options text and namespace) is answered from a memo
        instead, with program and options None: a verified program stays verified, and this
        process's toolchain digest does not change while it runs (tiled.compiler.toolchain
        .digest memoizes it per process too). So a cache hit costs a hash, not a verify."""
        options_text, target_text = request.options_json, request.target
        check_options_size(options_text)  # before it is hashed, parsed or quoted
        namespace = config.get("cache_namespace")
        memo_key = request_digest(request.program.SerializeToString(deterministic=True),
                                  target_text, options_text, namespace)
        known = self._keys.lookup(memo_key)
        if known is not None:
            return known[0], known[1], None, None
        program = Program(request.program)
        verify(program)
        target = self._target(target_text)
        options = self._options(options_text)
        key = compile_action(program, target, options)
        self._keys.remember(memo_key, key, target, len(options_text) + len(namespace))
        return key, target, program, options

    def _observe(self, target, stages: dict, result: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_compile(target.backend, target.arch, stages, result)

    def _observe_failure(self, target_text: str | None, error: BaseException,
                         seconds: float) -> None:
        """A request that ended in `error`: result="error" and its status code counted. The
        labels come from the request's target only when it names a real backend, so a
        client cannot grow the label set (None: the request was not decoded)."""
        if self.metrics is None:
            return
        backend = arch = "unknown"
        if target_text is not None:
            try:
                target = self._target(target_text)
                backend, arch = target.backend, target.arch
            except Exception:  # an unknown target: its own error is the one reported
                pass
        self.metrics.observe_error(backend, arch, status_of(error)[0].name, seconds)

    def compile(self, request: cpb.CompileRequest, time_left: float | None,
                waiter: Waiter | None = None, *, counted: bool = True) -> cpb.CompileResponse:
        """One Compile, raising tiled errors (the caller maps them to statuses). `waiter`, when
        given, lets `flights.abandon` withdraw this request from a compile it waits for.
        `counted`: waiting for a compile takes one of `max_waiting` (QueueFull when none is
        left); Warm passes False, as its whole call holds one.

        Every request is observed once, with the result it got: "hit" (from the cache),
        "compiled" (its own compile), "merged" (it waited on an identical compile another
        request started) or "error" (with its status code); so the count of "compiled" is
        the number of compiles."""
        t0 = time.perf_counter()
        try:
            return self._compile(request, time_left, waiter, counted, t0)
        except Exception as e:
            self._observe_failure(request.target, e, time.perf_counter() - t0)
            raise

    def _compile(self, request: cpb.CompileRequest, time_left: float | None,
                 waiter: Waiter | None, counted: bool, t0: float) -> cpb.CompileResponse:
        action, target, program, options = self._admit(request)
        key = action.hex
        entry = self.cache.get(key)
        outcome = "hit"
        stages: dict[str, float] = {"verify": time.perf_counter() - t0}
        if entry is None:
            if request.cache_only:
                raise KeyError(f"action {key} is not cached")
            if program is None:  # admitted before (memo), evicted since: decode it again
                program, options = Program(request.program), self._options(request.options_json)
            with self.flights.waiting_slot(counted):
                entry, outcome = self.flights.once(
                    key, waiter or Waiter(), time_left,
                    lambda flight: self._lookup_or_compile(action, program, target, options,
                                                           time_left, stages, flight))
        hit = outcome == "hit"
        manifest_json = entry.manifest.decode()
        artifact_sha = json.loads(manifest_json)["artifact_sha256"]
        artifact = entry.blobs[artifact_sha]
        self._artifacts.note(artifact_sha, key)
        with self._lock:
            self._hits += hit
        stages["total"] = time.perf_counter() - t0
        self._observe(target, stages, outcome)
        limit = request.inline_limit or DEFAULT_INLINE
        return cpb.CompileResponse(
            action_key=key, manifest_json=manifest_json, artifact_sha256=artifact_sha,
            artifact_size=len(artifact), artifact=artifact if len(artifact) <= limit else b"",
            cache_hit=hit, resolved_target=str(target), stage_seconds=stages)

    def _lookup_or_compile(self, action, program, target, options, time_left, stages,
                           flight: Flight) -> tuple[Entry, str]:
        """The owner's part of a flight: the cache again (a request that missed just before
        the previous owner stored and left is a hit, not a second compile), else compile and
        store."""
        entry = self.cache.get(action.hex)
        if entry is not None:
            return entry, "hit"
        return self._compile_and_store(action, program, target, options, time_left, stages,
                                       flight), "compiled"

    def _compile_and_store(self, action, program, target, options, time_left, stages,
                           flight: Flight) -> Entry:
        key = action.hex
        timeout = self.compile_timeout_s if time_left is None else \
            max(0.001, min(self.compile_timeout_s, time_left))
        payload = compile_payload(program, target, options, action.record)
        job = self.pool.submit(key, COMPILE_JOB, payload, timeout_s=timeout)
        if self.flights.attach(key, flight, job):  # every request left before it existed
            job.cancel()
        result = job.result()
        entry, worker_stages = compiled_entry(key, result)
        for stage, seconds in worker_stages.items():  # the worker verifies again
            stages[stage] = stages.get(stage, 0.0) + seconds
        t_store = time.perf_counter()
        try:
            self.cache.put(entry)
        except CacheWriteError as e:
            log.warning("could not store %s: %s", key[:12], e)
        stages["store"] = time.perf_counter() - t_store
        return entry

    # -- RPCs -------------------------------------------------------------------------------
    def compile_rpc(self, request: RawCompile, context) -> bytes:
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

    def _compile_rpc(self, request: RawCompile, context) -> bytes:
        t0 = time.perf_counter()
        digest = hashlib.sha256(request.data).digest()
        known = self._responses.lookup(digest)
        if known is not None:
            key, target, body = known
            if self.cache.contains(key):  # evicted or cleared since: answer the long way
                seconds = time.perf_counter() - t0
                with self._lock:
                    self._hits += 1
                self.cache.events.lookup("response", "hit")
                self._observe(target, {"verify": seconds, "total": seconds}, "hit")
                return body  # as remembered: no stage_seconds (nothing was staged)
            self._responses.forget(digest)
        if isinstance(request.message, Undecodable):
            error = ValueError(request.message.message)
            self._observe_failure(None, error, time.perf_counter() - t0)
            raise error
        response = self._compile_call(request.message, context)
        hit = cpb.CompileResponse()
        hit.CopyFrom(response)
        hit.cache_hit = True
        hit.ClearField("stage_seconds")
        body = hit.SerializeToString(deterministic=True)
        if self._responses.admits(body):
            self._responses.remember(digest, response.action_key,
                                     self._target(response.resolved_target), body)
        return response.SerializeToString()

    def _compile_call(self, request: cpb.CompileRequest, context) -> cpb.CompileResponse:
        """`compile` for a gRPC call: the call's deadline bounds the compile, and its end
        (cancelled, deadline passed) withdraws it from the compile it waits for."""
        waiter = Waiter()
        context.add_callback(lambda: self.flights.abandon(waiter))  # when the RPC ends, any way
        response = self.compile(request, context.time_remaining(), waiter)
        waiter.flight = None  # answered: ending the RPC now abandons nothing
        return response

    def Compile(self, request, context):
        """Compile on a decoded request (the daemon registers `compile_rpc` instead)."""
        try:
            return self._compile_call(request, context)
        except Exception as e:
            status = status_of(e)
        context.abort(*status)

    def memo_bytes(self) -> dict[str, int]:
        """The bytes each per-request memo accounts for (tests, `tiled status` tooling)."""
        return {"keys": self._keys.nbytes, "responses": self._responses.nbytes}

    def GetArtifact(self, request, context):
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
        with self.flights.waiting_slot():
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
        for name in ("cpu", "cuda", "rocm", "metal"):
            try:
                b = get_backend(name)
                digest = toolchain_digest(parse_target(name if name == "cpu" else
                                                       f"{name}:{b.archs[-1]}"))
            except (UnsupportedTarget, ImportError, ToolchainError):
                continue  # a backend whose toolchain this host lacks is not offered
            backends.append(cpb.Backend(name=name, archs=list(b.archs), toolchain_digest=digest))
        stats = self.pool.stats()
        with self._lock:
            hits = self._hits
        merged = self.flights.merged
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


__all__ = ["CompilerService", "add_to_server", "resolve_local"]
