"""An in-process compile daemon with canned, scriptable answers, on a real unix socket: the
client's tests do not depend on the real daemon (tiled.server).

    with serve(tmp_path / "d.sock") as (fake, address):
        fake.set_kernel(manifest_json, artifact)
        fake.fail("Compile", grpc.StatusCode.UNAVAILABLE, times=2)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import Counter
from concurrent import futures

import grpc

from tiled.v1 import compile_pb2, compile_pb2_grpc


class FakeCompiler(compile_pb2_grpc.CompilerServicer):
    def __init__(self):
        self.calls: Counter[str] = Counter()
        self.requests: list[compile_pb2.CompileRequest] = []
        self.blobs: dict[str, bytes] = {}
        self.manifest_json = ""
        self.artifact_sha256 = ""
        self.inline = True               # inline the artifact in CompileResponse
        self.chunk_bytes = 1 << 20       # GetArtifact chunk size
        self.chunks_sent = 0
        self.corrupt_chunk: int | None = None   # flip a byte in this GetArtifact chunk
        self.corrupt_inline = False
        self.cached: set[str] = set()
        self._failures: dict[str, list[tuple[grpc.StatusCode, str]]] = {}
        self._lock = threading.Lock()

    def set_kernel(self, manifest_json: str, artifact: bytes) -> None:
        """Every Compile answers with this manifest and artifact."""
        self.manifest_json = manifest_json
        self.artifact_sha256 = json.loads(manifest_json)["artifact_sha256"]
        self.blobs[self.artifact_sha256] = artifact

    def fail(self, method: str, code: grpc.StatusCode, message: str = "", times: int = 1):
        """The next `times` calls of `method` end with `code` and `message`."""
        with self._lock:
            self._failures.setdefault(method, []).extend([(code, message)] * times)

    def _enter(self, method: str, context) -> None:
        with self._lock:
            self.calls[method] += 1
            queued = self._failures.get(method)
            failure = queued.pop(0) if queued else None
        if failure:
            context.abort(*failure)

    def Compile(self, request, context):
        self._enter("Compile", context)
        self.requests.append(request)
        key = hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
        hit = key in self.cached
        self.cached.add(key)
        artifact = self.blobs[self.artifact_sha256]
        if self.corrupt_inline:
            artifact = bytes([artifact[0] ^ 1]) + artifact[1:]
        return compile_pb2.CompileResponse(
            action_key=key, manifest_json=self.manifest_json,
            artifact_sha256=self.artifact_sha256, artifact_size=len(artifact),
            artifact=artifact if self.inline else b"", cache_hit=hit,
            resolved_target=request.target if request.target != "local" else "cpu")

    def GetArtifact(self, request, context):
        self._enter("GetArtifact", context)
        data = self.blobs.get(request.sha256)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        step = request.chunk_bytes or self.chunk_bytes
        for n, offset in enumerate(range(0, len(data), step)):
            piece = data[offset:offset + step]
            if n == self.corrupt_chunk:
                piece = bytes([piece[0] ^ 0xFF]) + piece[1:]
            self.chunks_sent += 1
            yield compile_pb2.ArtifactChunk(offset=offset, data=piece, total_size=len(data))

    def FindMissing(self, request, context):
        self._enter("FindMissing", context)
        return compile_pb2.FindMissingResponse(
            missing=[k for k in request.action_keys if k not in self.cached])

    def Warm(self, request, context):
        self._enter("Warm", context)
        for i, item in enumerate(request.items):
            if item.target.startswith("nope"):
                yield compile_pb2.WarmResult(index=i, code=grpc.StatusCode.UNIMPLEMENTED.value[0],
                                             message=f"no backend for {item.target}")
                continue
            response = self.Compile(item, context)
            yield compile_pb2.WarmResult(index=i, action_key=response.action_key,
                                         cache_hit=response.cache_hit)

    def Capabilities(self, request, context):
        self._enter("Capabilities", context)
        return compile_pb2.CapabilitiesResponse(
            version="fake", local_target="cpu", tile_ir_schema_version=1,
            backends=[compile_pb2.Backend(name="cpu", archs=["x86_64"])])


@contextlib.contextmanager
def serve(socket_path):
    """Runs a FakeCompiler on `socket_path`; yields (fake, "unix://<socket_path>")."""
    fake = FakeCompiler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    compile_pb2_grpc.add_CompilerServicer_to_server(fake, server)
    address = f"unix://{socket_path}"
    server.add_insecure_port(address)
    server.start()
    try:
        yield fake, address
    finally:
        server.stop(None)
