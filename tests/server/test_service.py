"""CompilerService in-process (no gRPC server): the hit fast path and its invalidation."""

import concurrent.futures
import sys
from pathlib import Path

import pytest

from tiled.cache.disk import DiskTier
from tiled.cache.memory import MemoryTier
from tiled.cache.tiered import TieredCache
from tiled.server.service import CompilerService
from tiled.server.wire import RawCompile
from tiled.server.worker import compile_job
from tiled.v1 import compile_pb2 as cpb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import elementwise


class InlinePool:
    """Runs compile jobs in this process; counts them."""

    workers, queue_limit = 1, 8

    def __init__(self):
        self.jobs = 0

    def submit(self, key, fn, payload, timeout_s=None):
        self.jobs += 1
        future = concurrent.futures.Future()
        future.set_result(compile_job(payload))
        return future

    def stats(self):
        return {"workers": 1}


class Context:
    def time_remaining(self):
        return 60.0

    def add_callback(self, fn):
        return True

    def abort(self, code, message):
        raise AssertionError(f"aborted: {code} {message}")


@pytest.fixture
def service(tmp_path):
    cache = TieredCache([MemoryTier(64 << 20), DiskTier(tmp_path / "cache")])
    return CompilerService(cache, InlinePool(), local_target="cpu")


def rpc(service, request):
    data = request.SerializeToString()
    return cpb.CompileResponse.FromString(
        service.compile_rpc(RawCompile(data, cpb.CompileRequest.FromString(data)), Context()))


def test_repeat_is_answered_from_the_response_memo(service):
    req = cpb.CompileRequest(program=elementwise.add(block=64).ir.proto, target="cpu")
    first, second, third = (rpc(service, req) for _ in range(3))
    assert service.pool.jobs == 1
    assert not first.cache_hit and second.cache_hit and third.cache_hit
    for r in (second, third):
        assert (r.action_key, r.artifact, r.manifest_json) == \
            (first.action_key, first.artifact, first.manifest_json)
    assert not third.stage_seconds  # answered from the memo: nothing staged
    assert service.Capabilities(cpb.CapabilitiesRequest(), Context()).cache_hits_total == 2


def test_memo_is_not_used_once_the_entry_is_gone(service):
    req = cpb.CompileRequest(program=elementwise.add(block=96).ir.proto, target="cpu")
    first = rpc(service, req)
    assert rpc(service, req).cache_hit
    assert service.cache.delete(first.action_key)
    again = rpc(service, req)
    assert not again.cache_hit and service.pool.jobs == 2
    assert again.action_key == first.action_key


def test_other_request_bytes_miss_the_memo(service):
    program = elementwise.add(block=128).ir.proto
    rpc(service, cpb.CompileRequest(program=program, target="cpu"))
    r = rpc(service, cpb.CompileRequest(program=program, target="cpu", inline_limit=1))
    assert r.cache_hit and r.artifact == b"" and r.artifact_size > 1  # not the inlined answer


class Stream:
    def __init__(self):
        self.aborted = None

    def abort(self, code, message):
        self.aborted = (code, message)
        raise RuntimeError(message)


def test_artifact_index_is_bounded_and_get_artifact_still_finds_evicted_ones(service,
                                                                             monkeypatch):
    """The digest -> key index GetArtifact uses is an LRU of ARTIFACT_INDEX_ENTRIES; an
    artifact that left it is still served, by digest from the cache's blobs."""
    from tiled.server import memos

    monkeypatch.setattr(memos, "ARTIFACT_INDEX_ENTRIES", 2)
    answers = [rpc(service, cpb.CompileRequest(program=elementwise.add(block=b).ir.proto,
                                               target="cpu")) for b in (32, 64, 160)]
    assert list(service._artifacts) == [a.artifact_sha256 for a in answers[1:]]
    for a in answers:  # the first one's digest left the index
        chunks = list(service.GetArtifact(cpb.GetArtifactRequest(sha256=a.artifact_sha256),
                                          Stream()))
        assert b"".join(c.data for c in chunks) == a.artifact


def test_key_memo_is_bounded_in_bytes_and_keeps_no_request_text(service, monkeypatch):
    """The memo of admitted requests is keyed by a digest of (program, target, options,
    namespace) and evicts by the bytes it accounts for, not by entry count."""
    from tiled.server import memos

    monkeypatch.setattr(memos, "KEY_MEMO_BYTES", 4 * memos.MEMO_ENTRY_OVERHEAD)
    program = elementwise.add(block=64).ir.proto
    for i in range(8):  # eight option texts (whitespace differs): eight memo entries
        text = '{"safe_access": true' + " " * i + "}"
        service._admit(cpb.CompileRequest(program=program, target="cpu", options_json=text))
    assert service.memo_bytes()["keys"] <= memos.KEY_MEMO_BYTES
    assert 1 <= len(service._keys) <= 4
    for key, value in service._keys.items():
        assert isinstance(key, bytes) and len(key) == 32
        assert not any(isinstance(v, str) for v in value)  # no options or target text


def test_response_memo_is_bounded_in_bytes(service, monkeypatch):
    from tiled.server import memos

    monkeypatch.setattr(memos, "RESPONSE_MEMO_BYTES", 64 << 10)
    for block in (32, 64, 96, 128, 160, 192):
        rpc(service, cpb.CompileRequest(program=elementwise.add(block=block).ir.proto,
                                        target="cpu", inline_limit=1))
    assert 0 < service.memo_bytes()["responses"] <= 64 << 10


def test_every_status_message_is_capped():
    import grpc

    from tiled.errors import VerifyError
    from tiled.server.status import MAX_MESSAGE_BYTES, status_of

    for exc in (ValueError("x" * 100_000), VerifyError("é" * 50_000, loc="k.py:1"),
                KeyError("k" * 10_000), RuntimeError("r" * 10_000)):
        _, message = status_of(exc)
        assert len(message.encode()) <= MAX_MESSAGE_BYTES
        assert "cut at 2048" in message
        message.encode("utf-8")  # never a split character
    assert status_of(ValueError("short")) == (grpc.StatusCode.INVALID_ARGUMENT, "short")
