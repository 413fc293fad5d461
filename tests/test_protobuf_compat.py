"""The generated Tile IR code imports and round-trips under the protobuf 6 and 7 runtimes
(daemon hosts run 6.x or 7.x; the GPU image has 7.36)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = (
    "import sys; sys.path.insert(0, {root!r})\n"
    "import google.protobuf as g\n"
    "from tiled.v1 import tile_ir_pb2 as pb\n"
    "p = pb.Program(schema_version=1, name='k')\n"
    "p.vars.add(id=0, name='M', dtype=pb.INT32)\n"
    "assert pb.Program.FromString(p.SerializeToString()) == p\n"
    "print(g.__version__)\n"
)


@pytest.mark.parametrize("version", ["6.31.1", "6.33.6", "7.36.2"])
def test_generated_code_imports_under_runtime(version, tmp_path_factory):
    cache = Path(tmp_path_factory.getbasetemp()) / f"protobuf-{version}"
    if not (cache / "google" / "protobuf").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(cache), f"protobuf=={version}"], check=True)
    out = subprocess.run([sys.executable, "-c", CODE.format(root=str(ROOT))],
                         env={"PYTHONPATH": str(cache), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == version
