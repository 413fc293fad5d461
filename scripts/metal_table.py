"""The Metal backend's table (tiled/compiler/targets/metal/README.md): every examples/ kernel
and conformance kernel compiled for metal (apple7) and metal:apple9, how its T.gemm runs
(simdgroup matrices or the SIMT gemm), its threadgroup bytes, and its relative error against
the numpy reference when run on the CPU under the emulation (small shapes). Nothing here runs
on an Apple GPU.

    .venv/bin/python scripts/metal_table.py [--json benchmarks/results/metal_emulation.json]

Prints the markdown table; with --json also writes the numbers with the command, machine and
clang version. Takes a few minutes (every kernel is built and emulated twice).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance.cases import load_all  # noqa: E402
from tests.conformance.test_conformance_metal import (  # noqa: E402
    METAL_SHAPES,
    NO_FLOAT8,
    metal_shape,
    run_emulated,
)
from tests.emulated_examples import example_runs, rel_err  # noqa: E402
from tiled.compiler import compile_program  # noqa: E402
from tiled.compiler.toolchain import hip  # noqa: E402
from tiled.errors import CompileError  # noqa: E402

ARCHS = ("apple7", "apple9")


def facts(compiled) -> dict:
    kernel = compiled.source[compiled.source.index("// ---- the kernel ----"):]
    gemm = "simdgroup matrices, resident" if "tiled::gemm_simdgroup_acc<" in kernel else \
        "simdgroup matrices" if "tiled::gemm_simdgroup<" in kernel else \
        "SIMT" if "tiled::gemm_simt<" in kernel else "no gemm"
    manifests = getattr(compiled, "manifests", [compiled.manifest])  # one per launch
    return {"gemm": gemm,
            "threadgroup_bytes": max(m.metal["threadgroup_bytes"] for m in manifests)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    rows = []
    t0 = time.time()
    # (threadgroup memory: 32 KiB, so smaller tiles than the examples' own)
    runs = example_runs(gemm_tiles={"block_M": 64, "block_N": 64, "block_K": 32},
                        attention_tiles={"block_M": 32, "block_N": 32})
    for name, make, run, tol in runs:
        row = {"kernel": name, "tol": tol}
        for arch in ARCHS:
            k = compile_program(make(), f"metal:{arch}")
            row[arch] = {**facts(k), "error": run(k)}
        rows.append(row)
    cases = load_all()
    for name in sorted(cases):
        shape = "" if name not in METAL_SHAPES else " (" + ", ".join(
            f"{k} {v}" for k, v in METAL_SHAPES[name].items()) + ")"
        row = {"kernel": f"conformance `{name}`{shape}", "tol": cases[name].tol,
               "shape": metal_shape(name)}
        for arch in ARCHS:
            if name in NO_FLOAT8:
                try:
                    compile_program(cases[name].factory(**cases[name].cpu).kernel,
                                    f"metal:{arch}")
                    row[arch] = {"refused": None}
                except CompileError as e:
                    row[arch] = {"refused": str(e).split(": ", 1)[-1]}
                continue
            compiled, results = run_emulated(name, arch)
            row[arch] = {**facts(compiled), "error": max(rel_err(o, r) for o, r in results)}
        rows.append(row)
    print("| kernel | T.gemm (apple7 / apple9) | emulated rel. error (apple7 / apple9; "
          "tolerance) | threadgroup bytes |")
    print("|---|---|---|---|")
    for r in rows:
        a, b = r["apple7"], r["apple9"]
        if "refused" in a:
            print(f"| {r['kernel']} | refused: float8 (Apple GPUs have no float8 type) | — "
                  f"| — |")
            continue
        ok = "pass" if max(a["error"], b["error"]) <= r["tol"] else "FAIL"
        gemm = a["gemm"] if a["gemm"] == b["gemm"] else f"{a['gemm']} / {b['gemm']}"
        tg = a["threadgroup_bytes"] if a["threadgroup_bytes"] == b["threadgroup_bytes"] else \
            f"{a['threadgroup_bytes']} / {b['threadgroup_bytes']}"
        print(f"| {r['kernel']} | {gemm} | {ok}: {a['error']:.1e} / {b['error']:.1e} "
              f"({r['tol']:.0e}) | {tg} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python scripts/metal_table.py --json " + args.json,
            "machine": f"{platform.machine()} {platform.node()}", "seconds": time.time() - t0,
            "clang": hip.tool_version("clang"),
            "note": "compiled, type-checked and CPU-emulated; no Apple GPU ran these kernels",
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
