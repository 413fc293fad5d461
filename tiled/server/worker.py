"""What a compile worker process runs: one request in, one artifact + manifest out.

The payload and the result are small self-describing byte strings (a JSON header line, then
raw bytes), so nothing a request contains is unpickled or executed: the program travels as
Tile IR bytes and is decoded and verified here before the compiler sees it.
"""

from __future__ import annotations

import json


def encode(header: dict, body: bytes = b"") -> bytes:
    return json.dumps(header, sort_keys=True).encode() + b"\n" + body


def decode(data: bytes) -> tuple[dict, bytes]:
    head, _, body = data.partition(b"\n")
    return json.loads(head), body


def compile_job(payload: bytes) -> bytes:
    """payload: {"target", "options", "action"} + program bytes -> {"manifest", "stages"} + artifact."""
    from tiled.compiler import compile_program
    from tiled.ir.program import Program

    header, program_bytes = decode(payload)
    program = Program.from_bytes(program_bytes)
    compiled = compile_program(program, header["target"], action=header.get("action"),
                               **header["options"])
    return encode({"manifest": compiled.manifest.to_json(), "stages": compiled.stages},
                  compiled.artifact)
