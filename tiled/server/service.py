"""The Compiler gRPC service: answers from the cache or compiles in the worker pool.

Thread-safe: gRPC calls the methods from its thread pool. Every failure goes through
`status.status_of`, so each error has one gRPC code. Compiles run in worker processes
(tiled.server.pool); the cache (memory -> disk -> Redis) lives in this process, and an entry is
stored once its compile finishes.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time

import grpc

import tiled
from tiled.cache.entry import Entry, sha256_hex
from tiled.compiler.cached import compile_key
from tiled.compiler.registry import get_backend, parse_target
from tiled.errors import CacheWriteError, UnsupportedTarget
from tiled.ir import SCHEMA_VERSION, verify
from tiled.ir.program import Program
from tiled.server.status import status_of
from tiled.server.worker import decode, encode
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import compile_pb2_grpc

log = logging.getLogger("tiled.server")
DEFAULT_INLINE = 1 << 20
MAX_CHUNK = 3 << 20


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


class CompilerService(compile_pb2_grpc.CompilerServicer):
    def __init__(self, cache, pool, metrics=None, local_target: str | None = None,
                 max_request_bytes: int = 64 << 20, compile_timeout_s: float = 600.0):
        self.cache, self.pool, self.metrics = cache, pool, metrics
        self.local_target = local_target or resolve_local()
        self.max_request_bytes = max_request_bytes
        self.compile_timeout_s = compile_timeout_s
        self._artifacts: dict[str, str] = {}  # artifact sha256 -> action key that names it
        self._inflight: dict[str, concurrent.futures.Future] = {}  # key -> its entry
        self._lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------
    def _target(self, text: str):
        return parse_target(self.local_target if text in ("", "local") else text)

    def _options(self, text: str) -> dict:
        if not text:
            return {}
        try:
            options = json.loads(text)
        except ValueError as e:
            raise ValueError(f"options_json is not JSON: {e}") from None
        if not isinstance(options, dict):
            raise ValueError("options_json must be a JSON object")
        return options

    def _observe(self, target, stages: dict, result: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_compile(target.backend, target.arch, stages, result)

    def compile(self, request: cpb.CompileRequest, time_left: float | None) -> cpb.CompileResponse:
        """One Compile, raising tiled errors (the caller maps them to statuses)."""
        t0 = time.perf_counter()
        program = Program(request.program)
        verify(program)
        target = self._target(request.target)
        options = self._options(request.options_json)
        key = compile_key(program, target, options)
        t_verify = time.perf_counter() - t0
        entry = self.cache.get(key)
        hit = entry is not None
        stages: dict[str, float] = {"verify": t_verify}
        if entry is None:
            if request.cache_only:
                raise KeyError(f"action {key} is not cached")
            entry, hit = self._compile_once(key, program, target, options, time_left, stages, t0)
        manifest_json = entry.manifest.decode()
        artifact_sha = json.loads(manifest_json)["artifact_sha256"]
        artifact = entry.blobs[artifact_sha]
        with self._lock:
            self._artifacts[artifact_sha] = key
        stages["total"] = time.perf_counter() - t0
        self._observe(target, stages, "hit" if hit else "ok")
        limit = request.inline_limit or DEFAULT_INLINE
        return cpb.CompileResponse(
            action_key=key, manifest_json=manifest_json, artifact_sha256=artifact_sha,
            artifact_size=len(artifact), artifact=artifact if len(artifact) <= limit else b"",
            cache_hit=hit, resolved_target=str(target), stage_seconds=stages)

    def _compile_once(self, key, program, target, options, time_left, stages, t0):
        """Single-flight over compile *and* store: the first request for a key compiles and
        stores; requests arriving meanwhile wait for its entry. The owner looks the cache up
        again after registering, so a request that missed just before the previous owner
        stored and left is a hit, not a second compile."""
        with self._lock:
            pending = self._inflight.get(key)
            if pending is None:
                pending = self._inflight[key] = concurrent.futures.Future()
                owner = True
            else:
                owner = False
        if not owner:
            if self.metrics is not None:
                self.metrics.pool_event("merged", {})
            return pending.result(), False  # merged: not from the cache, not compiled here
        try:
            entry = self.cache.get(key)
            hit = entry is not None
            if entry is None:
                entry = self._compile_and_store(key, program, target, options, time_left,
                                                stages, t0)
            pending.set_result(entry)
            return entry, hit
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._inflight[key]

    def _compile_and_store(self, key, program, target, options, time_left, stages, t0):
        timeout = self.compile_timeout_s if time_left is None else \
            max(0.001, min(self.compile_timeout_s, time_left))
        payload = encode({"target": str(target), "options": options}, program.to_bytes())
        try:
            result = self.pool.submit(key, "tiled.server.worker:compile_job", payload,
                                      timeout_s=timeout).result()
        except Exception:
            self._observe(target, {"total": time.perf_counter() - t0}, "error")
            raise
        header, artifact = decode(result)
        stages.update(header.get("stages", {}))
        entry = Entry(key, header["manifest"].encode(), {sha256_hex(artifact): artifact})
        t_store = time.perf_counter()
        try:
            self.cache.put(entry)
        except CacheWriteError as e:
            log.warning("could not store %s: %s", key[:12], e)
        stages["store"] = time.perf_counter() - t_store
        return entry

    # -- RPCs -------------------------------------------------------------------------------
    def Compile(self, request, context):
        try:
            return self.compile(request, context.time_remaining())
        except Exception as e:
            code, message = status_of(e)
            context.abort(code, message)

    def GetArtifact(self, request, context):
        with self._lock:
            key = self._artifacts.get(request.sha256)
        entry = self.cache.get(key) if key else None
        data = entry.blobs.get(request.sha256) if entry else None
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"artifact {request.sha256} is not held by this daemon")
        chunk = min(request.chunk_bytes or DEFAULT_INLINE, MAX_CHUNK)
        for off in range(0, len(data), chunk):
            yield cpb.ArtifactChunk(offset=off, data=data[off:off + chunk], total_size=len(data))

    def FindMissing(self, request, context):
        return cpb.FindMissingResponse(
            missing=[k for k in request.action_keys if not self.cache.contains(k)])

    def Warm(self, request, context):
        workers = max(1, getattr(self.pool, "workers", 1) * 2)
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            futures = {ex.submit(self.compile, item, None): i
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
        stats = self.pool.stats() if hasattr(self.pool, "stats") else {}
        return cpb.CapabilitiesResponse(
            version=tiled.__version__, backends=backends, local_target=self.local_target,
            tile_ir_schema_version=SCHEMA_VERSION, max_request_bytes=self.max_request_bytes,
            max_inline_bytes=DEFAULT_INLINE, workers=int(stats.get("workers", 0)),
            queue_limit=int(getattr(self.pool, "queue_limit", 0)))
