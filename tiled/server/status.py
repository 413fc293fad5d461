"""The one place where errors become gRPC status codes (ARCHITECTURE.md, Server)."""

from __future__ import annotations

import concurrent.futures

import grpc

from tiled import errors

# First match wins: subclasses before their bases.
_TABLE: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (errors.QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.WorkerCrashed, grpc.StatusCode.INTERNAL),
    (errors.IRDecodeError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.VerifyError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.KernelDefinitionError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.UnsupportedTarget, grpc.StatusCode.UNIMPLEMENTED),
    (errors.CompileTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.ToolchainError, grpc.StatusCode.INTERNAL),
    (errors.CompileError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.LaunchError, grpc.StatusCode.INTERNAL),
    (errors.TiledError, grpc.StatusCode.INTERNAL),
    (concurrent.futures.CancelledError, grpc.StatusCode.CANCELLED),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (KeyError, grpc.StatusCode.NOT_FOUND),
]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, message) for an exception raised while serving a request."""
    if isinstance(exc, errors.WorkerCrashed):
        return grpc.StatusCode.INTERNAL, f"the compiler crashed on this request: {exc}"
    if isinstance(exc, KeyError):  # str(KeyError) quotes its message
        return grpc.StatusCode.NOT_FOUND, str(exc.args[0]) if exc.args else "not found"
    for cls, code in _TABLE:
        if isinstance(exc, cls):
            return code, str(exc) or cls.__name__
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
