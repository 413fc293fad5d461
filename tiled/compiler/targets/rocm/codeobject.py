"""Reads an AMDGPU code object (HSACO): the ELF header (machine, gfx id, xnack / sramecc
settings, code object version), the AMDHSA metadata note (msgpack: per kernel its kernarg
layout, LDS bytes, register counts, wavefront size, workgroup limit) and the sections. Pure
Python, no LLVM tools: the backend checks every artifact with it, and so can anything holding
the bytes. Raises ValueError naming what is malformed.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32
# EI_ABIVERSION of an HSA code object -> its code object version.
CODE_OBJECT_VERSIONS = {2: 4, 3: 5, 4: 6}
# EF_AMDGPU_MACH (e_flags bits 0-7) of the archs tiled compiles for.
MACH = {0x3F: "gfx90a", 0x4C: "gfx942"}
_SETTING = {0: "unsupported", 1: "any", 2: "off", 3: "on"}  # xnack / sramecc bit pairs


@dataclass(frozen=True)
class CodeObject:
    """What tiled checks of a code object. `kernels`: the metadata's kernel records (dicts
    with the note's keys, e.g. ".name", ".kernarg_segment_size", ".args", ".vgpr_count")."""

    machine: int
    arch: str
    code_object_version: int
    xnack: str
    sramecc: str
    target: str  # the metadata's amdhsa.target, e.g. "amdgcn-amd-amdhsa--gfx942"
    kernels: tuple[dict, ...]
    sections: dict[str, bytes]

    def kernel(self, name: str) -> dict:
        for k in self.kernels:
            if k.get(".name") == name:
                return k
        raise ValueError(f"the code object has no kernel {name!r} (it has "
                         f"{', '.join(str(k.get('.name')) for k in self.kernels)})")

    def section_text(self, name: str) -> str:
        """A section compressed with zlib (the kernel's source), as text."""
        if name not in self.sections:
            raise ValueError(f"the code object has no section {name}")
        return zlib.decompress(self.sections[name]).decode()


def read_code_object(data: bytes) -> CodeObject:
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    if data[7] != ELFOSABI_AMDGPU_HSA:
        raise ValueError(f"ELF OS/ABI {data[7]} is not AMDGPU HSA ({ELFOSABI_AMDGPU_HSA})")
    version = CODE_OBJECT_VERSIONS.get(data[8])
    if version is None:
        raise ValueError(f"unknown AMDGPU HSA ABI version {data[8]}")
    (machine,) = struct.unpack_from("<H", data, 18)
    (flags,) = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    sections = {}
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]
    names = headers[shstrndx] if shstrndx < shnum else None
    notes = []
    for h in headers:
        name_off, kind, _, _, offset, size = h[:6]
        blob = data[offset:offset + size] if kind != 8 else b""  # SHT_NOBITS: no bytes
        name = _cstr(data, names[4] + name_off) if names else ""
        sections[name] = blob
        if kind == 7:  # SHT_NOTE
            notes.append(blob)
    meta = None
    for blob in notes:
        for owner, ntype, desc in _notes(blob):
            if owner == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                meta = unpack_msgpack(desc)
    if not isinstance(meta, dict):
        raise ValueError("no AMDGPU metadata note (NT_AMDGPU_METADATA)")
    return CodeObject(machine=machine, arch=MACH.get(flags & 0xFF, f"mach{flags & 0xFF:#x}"),
                      code_object_version=version, xnack=_SETTING[(flags >> 8) & 3],
                      sramecc=_SETTING[(flags >> 10) & 3],
                      target=str(meta.get("amdhsa.target", "")),
                      kernels=tuple(meta.get("amdhsa.kernels", ())), sections=sections)


def _cstr(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode()


def _notes(blob: bytes):
    at = 0
    while at + 12 <= len(blob):
        namesz, descsz, ntype = struct.unpack_from("<III", blob, at)
        at += 12
        owner = blob[at:at + namesz].rstrip(b"\0")
        at += (namesz + 3) & ~3
        desc = blob[at:at + descsz]
        at += (descsz + 3) & ~3
        yield owner, ntype, desc


def unpack_msgpack(data: bytes):
    """The value a msgpack document encodes (the subset AMDGPU metadata uses, and the rest
    of the format's scalar, string, array and map types)."""
    value, at = _unpack(data, 0)
    if at != len(data):
        raise ValueError(f"msgpack: {len(data) - at} bytes after the value")
    return value


_FIXED = {0xCC: "<B", 0xCD: "<H", 0xCE: "<I", 0xCF: "<Q", 0xD0: "<b", 0xD1: "<h", 0xD2: "<i",
          0xD3: "<q", 0xCA: "<f", 0xCB: "<d"}


def _unpack(d: bytes, at: int):
    if at >= len(d):
        raise ValueError("msgpack: truncated")
    b = d[at]
    at += 1
    if b <= 0x7F:
        return b, at
    if b >= 0xE0:
        return b - 0x100, at
    if 0x80 <= b <= 0x8F:
        return _map(d, at, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _array(d, at, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return d[at:at + n].decode(), at + n
    if b in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[b], at
    if b in _FIXED:
        fmt = _FIXED[b]
        fmt_be = ">" + fmt[1:]  # msgpack is big-endian
        return struct.unpack_from(fmt_be, d, at)[0], at + struct.calcsize(fmt_be)
    if b in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        size = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[b]
        n = int.from_bytes(d[at:at + size], "big")
        at += size
        raw = d[at:at + n]
        return (raw.decode() if b >= 0xD9 else raw), at + n
    if b in (0xDC, 0xDD):
        size = 2 if b == 0xDC else 4
        return _array(d, at + size, int.from_bytes(d[at:at + size], "big"))
    if b in (0xDE, 0xDF):
        size = 2 if b == 0xDE else 4
        return _map(d, at + size, int.from_bytes(d[at:at + size], "big"))
    raise ValueError(f"msgpack: unsupported type byte {b:#x}")


def _array(d: bytes, at: int, n: int):
    out = []
    for _ in range(n):
        v, at = _unpack(d, at)
        out.append(v)
    return out, at


def _map(d: bytes, at: int, n: int):
    out = {}
    for _ in range(n):
        k, at = _unpack(d, at)
        v, at = _unpack(d, at)
        out[k] = v
    return out, at
