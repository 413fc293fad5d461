"""The one place where errors become gRPC status codes (ARCHITECTURE.md, Server), and where
every status message the daemon sends is capped: a message may quote what the client sent (a
target, an option, a debug name), and a client must never get back more than MAX_MESSAGE_BYTES
of it (a gRPC client refuses a status whose headers exceed its limit, 8-16 KiB)."""

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
MAX_MESSAGE_BYTES = 2048


def capped(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`message` cut to at most `limit` UTF-8 bytes, saying how long it was."""
    data = message.encode("utf-8", "replace")
    if len(data) <= limit:
        return message
    head = data[:limit - 40].decode("utf-8", "ignore")  # never split a character
    return f"{head}... ({len(data)} bytes, cut at {limit})"


def abort(context, code: grpc.StatusCode, message: str):
    """`context.abort` with the message capped; never returns."""
    context.abort(code, capped(message))


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, message) for an exception raised while serving a request; the message is at
    most MAX_MESSAGE_BYTES."""
    code, message = _status_of(exc)
    return code, capped(message)


def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    cls, code = next(((c, code) for c, code in _TABLE if isinstance(exc, c)),
                     (None, grpc.StatusCode.INTERNAL))
    if cls is None:
        return code, f"{type(exc).__name__}: {exc}"
    if cls is errors.WorkerCrashed:
        return code, f"the compiler crashed on this request: {exc}"
    if cls is KeyError:  # str(KeyError) quotes its message
        return code, str(exc.args[0]) if exc.args else "not found"
    return code, str(exc) or cls.__name__
