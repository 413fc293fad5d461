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
import importlib.util
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tiled.lang as T  # noqa: E402
from tests.conformance.cases import load_all  # noqa: E402
from tests.conformance.test_conformance_rocm import run_emulated  # noqa: E402
from tiled.compiler import compile_program  # noqa: E402
from tiled.compiler.toolchain import hip  # noqa: E402

ARCHS = ("gfx942", "gfx90a")


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def example_runs():
    """(row name, kernel factory, run(compiled) -> relative error, tolerance)."""
    rng = np.random.default_rng(0)
    ew, sm, gm, fa = (example(n) for n in ("elementwise", "softmax", "gemm", "flash_attention"))

    def elementwise(k):
        a, b = rng.standard_normal((2, 3000)).astype(np.float32)
        c = np.zeros(3000, np.float32)
        k.emulate(a, b, c)
        return rel_err(c, a + b)

    def softmax(k):
        x = rng.standard_normal((7, 256)).astype(np.float32) * 4
        y = np.zeros_like(x)
        k.emulate(x, y)
        ref = np.exp(x - x.max(1, keepdims=True))
        return rel_err(y, ref / ref.sum(1, keepdims=True))

    def gemm(M, N, K, dtype):
        import ml_dtypes

        npdt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16

        def run(k):
            a = rng.standard_normal((M, K)).astype(npdt)
            b = rng.standard_normal((K, N)).astype(npdt)
            c = np.zeros((M, N), npdt)
            k.emulate(a, b, c)
            return rel_err(c, a.astype(np.float64) @ b.astype(np.float64))
        return run

    def attention(causal):
        def run(k):
            q = rng.standard_normal((1, 2, 80, 64)).astype(np.float16)
            kk, v = (rng.standard_normal((1, 1, 80, 64)).astype(np.float16) for _ in "kv")
            o = np.zeros(q.shape, np.float16)
            k.emulate(q, kk, v, o)
            return rel_err(o, fa.reference(q, kk, v, causal))
        return run

    return [
        ("examples/elementwise.py add", lambda: ew.add(), elementwise, 1e-6),
        ("examples/softmax.py softmax", lambda: sm.softmax(), softmax, 1e-5),
        ("examples/gemm.py fp16 (200 x 136 x 96)", lambda: gm.matmul(200, 136, 96),
         gemm(200, 136, 96, "float16"), 2e-3),
        ("examples/gemm.py bf16, symbolic M (100 x 72 x 96)",
         lambda: gm.matmul(T.dyn("M"), 72, 96, block_M=64, block_N=64, dtype="bfloat16"),
         gemm(100, 72, 96, "bfloat16"), 1e-2),
        ("examples/flash_attention.py (s 80, d 64, GQA)",
         lambda: fa.flash_attention(1, 2, 1, 80, 80, 64), attention(False), 2e-3),
        ("examples/flash_attention.py causal",
         lambda: fa.flash_attention(1, 2, 1, 80, 80, 64, causal=True), attention(True), 2e-3),
    ]


def facts(compiled, arch: str) -> dict:
    co = compiled.manifest.code_object
    asm = hip.disassemble(compiled.artifact, arch)
    mfma = sorted(set(re.findall(r"\bv_mfma_\w+", asm)))
    return {"vgpr": co["vgpr_count"], "lds": co["lds_bytes"], "mfma": mfma,
            "scratch": co["private_segment_bytes"]}


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
