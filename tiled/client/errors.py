"""Client-side errors, and the one function that maps a gRPC status to a tiled error (the
daemon maps the other way, in one place too; compile.proto lists the codes)."""

from __future__ import annotations

import grpc

from tiled.errors import CompileTimeout, TiledError, UnsupportedTarget, VerifyError


class ServerBusy(TiledError, RuntimeError):
    """The daemon's compile queue is full, or the request is over its size limit
    (RESOURCE_EXHAUSTED). Retrying later may succeed; the client does not retry it itself."""


class ArtifactNotFound(TiledError, KeyError):
    """The daemon does not hold the blob or cache entry asked for (NOT_FOUND)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ServerUnavailable(TiledError, ConnectionError):
    """The daemon could not be reached (UNAVAILABLE), after the configured retries."""


class UntrustedSocket(TiledError, PermissionError):
    """The daemon's Unix socket, or its directory, could have been placed or swapped by
    another user (tiled.client.socket_trust); the client refuses it before connecting, as it
    would load what that daemon sends. Not retried."""


def error_for_status(code: grpc.StatusCode, details: str, address: str = "") -> TiledError:
    """The tiled error for a failed call's status code and message. The daemon's message is
    kept as is: for INVALID_ARGUMENT it is located ("file:line: ..." or a field path)."""
    details = details or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return VerifyError(details)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnsupportedTarget(details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CompileTimeout(details or "deadline exceeded")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ServerBusy(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return ArtifactNotFound(details)
    if code == grpc.StatusCode.UNAVAILABLE:
        where = f"tiled daemon at {address}" if address else "tiled daemon"
        return ServerUnavailable(f"{where} is unavailable: {details}")
    return TiledError(f"{code.name}: {details}")


def from_rpc_error(error: grpc.RpcError, address: str = "") -> TiledError:
    """`error_for_status` for a grpc.RpcError (sync) or grpc.aio.AioRpcError."""
    return error_for_status(error.code(), error.details() or "", address)


def error_for_code(code: int, details: str, address: str = "") -> TiledError:
    """`error_for_status` for a numeric code, as a WarmResult carries it."""
    by_value = {c.value[0]: c for c in grpc.StatusCode}
    return error_for_status(by_value.get(code, grpc.StatusCode.UNKNOWN), details, address)
