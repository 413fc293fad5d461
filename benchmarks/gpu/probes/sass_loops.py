"""Instructions per iteration of the loops that issue wgmmas, read from cubins' SASS: for each
backward branch whose body holds a [HQI]GMMA, the body's instruction count, its wgmmas and its
FFMAs. Compares builds of the same kernels (a bundle directory before and after a header
change): no GPU needed; cuobjdump on PATH or from the nvidia wheels (the dev extra).

    python benchmarks/gpu/probes/sass_loops.py .gpu/seed_gemm/float16.cubin ...
"""

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.compiler.test_cuda_header import _find_tool  # PATH, else the nvidia wheels' bin

_INSTR = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_BACK = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def loops(cubin: str) -> list[tuple[int, int, int]]:
    """(instructions, wgmmas, FFMAs) of each loop holding a wgmma, in address order."""
    tool = _find_tool("cuobjdump")
    if tool is None:
        sys.exit("cuobjdump not found (the dev extra installs it)")
    text = subprocess.run([tool, "-sass", cubin], check=True, capture_output=True,
                          text=True).stdout
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, text.splitlines())
            if m]
    found = []
    for addr, ins in code:
        m = _BACK.search(ins)
        if m and int(m.group(1), 16) < addr:
            body = [i for a, i in code if int(m.group(1), 16) <= a <= addr]
            gmma = sum("GMMA" in i for i in body)
            if gmma:
                found.append((len(body), gmma, sum(i.startswith("FFMA") for i in body)))
    return found


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(Path(path).name, loops(path))
