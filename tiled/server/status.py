"""The one place where errors become gRPC status codes (ARCHITECTURE.md, Server)."""

from __future__ import annotations

import grpc

from tiled import errors


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, message) for an exception raised while serving a request."""
    table: list[tuple[type[BaseException], grpc.StatusCode]] = [
        (errors.IRDecodeError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.VerifyError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.KernelDefinitionError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.UnsupportedTarget, grpc.StatusCode.UNIMPLEMENTED),
        (errors.CompileTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.ToolchainError, grpc.StatusCode.INTERNAL),
        (errors.CompileError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.LaunchError, grpc.StatusCode.INTERNAL),
        (errors.TiledError, grpc.StatusCode.INTERNAL),
        (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
        (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (KeyError, grpc.StatusCode.NOT_FOUND),
    ]
    busy = getattr(errors, "QueueFull", None)
    if busy is not None and isinstance(exc, busy):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    crashed = getattr(errors, "WorkerCrashed", None)
    if crashed is not None and isinstance(exc, crashed):
        return grpc.StatusCode.INTERNAL, f"the compiler crashed on this request: {exc}"
    for cls, code in table:
        if isinstance(exc, cls):
            return code, str(exc) or cls.__name__
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
