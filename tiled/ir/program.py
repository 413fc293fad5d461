"""`Program`: a Tile IR program, backed by its protobuf message."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from tiled.errors import IRDecodeError
from tiled.v1 import tile_ir_pb2 as pb

SCHEMA_VERSION = 1
MAX_PROGRAM_BYTES = 16 << 20


class Program:
    """One kernel in Tile IR. Thin wrapper over `tiled.v1.Program`: `.proto` is the message
    itself (mutable; copy before editing one that others hold). Equality is message equality,
    so two programs that differ only in names are unequal but share a `digest`."""

    __slots__ = ("proto",)

    def __init__(self, proto: pb.Program | None = None):
        self.proto = proto if proto is not None else pb.Program(schema_version=SCHEMA_VERSION)

    @classmethod
    def from_bytes(cls, data: bytes) -> Program:
        """Decodes wire bytes. Raises IRDecodeError for bytes that are not a Program, for an
        unknown schema version, or for input over MAX_PROGRAM_BYTES. Does not verify."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise IRDecodeError(f"expected bytes, got {type(data).__name__}")
        if len(data) > MAX_PROGRAM_BYTES:
            raise IRDecodeError(f"program is {len(data)} bytes; the limit is {MAX_PROGRAM_BYTES}")
        msg = pb.Program()
        try:
            msg.ParseFromString(bytes(data))
        except (DecodeError, RecursionError, ValueError) as e:
            raise IRDecodeError(f"not a Tile IR program: {e}") from None
        if msg.schema_version != SCHEMA_VERSION:
            raise IRDecodeError(
                f"Tile IR schema version {msg.schema_version} is not supported "
                f"(this tiled reads version {SCHEMA_VERSION})")
        return cls(msg)

    def to_bytes(self) -> bytes:
        """Deterministic encoding: equal programs give equal bytes."""
        return self.proto.SerializeToString(deterministic=True)

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical form: stable across processes and local renames."""
        from tiled.ir.canonical import program_digest

        return program_digest(self)

    def canonical(self) -> Program:
        from tiled.ir.canonical import canonicalize

        return canonicalize(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and self.proto == other.proto

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    def __str__(self) -> str:
        from tiled.ir.printer import format_program

        return format_program(self)

    def __repr__(self) -> str:
        return f"<tiled.ir.Program {self.name!r} {self.digest[:12]}>"


def as_program(kernel_or_program: object) -> Program:
    """A Program from a `@tiled.kernel` (its `.ir`) or a Program itself."""
    if isinstance(kernel_or_program, Program):
        return kernel_or_program
    ir = getattr(kernel_or_program, "ir", None)
    if isinstance(ir, Program):
        return ir
    raise TypeError(f"expected a @tiled.kernel or a tiled.ir.Program, "
                    f"got {type(kernel_or_program).__name__}")
