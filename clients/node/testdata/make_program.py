"""Writes the Tile IR program that the Node client's tests send: examples/elementwise.py's `add`
(vadd, 1024 elements per block) as `Program.to_bytes()` in vadd.tir, and vadd.json beside it
with the file's sha256 and the program's canonical digest.

The committed file is a fixed wire-format sample, not a cache of today's DSL output: tests check
that the current tiled.ir still decodes and verifies it, so regenerate it only on purpose.

Run from anywhere: .venv/bin/python clients/node/testdata/make_program.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from google.protobuf.message import Message

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import elementwise  # noqa: E402

NAME = "vadd"


def relativize_locations(msg: Message) -> None:
    """Source locations name files relative to the repository root, so the committed bytes do
    not depend on where the generating checkout lived (locations are not in the digest)."""
    for field, value in msg.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        for child in value if field.is_repeated else (value,):
            if child.DESCRIPTOR.name == "Location" and child.file.startswith(str(ROOT) + "/"):
                child.file = child.file[len(str(ROOT)) + 1:]
            else:
                relativize_locations(child)


def main() -> None:
    from tiled.ir import verify

    program = elementwise.add(block=1024).ir
    relativize_locations(program.proto)
    verify(program)
    data = program.to_bytes()
    HERE.joinpath(f"{NAME}.tir").write_bytes(data)
    sidecar = {"name": program.name, "source": "examples/elementwise.py: add(block=1024)",
               "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
               "digest": program.digest}
    HERE.joinpath(f"{NAME}.json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"wrote {NAME}.tir ({len(data)} bytes, digest {program.digest[:12]})")


if __name__ == "__main__":
    main()
