"""What clients send, decoded and bounded before the service trusts it, and the gRPC handlers
that do the decoding.

Bytes that are not a valid request message decode to `Undecodable`, which the service answers
INVALID_ARGUMENT (not gRPC's INTERNAL "Exception deserializing request!"). A Compile request
arrives as `RawCompile`, its bytes kept (the hit fast path keys on them) and decoded only when
needed. options_json is refused past MAX_OPTIONS_BYTES before it is parsed, and past
MAX_OPTIONS_DEPTH levels of nesting.
"""

from __future__ import annotations

import json
from typing import Protocol

import grpc

from tiled.errors import QueueFull
from tiled.server.status import abort, status_of
from tiled.v1 import compile_pb2 as cpb

# Compile options are a few flags (tiled.compiler.registry.Option): a request carrying more
# than this is refused before its text is parsed or remembered.
MAX_OPTIONS_BYTES = 4096
MAX_OPTIONS_DEPTH = 4  # {"a": [{"b": 1}]} is 3 deep


class Undecodable:
    """What a request that is not valid protobuf deserializes to, so that the service (not
    gRPC's INTERNAL "Exception deserializing request!") answers INVALID_ARGUMENT."""

    def __init__(self, message: str):
        self.message = message


class RawCompile:
    """A Compile request as it arrived: its bytes (the hit fast path keys on them), decoded
    only when needed (`message`: a CompileRequest, or Undecodable)."""

    __slots__ = ("_message", "data")

    def __init__(self, data: bytes, message=None):
        self.data, self._message = data, message

    @property
    def message(self):
        if self._message is None:
            self._message = _parse_compile_request(self.data)
        return self._message

    def release(self) -> None:
        """Drops the bytes and the decoded message (the request has been answered)."""
        self.data, self._message = b"", Undecodable("the request was released")


def check_options_size(text: str) -> None:
    """ValueError (INVALID_ARGUMENT) for options_json past MAX_OPTIONS_BYTES."""
    # A character is at most 4 UTF-8 bytes: short text needs no encode to be known small.
    if len(text) > MAX_OPTIONS_BYTES // 4 and (size := len(text.encode())) > MAX_OPTIONS_BYTES:
        raise ValueError(f"options_json is {size} bytes; the limit is {MAX_OPTIONS_BYTES} "
                         "(compile options are a few flags)")


def parse_options(text: str) -> dict:
    """The options a request's options_json holds; ValueError (INVALID_ARGUMENT) for text
    past MAX_OPTIONS_BYTES, not JSON, nested past MAX_OPTIONS_DEPTH or not an object."""
    if not text:
        return {}
    check_options_size(text)
    try:
        options = json.loads(text)
    except ValueError as e:
        raise ValueError(f"options_json is not JSON: {e}") from None
    except RecursionError:  # json's decoder recurses once per level
        raise ValueError(f"options_json nests deeper than {MAX_OPTIONS_DEPTH} levels") \
            from None
    if not isinstance(options, dict):
        raise ValueError("options_json must be a JSON object")
    if _depth(options) > MAX_OPTIONS_DEPTH:
        raise ValueError(f"options_json nests deeper than {MAX_OPTIONS_DEPTH} levels")
    return options


def _depth(value) -> int:
    """How deep JSON data nests, without recursion (a scalar is 0, {} is 1)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


class Servicer(Protocol):
    """What `add_to_server` registers: tiled.v1.Compiler's methods on decoded requests, and
    Compile on a RawCompile, answering the response's bytes (tiled.server.service)."""

    def compile_rpc(self, request: RawCompile, context) -> bytes: ...


def add_to_server(service: Servicer, server: grpc.Server) -> None:
    """Registers `service` for every method of tiled.v1.Compiler (read from the proto's
    descriptor), with requests decoded by the service so that bad bytes are INVALID_ARGUMENT."""
    desc = cpb.DESCRIPTOR.services_by_name["Compiler"]
    handlers = {"Compile": grpc.unary_unary_rpc_method_handler(
        service.compile_rpc, request_deserializer=RawCompile,
        response_serializer=lambda data: data)}  # compile_rpc returns the response's bytes
    for m in desc.methods:
        if m.name in handlers:
            continue
        make = grpc.unary_stream_rpc_method_handler if m.server_streaming else \
            grpc.unary_unary_rpc_method_handler
        handlers[m.name] = make(
            _checked(getattr(service, m.name), m.server_streaming),
            request_deserializer=_lenient(getattr(cpb, m.input_type.name)),
            response_serializer=getattr(cpb, m.output_type.name).SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name,
                                                                          handlers),))
    server.add_registered_method_handlers(desc.full_name, handlers)


def _lenient(message_cls):
    def deserialize(data: bytes):
        try:
            return message_cls.FromString(data)
        except Exception as e:  # DecodeError, or RecursionError for absurd nesting
            return Undecodable(f"the request is not a valid {message_cls.DESCRIPTOR.full_name}: "
                               f"{e or type(e).__name__}")
    return deserialize


def _checked(method, streaming: bool):
    if streaming:
        def stream(request, context):
            if isinstance(request, Undecodable):
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:
                yield from method(request, context)
            except QueueFull as e:  # Warm past max_waiting: refused before its first result
                abort(context, *status_of(e))
        return stream

    def unary(request, context):
        if isinstance(request, Undecodable):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return method(request, context)
    return unary


_parse_compile_request = _lenient(cpb.CompileRequest)
