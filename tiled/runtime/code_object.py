"""The `code_object` field of a ROCm manifest: what the compiler read back from the HSACO it
shipped, so a loader packs the kernel's arguments by the code object's own layout and a tool
can see the kernel's resources without parsing ELF.

    {"code_object_version": 5, "isa": "amdgcn-amd-amdhsa--gfx942", "arch": "gfx942",
     "xnack": "any", "sramecc": "any", "wavefront_size": 64, "lds_bytes": 16384,
     "kernarg_size": 28, "kernarg_align": 8,
     "kernarg": [{"offset": 0, "size": 8}, ...],     one per kernel_args entry, in order
     "max_workgroup_size": 256, "vgpr_count": 64, "sgpr_count": 24, "agpr_count": 0,
     "vgpr_spill_count": 0, "sgpr_spill_count": 0, "private_segment_bytes": 0}

xnack / sramecc: "any" (the code object runs with the feature on or off), "on", "off" or
"unsupported". Checked on construction of the Manifest (ManifestError naming the field).
"""

from __future__ import annotations

from typing import Any

INT_FIELDS = ("code_object_version", "wavefront_size", "lds_bytes", "kernarg_size",
              "kernarg_align", "max_workgroup_size", "vgpr_count", "sgpr_count", "agpr_count",
              "vgpr_spill_count", "sgpr_spill_count", "private_segment_bytes")
STR_FIELDS = ("isa", "arch", "xnack", "sramecc")
SETTINGS = ("any", "on", "off", "unsupported")
# Bytes of each kernel argument kind in the kernarg segment (scalars: their dtype's size).
POINTER_BYTES = 8


def check_code_object(co: object, kernel_args: tuple, arg_sizes: list[int | None],
                      fail) -> dict[str, Any]:
    """Checks a manifest's code_object against its kernel_args (`arg_sizes`: the bytes each
    takes, None where the kind has no fixed size); `fail(where, problem)` builds the error.
    Returns the record."""
    if not isinstance(co, dict):
        raise fail("code_object", f"expected an object, got {type(co).__name__}")
    want = set(INT_FIELDS) | set(STR_FIELDS) | {"kernarg"}
    if set(co) != want:
        raise fail("code_object", f"expected the fields {sorted(want)}, got {sorted(co)}")
    for key in INT_FIELDS:
        v = co[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise fail(f"code_object.{key}", f"expected an int >= 0, got {v!r}")
    for key in STR_FIELDS:
        if not isinstance(co[key], str) or not co[key]:
            raise fail(f"code_object.{key}", f"expected a non-empty string, got {co[key]!r}")
    for key in ("xnack", "sramecc"):
        if co[key] not in SETTINGS:
            raise fail(f"code_object.{key}", f"expected one of {', '.join(SETTINGS)}, got "
                       f"{co[key]!r}")
    if co["wavefront_size"] not in (32, 64):
        raise fail("code_object.wavefront_size", f"expected 32 or 64, got "
                   f"{co['wavefront_size']}")
    layout = co["kernarg"]
    if not isinstance(layout, list) or len(layout) != len(kernel_args):
        raise fail("code_object.kernarg", f"expected one entry per kernel_args entry "
                   f"({len(kernel_args)}), got {layout!r}")
    end = 0
    for i, (entry, size) in enumerate(zip(layout, arg_sizes, strict=True)):
        where = f"code_object.kernarg[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"offset", "size"} or not all(
                isinstance(entry[k], int) and not isinstance(entry[k], bool) and entry[k] >= 0
                for k in entry):
            raise fail(where, f"expected {{offset, size}} ints >= 0, got {entry!r}")
        if size is not None and entry["size"] != size:
            raise fail(where, f"size {entry['size']}, but kernel_args[{i}] takes {size} bytes")
        if entry["offset"] < end or entry["offset"] % max(1, min(entry["size"], 8)):
            raise fail(where, f"offset {entry['offset']} overlaps the argument before it or is "
                       "not aligned to its size")
        end = entry["offset"] + entry["size"]
    if end > co["kernarg_size"]:
        raise fail("code_object.kernarg_size", f"{co['kernarg_size']} bytes, but the arguments "
                   f"end at {end}")
    return co
