"""Data types of the Tile IR: names (as the DSL and manifests spell them) and their wire enums."""

from __future__ import annotations

from tiled.v1 import tile_ir_pb2 as pb

NAME_TO_ENUM: dict[str, int] = {
    "bool": pb.BOOL, "int8": pb.INT8, "int16": pb.INT16, "int32": pb.INT32, "int64": pb.INT64,
    "uint8": pb.UINT8, "uint16": pb.UINT16, "uint32": pb.UINT32, "uint64": pb.UINT64,
    "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16, "float32": pb.FLOAT32, "float64": pb.FLOAT64,
    "float8_e4m3": pb.FLOAT8_E4M3, "float8_e5m2": pb.FLOAT8_E5M2,
}
ENUM_TO_NAME: dict[int, str] = {v: k for k, v in NAME_TO_ENUM.items()}
ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
           "fp16": "float16", "fp32": "float32", "int": "int32", "e4m3": "float8_e4m3",
           "e5m2": "float8_e5m2", "float8_e4m3fn": "float8_e4m3"}

BITS = {"bool": 8, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16,
        "uint32": 32, "uint64": 64, "float16": 16, "bfloat16": 16, "float32": 32, "float64": 64,
        "float8_e4m3": 8, "float8_e5m2": 8}


def canonical_name(dtype: object) -> str:
    """Returns the canonical dtype name for a name, alias, numpy / torch dtype or wire enum.
    Raises ValueError naming the unknown dtype."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in ENUM_TO_NAME:
            return ENUM_TO_NAME[dtype]
        raise ValueError(f"unknown dtype enum {dtype}")
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if name is None:
        name = str(dtype).removeprefix("torch.")
    name = ALIASES.get(name, name)
    if name not in NAME_TO_ENUM:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(NAME_TO_ENUM)}")
    return name


def to_enum(dtype: object) -> int:
    return NAME_TO_ENUM[canonical_name(dtype)]


def bits(dtype: str | int) -> int:
    return BITS[canonical_name(dtype)]


def nbytes(dtype: str | int) -> int:
    return max(1, bits(dtype) // 8)


def is_float(dtype: str | int) -> bool:
    return canonical_name(dtype).startswith(("float", "bfloat"))


def is_int(dtype: str | int) -> bool:
    return canonical_name(dtype).startswith(("int", "uint"))


def is_bool(dtype: str | int) -> bool:
    return canonical_name(dtype) == "bool"
