"""The `metal` field of a Metal manifest: how the kernel takes its arguments, so a loader
binds them without parsing MSL.

    {"language_version": "3.0",       MSL version to compile the source with (3.0 or 3.1)
     "simd_width": 32,                threads per simdgroup the kernel assumes
     "threadgroup_bytes": 12288,      threadgroup memory the kernel declares (static)
     "fast_math": false,              compile with fast math (tiled's kernels: off)
     "bindings": [{"buffer": 0},      one per kernel_args entry, in order: a tensor's buffer
                  {"offset": 0, "size": 4}],  index, or a scalar / dim's place in the struct
     "args_buffer": 3,                buffer index of the scalar-argument struct (null: none)
     "args_size": 8}                  its bytes (8 per scalar: TVM gives each an 8-byte slot)

A scalar or dim is written at its offset in its own dtype (little-endian), the rest of its
8-byte slot zero. Checked on construction of the Manifest (ManifestError naming the field).
"""

from __future__ import annotations

from typing import Any

FIELDS = {"language_version", "simd_width", "threadgroup_bytes", "fast_math", "bindings",
          "args_buffer", "args_size"}
LANGUAGE_VERSIONS = ("3.0", "3.1", "3.2")
MAX_BUFFERS = 31  # buffer argument table entries of a compute function


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_metal(rec: object, kernel_args: tuple, arg_sizes: list[int | None],
                fail) -> dict[str, Any]:
    """Checks a manifest's `metal` record against its kernel_args (`arg_sizes`: the bytes
    of each, None for a tensor); `fail(where, problem)` builds the error. Returns it."""
    if not isinstance(rec, dict) or set(rec) != FIELDS:
        raise fail("metal", f"expected an object with the fields {sorted(FIELDS)}")
    if rec["language_version"] not in LANGUAGE_VERSIONS:
        raise fail("metal.language_version", f"expected one of {', '.join(LANGUAGE_VERSIONS)}, "
                   f"got {rec['language_version']!r}")
    if rec["simd_width"] != 32:
        raise fail("metal.simd_width", f"expected 32 (Apple GPUs), got {rec['simd_width']!r}")
    for key in ("threadgroup_bytes", "args_size"):
        if not _int(rec[key]) or rec[key] < 0:
            raise fail(f"metal.{key}", f"expected an int >= 0, got {rec[key]!r}")
    if not isinstance(rec["fast_math"], bool):
        raise fail("metal.fast_math", f"expected a bool, got {rec['fast_math']!r}")
    args_buffer = rec["args_buffer"]
    if args_buffer is not None and not (_int(args_buffer) and 0 <= args_buffer < MAX_BUFFERS):
        raise fail("metal.args_buffer", f"expected null or an int in 0..{MAX_BUFFERS - 1}, got "
                   f"{args_buffer!r}")
    binds = rec["bindings"]
    if not isinstance(binds, list) or len(binds) != len(kernel_args):
        raise fail("metal.bindings", f"expected one entry per kernel_args entry "
                   f"({len(kernel_args)})")
    used: set[int] = set() if args_buffer is None else {args_buffer}
    slots: set[int] = set()
    for i, (b, ka, size) in enumerate(zip(binds, kernel_args, arg_sizes, strict=True)):
        where = f"metal.bindings[{i}]"
        if ka.kind == "tensor":
            if not isinstance(b, dict) or set(b) != {"buffer"} or not _int(b["buffer"]) or \
                    not 0 <= b["buffer"] < MAX_BUFFERS or b["buffer"] in used:
                raise fail(where, f"a tensor takes {{'buffer': i}}, i in 0..{MAX_BUFFERS - 1} "
                           f"and used once; got {b!r}")
            used.add(b["buffer"])
            continue
        if ka.kind not in ("scalar", "dim"):
            raise fail(where, f"a metal kernel has no {ka.kind} argument")
        if args_buffer is None:
            raise fail(where, "a scalar or dim needs the argument struct (args_buffer)")
        if not isinstance(b, dict) or set(b) != {"offset", "size"} or not _int(b["offset"]) or \
                b["offset"] % 8 or b["size"] != size or b["offset"] + 8 > rec["args_size"] or \
                b["offset"] in slots:
            raise fail(where, f"expected {{'offset': o, 'size': {size}}} with o a free 8-byte "
                       f"slot below args_size ({rec['args_size']}); got {b!r}")
        slots.add(b["offset"])
    return rec


def pack_args(rec: dict, kernel_args: tuple, values: list) -> bytes:
    """The argument struct's bytes: `values[i]` (bytes in the dtype of kernel_args[i], or
    None for a tensor) at the offsets `rec` gives."""
    out = bytearray(rec["args_size"])
    for b, value in zip(rec["bindings"], values, strict=True):
        if value is None:
            continue
        if len(value) != b["size"]:
            raise ValueError(f"{len(value)} bytes for a {b['size']}-byte argument")
        out[b["offset"]:b["offset"] + b["size"]] = value
    return bytes(out)
