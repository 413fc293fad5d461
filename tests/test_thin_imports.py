"""The thin side never imports TVM (import time, memory, version clashes in serving workers)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["tiled", "tiled.lang", "tiled.ir", "tiled.runtime", "tiled.ops",
                                    "tiled.tuning"])
def test_thin_module_does_not_import_tvm(module):
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tracing_a_kernel_does_not_import_tvm():
    code = ("import sys\n"
            "sys.path.insert(0, 'examples')\n"
            "import gemm, tiled.lang as T\n"
            "p = gemm.matmul(T.dyn('M'), 1024, 1024).ir\n"
            "assert p.digest and 'tvm' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
