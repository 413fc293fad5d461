"""The thin client of the compile daemon: sync (`Client`) and asyncio (`aio.AsyncClient`).
Imports grpc, protobuf, tiled.ir and tiled.runtime only: never TVM nor tiled.compiler.

    kernel = tiled.client.compile_via_server(vadd, "cuda:sm_90a")   # TILED_SERVER's daemon
    kernel(A, B, C)
"""

from __future__ import annotations

import threading
from typing import Any

from tiled import config
from tiled.client.client import Client, RemoteKernel
from tiled.client.errors import (
    ArtifactNotFound,
    ServerBusy,
    ServerUnavailable,
    UntrustedSocket,
    error_for_code,
    error_for_status,
    from_rpc_error,
)

_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def default_client(address: str | None = None) -> Client:
    """The process's shared Client for `address` (default TILED_SERVER), created on first
    use; its kernel table makes repeat compiles in this process free."""
    address = address or config.get("server")
    with _clients_lock:
        client = _clients.get(address)
        if client is None:
            client = _clients[address] = Client(address)
        return client


def compile_via_server(kernel_or_program: Any, target: str = "local", *, cache: bool = True,
                       **options: Any) -> RemoteKernel:
    """What `tiled.compile` does when TILED_SERVER is set: compiles on that daemon through
    the shared client and returns the loaded kernel (`.manifest`, `.artifact`, `.action_key`,
    `.cache_hit`). The daemon owns caching; `cache=False` only skips the in-process table."""
    client = default_client()
    if cache:
        return client.compile(kernel_or_program, target, options)
    response, artifact = client.compile_raw(kernel_or_program, target, options)
    from tiled.runtime import load

    return RemoteKernel(load(artifact, response.manifest_json), artifact, response)


__all__ = ["ArtifactNotFound", "Client", "RemoteKernel", "ServerBusy", "ServerUnavailable",
           "UntrustedSocket", "compile_via_server", "default_client", "error_for_code",
           "error_for_status", "from_rpc_error"]
