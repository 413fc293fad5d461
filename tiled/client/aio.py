"""The asyncio client (grpc.aio): the methods of tiled.client.Client as coroutines.

    async with AsyncClient("unix:///run/tiled.sock") as c:
        kernel = await c.compile(vadd, "cuda:sm_90a")

Use one AsyncClient from one event loop; its channel is opened on first use, in that loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
import grpc.aio

from tiled.client.client import (
    CHANNEL_OPTIONS,
    ChunkAssembler,
    RemoteKernel,
    TableKey,
    as_program,
    backoff_delays,
    channel_credentials,
    check_artifact,
    compile_request,
    configure,
    table_key,
    unavailable,
    warm_requests,
)
from tiled.client.errors import from_rpc_error
from tiled.client.socket_trust import refuse_untrusted_socket
from tiled.runtime import load
from tiled.v1 import compile_pb2, compile_pb2_grpc

T = TypeVar("T")


class AsyncClient:
    """Like tiled.client.Client (same arguments, table, retries and errors), for asyncio."""

    def __init__(self, address: str | None = None, timeout_s: float | None = None, *,
                 retries: int | None = None, backoff_s: float | None = None,
                 inline_limit: int = 0):
        configure(self, address, timeout_s, retries, backoff_s, inline_limit)
        self._channel: grpc.aio.Channel | None = None
        self._stub: compile_pb2_grpc.CompilerStub | None = None
        self._table: dict[TableKey, RemoteKernel] = {}

    @property
    def stub(self) -> compile_pb2_grpc.CompilerStub:
        if self._stub is None:
            creds = channel_credentials(self.address)
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS) \
                if creds is None else grpc.aio.secure_channel(self.address, creds,
                                                              CHANNEL_OPTIONS)
            self._stub = compile_pb2_grpc.CompilerStub(self._channel)
        return self._stub

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        start = time.monotonic()
        delays = backoff_delays(self.retries, self.backoff_s)
        while True:
            refuse_untrusted_socket(self.address)  # as Client._call: before each attempt
            try:
                return await fn()
            except grpc.RpcError as e:
                delay = next(delays, None) if unavailable(e) else None
                if delay is None or time.monotonic() - start + delay > self.timeout_s:
                    raise from_rpc_error(e, self.address) from None
            await asyncio.sleep(delay)

    async def compile(self, kernel_or_program: Any, target: str = "local",
                      options: dict | None = None) -> RemoteKernel:
        program = as_program(kernel_or_program)
        key = table_key(program, target, options)
        if key in self._table:
            return self._table[key]
        response, artifact = await self.compile_raw(program, target, options)
        kernel = RemoteKernel(load(artifact, response.manifest_json), artifact, response)
        return self._table.setdefault(key, kernel)

    async def compile_raw(self, kernel_or_program: Any, target: str = "local",
                          options: dict | None = None, *, cache_only: bool = False,
                          ) -> tuple[compile_pb2.CompileResponse, bytes]:
        request = compile_request(kernel_or_program, target, options,
                                  inline_limit=self.inline_limit, cache_only=cache_only)
        response = await self._call(lambda: self.stub.Compile(request, timeout=self.timeout_s))
        data = response.artifact or await self.get_artifact(response.artifact_sha256)
        return response, check_artifact(data, response)

    async def get_artifact(self, sha256: str, chunk_bytes: int = 0) -> bytes:
        request = compile_pb2.GetArtifactRequest(sha256=sha256, chunk_bytes=chunk_bytes)

        async def fetch() -> bytes:
            assembler = ChunkAssembler(sha256)
            async for chunk in self.stub.GetArtifact(request, timeout=self.timeout_s):
                assembler.add(chunk)
            return assembler.result()

        return await self._call(fetch)

    async def find_missing(self, keys: Iterable[str]) -> list[str]:
        request = compile_pb2.FindMissingRequest(action_keys=list(keys))
        response = await self._call(
            lambda: self.stub.FindMissing(request, timeout=self.timeout_s))
        return list(response.missing)

    async def warm(self, requests: Iterable[Any]) -> AsyncIterator[compile_pb2.WarmResult]:
        """One WarmResult per item as each finishes; retried on UNAVAILABLE only before the
        first result."""
        request = warm_requests(requests)

        async def first() -> tuple[Any, Any]:
            call = self.stub.Warm(request, timeout=self.timeout_s)
            return call, await call.read()

        call, result = await self._call(first)
        try:
            while result is not grpc.aio.EOF:
                yield result
                result = await call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None

    async def capabilities(self) -> compile_pb2.CapabilitiesResponse:
        return await self._call(lambda: self.stub.Capabilities(
            compile_pb2.CapabilitiesRequest(), timeout=self.timeout_s))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<tiled.client.aio.AsyncClient {self.address}>"
