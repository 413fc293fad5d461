"""Writes the Tile IR programs that the C++ client's tests send (`Program.to_bytes()`), and
programs.json beside them with each file's size and sha256 and the program's canonical digest:

- vadd.tir: examples/elementwise.py's `add` (C = A + B over a symbolic N, 1024 per block);
- rows_axpb.tir: `rows_axpb` below, Y[m, j] = X[m, j] * alpha + B[j] + k over a symbolic M and
  a static N = 64, with a float32 and an int32 scalar param.

sm90a/vadd.manifest.json and sm90a/gemm.manifest.json are not written here: they are the
manifests the daemon returned for vadd.tir and examples/gemm.py's matmul() (cuda:sm_90a) when
`clients/cpp/gpu_check.sh prepare` ran, kept as samples of real cuda manifests (TMA
descriptors, a persistent grid, 129 KiB of shared memory) for tests/cuda_fake_test.cc.

The committed files are fixed wire-format samples, not a cache of today's DSL output: tests
check that the current tiled.ir still decodes and verifies them, so regenerate them only on
purpose. Run from anywhere: .venv/bin/python clients/cpp/testdata/make_programs.py
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

import tiled  # noqa: E402
import tiled.lang as T  # noqa: E402


def rows_axpb(n: int = 64, block_m: int = 4, threads: int = 64):
    """Y = X * alpha + B (broadcast over rows) + k, for any number of rows M."""
    M = T.dyn("M")

    @tiled.kernel
    def rows_axpb(X: T.Tensor((M, n), "float32"), B: T.Tensor((n,), "float32"),
                  alpha: T.float32, k: T.int32, Y: T.Tensor((M, n), "float32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            for i, j in T.Parallel(block_m, n):
                m = bx * block_m + i
                if m < M:
                    Y[m, j] = X[m, j] * alpha + B[j] + T.cast(k, "float32")

    return rows_axpb


PROGRAMS = {
    "vadd": (lambda: elementwise.add(block=1024), "examples/elementwise.py: add(block=1024)"),
    "rows_axpb": (rows_axpb, "clients/cpp/testdata/make_programs.py: rows_axpb()"),
}


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

    sidecar = {}
    for name, (factory, source) in PROGRAMS.items():
        program = factory().ir
        relativize_locations(program.proto)
        verify(program)
        data = program.to_bytes()
        HERE.joinpath(f"{name}.tir").write_bytes(data)
        sidecar[name] = {"name": program.name, "source": source, "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest(), "digest": program.digest}
        print(f"wrote {name}.tir ({len(data)} bytes, digest {program.digest[:12]})")
    HERE.joinpath("programs.json").write_text(json.dumps(sidecar, indent=2) + "\n")


if __name__ == "__main__":
    main()
