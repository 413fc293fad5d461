"""Local memory in the conformance kernels on sm_90a: each kernel compiled here at its GPU
shape (the conformance table's `gpu`), and the LDL / STL instructions of each launch's SASS
counted (register arrays indexed by values the compiler cannot fold, or spills). No GPU
needed; cuobjdump on PATH or from the nvidia wheels (the dev extra installs it under
site-packages/nvidia/cu13/bin).

    python benchmarks/gpu/probes/local_memory.py [--json OUT] [name ...]
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.compiler.test_cuda_header import _find_tool  # PATH, else the nvidia wheels' bin


def local_memory(artifact: bytes, cuobjdump: str) -> dict[str, dict[str, int]]:
    """{kernel function: {"LDL": n, "STL": n}} of a cubin."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(artifact)
        text = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True,
                              capture_output=True, text=True).stdout
    out = {}
    for part in text.split("Function : ")[1:]:
        out[part.split()[0]] = {op: len(re.findall(rf"\b{op}\b", part))
                                for op in ("LDL", "STL")}
    return out


def main() -> None:
    import tiled
    from tests.conformance.cases import load_all

    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--json")
    args = ap.parse_args()
    cuobjdump = _find_tool("cuobjdump")
    if cuobjdump is None:
        sys.exit("cuobjdump not found (the dev extra installs it)")
    cases = load_all()
    rows = []
    for name in args.names or sorted(cases):
        case = cases[name]
        if case.gpu is None:
            continue
        try:
            c = tiled.compile(case.factory(**{**case.cpu, **case.gpu}).kernel,
                              target="cuda:sm_90a", cache=False)
        except Exception as e:  # a kernel that does not compile is reported, not counted
            rows.append({"kernel": name, "error": f"{type(e).__name__}: {e}"[:200]})
            print(f"{name:28s} error {rows[-1]['error']}")
            continue
        for launch in getattr(c, "kernels", [c]):
            for fn, counts in local_memory(launch.artifact, cuobjdump).items():
                rows.append({"kernel": name, "function": fn, **counts})
                print(f"{name:28s} {fn:40s} LDL {counts['LDL']:5d} STL {counts['STL']:5d}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python benchmarks/gpu/probes/local_memory.py " + " ".join(sys.argv[1:]),
            "target": "cuda:sm_90a", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
