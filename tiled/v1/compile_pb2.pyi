from tiled.v1 import tile_ir_pb2 as _tile_ir_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompileRequest(_message.Message):
    __slots__ = ("program", "target", "options_json", "inline_limit", "cache_only")
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    INLINE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CACHE_ONLY_FIELD_NUMBER: _ClassVar[int]
    program: _tile_ir_pb2.Program
    target: str
    options_json: str
    inline_limit: int
    cache_only: bool
    def __init__(self, program: _Optional[_Union[_tile_ir_pb2.Program, _Mapping]] = ..., target: _Optional[str] = ..., options_json: _Optional[str] = ..., inline_limit: _Optional[int] = ..., cache_only: bool = ...) -> None: ...

class CompileResponse(_message.Message):
    __slots__ = ("action_key", "manifest_json", "artifact_sha256", "artifact_size", "artifact", "cache_hit", "resolved_target", "stage_seconds")
    class StageSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ACTION_KEY_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SHA256_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_SIZE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_TARGET_FIELD_NUMBER: _ClassVar[int]
    STAGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    action_key: str
    manifest_json: str
    artifact_sha256: str
    artifact_size: int
    artifact: bytes
    cache_hit: bool
    resolved_target: str
    stage_seconds: _containers.ScalarMap[str, float]
    def __init__(self, action_key: _Optional[str] = ..., manifest_json: _Optional[str] = ..., artifact_sha256: _Optional[str] = ..., artifact_size: _Optional[int] = ..., artifact: _Optional[bytes] = ..., cache_hit: bool = ..., resolved_target: _Optional[str] = ..., stage_seconds: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("sha256", "chunk_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    chunk_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("offset", "data", "total_size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_size: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ...) -> None: ...

class FindMissingRequest(_message.Message):
    __slots__ = ("action_keys",)
    ACTION_KEYS_FIELD_NUMBER: _ClassVar[int]
    action_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, action_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class FindMissingResponse(_message.Message):
    __slots__ = ("missing",)
    MISSING_FIELD_NUMBER: _ClassVar[int]
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, missing: _Optional[_Iterable[str]] = ...) -> None: ...

class WarmRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[CompileRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[CompileRequest, _Mapping]]] = ...) -> None: ...

class WarmResult(_message.Message):
    __slots__ = ("index", "code", "message", "action_key", "cache_hit")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTION_KEY_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    index: int
    code: int
    message: str
    action_key: str
    cache_hit: bool
    def __init__(self, index: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., action_key: _Optional[str] = ..., cache_hit: bool = ...) -> None: ...

class CapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Backend(_message.Message):
    __slots__ = ("name", "archs", "toolchain_digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHS_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    archs: _containers.RepeatedScalarFieldContainer[str]
    toolchain_digest: str
    def __init__(self, name: _Optional[str] = ..., archs: _Optional[_Iterable[str]] = ..., toolchain_digest: _Optional[str] = ...) -> None: ...

class CapabilitiesResponse(_message.Message):
    __slots__ = ("version", "backends", "local_target", "tile_ir_schema_version", "max_request_bytes", "max_inline_bytes", "workers", "queue_limit", "uptime_seconds", "queued", "in_flight", "compiles_total", "compile_failures_total", "merged_total", "cache_hits_total", "workers_replaced_total", "cache_tiers")
    class CacheTier(_message.Message):
        __slots__ = ("name", "bytes", "max_bytes", "remote")
        NAME_FIELD_NUMBER: _ClassVar[int]
        BYTES_FIELD_NUMBER: _ClassVar[int]
        MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
        REMOTE_FIELD_NUMBER: _ClassVar[int]
        name: str
        bytes: int
        max_bytes: int
        remote: bool
        def __init__(self, name: _Optional[str] = ..., bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., remote: bool = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TARGET_FIELD_NUMBER: _ClassVar[int]
    TILE_IR_SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COMPILES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FAILURES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MERGED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKERS_REPLACED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_TIERS_FIELD_NUMBER: _ClassVar[int]
    version: str
    backends: _containers.RepeatedCompositeFieldContainer[Backend]
    local_target: str
    tile_ir_schema_version: int
    max_request_bytes: int
    max_inline_bytes: int
    workers: int
    queue_limit: int
    uptime_seconds: float
    queued: int
    in_flight: int
    compiles_total: int
    compile_failures_total: int
    merged_total: int
    cache_hits_total: int
    workers_replaced_total: int
    cache_tiers: _containers.RepeatedCompositeFieldContainer[CapabilitiesResponse.CacheTier]
    def __init__(self, version: _Optional[str] = ..., backends: _Optional[_Iterable[_Union[Backend, _Mapping]]] = ..., local_target: _Optional[str] = ..., tile_ir_schema_version: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., max_inline_bytes: _Optional[int] = ..., workers: _Optional[int] = ..., queue_limit: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., queued: _Optional[int] = ..., in_flight: _Optional[int] = ..., compiles_total: _Optional[int] = ..., compile_failures_total: _Optional[int] = ..., merged_total: _Optional[int] = ..., cache_hits_total: _Optional[int] = ..., workers_replaced_total: _Optional[int] = ..., cache_tiers: _Optional[_Iterable[_Union[CapabilitiesResponse.CacheTier, _Mapping]]] = ...) -> None: ...
