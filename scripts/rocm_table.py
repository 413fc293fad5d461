"""The ROCm backend's table (tiled/compiler/targets/rocm/README.md): every examples/ kernel and
conformance kernel compiled for rocm:gfx942 and rocm:gfx90a, its MFMA instruction, VGPRs and
LDS bytes from the code object, and its relative error against the numpy reference when run
on the CPU under the emulation (small shapes). Nothing here runs on an AMD GPU.

    .venv/bin/python scripts/rocm_table.py [--json benchmarks/results/rocm_emulation.json]

Prints the markdown table; with --json also writes the numbers with the command, machine and
toolchain versions. Takes a few minutes (every kernel is built and emulated twice).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance.cases import load_all  # noqa: E402
from tests.conformance.test_conformance_rocm import run_emulated  # noqa: E402
from tests.emulated_examples import example_runs, rel_err  # noqa: E402
from tiled.compiler import compile_program  # noqa: E402
from tiled.compiler.toolchain import hip  # noqa: E402

ARCHS = ("gfx942", "gfx90a")


def facts(compiled, arch: str) -> dict:
    """A kernel's row; of several launches (a CompiledSequence), the largest of each."""
    kernels = getattr(compiled, "kernels", [compiled])
    cos = [k.manifest.code_object for k in kernels]
    mfma = sorted({m for k in kernels
                   for m in re.findall(r"\bv_mfma_\w+", hip.disassemble(k.artifact, arch))})
    return {"vgpr": max(co["vgpr_count"] for co in cos), "lds": max(co["lds_bytes"] for co in cos),
            "mfma": mfma, "scratch": max(co["private_segment_bytes"] for co in cos)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    rows = []
    t0 = time.time()
    for name, make, run, tol in example_runs():
        row = {"kernel": name, "tol": tol}
        for arch in ARCHS:
            k = compile_program(make(), f"rocm:{arch}")
            row[arch] = {**facts(k, arch), "error": run(k)}
        rows.append(row)
    for name, case in sorted(load_all().items()):
        row = {"kernel": f"conformance `{name}`", "tol": case.tol}
        for arch in ARCHS:
            compiled, results = run_emulated(case, arch)
            row[arch] = {**facts(compiled, arch),
                         "error": max(rel_err(o, r) for o, r in results)}
        rows.append(row)
    print("| kernel | gfx942 | gfx90a | emulated rel. error (gfx942 / gfx90a; tolerance) "
          "| VGPRs | LDS bytes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["gfx942"], r["gfx90a"]
        cell = lambda f: "compiles, " + (", ".join(f["mfma"]) if f["mfma"] else  # noqa: E731
                                         "no MFMA")
        ok = "pass" if max(a["error"], b["error"]) <= r["tol"] else "FAIL"
        print(f"| {r['kernel']} | {cell(a)} | {cell(b)} | {ok}: {a['error']:.1e} / "
              f"{b['error']:.1e} ({r['tol']:.0e}) | {a['vgpr']} / {b['vgpr']} | "
              f"{a['lds']} / {b['lds']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python scripts/rocm_table.py --json " + args.json,
            "machine": f"{platform.machine()} {platform.node()}", "seconds": time.time() - t0,
            "clang": hip.tool_version("clang"), "lld": hip.tool_version("lld"),
            "note": "compiled and CPU-emulated; no AMD GPU ran these kernels", "rows": rows},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
