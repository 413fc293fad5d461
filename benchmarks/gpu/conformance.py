"""The conformance suite (tests/conformance/) on the H200, for cuda:sm_90a.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/conformance.py build --out .gpu/conformance
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/conformance.py run --bundle .gpu/conformance \
        --out $OUT/conformance_h200.json

`build` compiles every case twice: at its small `cpu` shapes and at its H200 `gpu` shapes
(`CONFORMANCE_CASES=a,b` builds those cases only; `CONFORMANCE_OPTIONS='{"k": v}'` compiles
with those options).
`run`, for each case:
- runs the small kernel on CUDA tensors and checks it against the case's numpy reference, with
  the case's tolerance;
- runs the large one, checks it against the torch op a user would otherwise call where the
  case names one (its fp16 / bf16 result, so with a looser tolerance);
- times the large kernel and that op, interleaved over 3 rounds, taking medians. The H200's
  clock falls as it heats, so neither is always timed first.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    build_command,
    compile_into,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    write_results,
)

TARGET = "cuda:sm_90a"
ROUNDS = 3


def cases():
    """The conformance cases, or those named in $CONFORMANCE_CASES (a comma list)."""
    from tests.conformance.cases import load_all

    only = os.environ.get("CONFORMANCE_CASES")
    return {n: c for n, c in load_all().items() if not only or n in only.split(",")}


def options() -> dict:
    """Compile options for every kernel: $CONFORMANCE_OPTIONS, a JSON object (say
    '{"whole_kernel_paths": false}'), or none."""
    return json.loads(os.environ.get("CONFORMANCE_OPTIONS") or "{}")


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, case in sorted(cases().items()):
        entry = {"family": case.family, "idioms": list(case.idioms)}
        for size in ("small", "big"):
            shape = case.cpu if size == "small" else case.gpu
            try:
                compiled, seconds = compile_into(out, f"{name}_{size}",
                                                 case.factory(**shape).kernel, TARGET,
                                                 **options())
                entry[size] = {"cold_compile_s": round(seconds, 3),
                               "threads": compiled.manifest.block[0],
                               "warp_specialized": compiled.manifest.block[0] in (256, 384)
                               and any(a.kind == "tensor_map"
                                       for a in compiled.manifest.kernel_args)}
            except Exception as e:  # recorded: the table says which cases do not compile
                entry[size] = {"error": f"{type(e).__name__}: {e}"[:1000]}
            print(f"{name} {size}: {entry[size]}", flush=True)
        index[name] = entry
    (out / "index.json").write_text(json.dumps({
        "command": build_command("conformance.py", out,
                                 ("CONFORMANCE_CASES", "CONFORMANCE_OPTIONS")),
        "machine": machine(), "target": TARGET, "options": options(), "cases": index},
        indent=1))


# -- on the GPU machine ------------------------------------------------------------------------

def torch_dtype(torch, dt: str):
    """The torch dtype of a kernel dtype name (torch spells e4m3 `float8_e4m3fn`)."""
    return {"float8_e4m3": torch.float8_e4m3fn}.get(dt) or getattr(torch, dt)


def to_torch(torch, raw, device="cuda"):
    out = []
    for a, dt in raw:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        t = torch.from_numpy(np.ascontiguousarray(a.astype(np.float32)))
        out.append(t.to(device, dtype=torch_dtype(torch, dt)))
    return out


def as_list(x):
    return list(x) if isinstance(x, list | tuple) else [x]


def rel_err(out, ref) -> float:
    """Relative error of `out` against `ref`, compared element for element (a reference of
    another shape with as many elements, such as an NHWC image against its [N H W, C]
    flattening, is read in out's shape)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if ref.shape != out.shape and ref.size == out.size:
        ref = ref.reshape(out.shape)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def run_case(torch, bundle: Path, name: str, case, size: str):
    """(outputs, torch inputs, numpy inputs, the JitKernel) of one launch at `size`."""
    shape = case.cpu if size == "small" else case.gpu
    jk = case.factory(**shape).use(TARGET, load_kernel(bundle, f"{name}_{size}"))
    raw = case.inputs(np.random.default_rng(0), shape)
    inputs = to_torch(torch, raw)
    outs = as_list(case.call(jk, inputs, shape) if case.call else jk(*inputs))
    torch.cuda.synchronize()
    return outs, inputs, raw, jk


def check_small(torch, bundle: Path, name: str, case) -> dict:
    outs, inputs, _, _ = run_case(torch, bundle, name, case, "small")
    rounded = [t.float().cpu().numpy().astype(np.float64) if hasattr(t, "cpu") else t
               for t in inputs]
    refs = as_list(case.reference(rounded, case.cpu))
    errs = [rel_err(o.float().cpu().numpy(), r) for o, r in zip(outs, refs, strict=True)]
    return {"rel_err": errs, "ok": all(e <= max(case.tol, 1e-6) * 4 + 1e-6 for e in errs),
            "tol": case.tol}


def bench_big(torch, do_bench, bundle: Path, name: str, case) -> dict:
    outs, inputs, _, jk = run_case(torch, bundle, name, case, "big")
    row = {}
    shape = case.gpu
    kernel_call = (lambda: case.call(jk, inputs, shape)) if case.call else \
        (lambda: jk(*inputs))
    calls = {"tiled": kernel_call}
    if case.torch_op is not None:
        op = case.torch_op(torch, inputs, shape)
        ref = as_list(op())
        row["rel_err_vs_torch"] = [rel_err(o.float().cpu().numpy(), r.float().cpu().numpy())
                                   for o, r in zip(outs[:len(ref)], ref, strict=False)]
        calls["torch"] = op
    samples = {k: [] for k in calls}
    for _ in range(ROUNDS):
        for k, fn in calls.items():
            samples[k].append(do_bench(fn))
    ms = {k: statistics.median(v) for k, v in samples.items()}
    unit, amount = case.work(shape) if case.work else ("", 0)
    rate = {k: (amount / v / 1e9 if unit == "flop" else amount / v / 1e6) for k, v in ms.items()}
    row.update({"ms": ms, "unit": "TFLOP/s" if unit == "flop" else "GB/s", "rate": rate,
                "ratio": rate["tiled"] / rate["torch"] if "torch" in rate else None})
    return row


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name, case in sorted(cases().items()):
        if name not in index["cases"] or "error" in index["cases"][name]["small"]:
            continue
        run_case(torch, bundle, name, case, "small")
        print(f"smoke {name}: ran", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    smoke_in_child(__file__, bundle, 300)
    index = json.loads((bundle / "index.json").read_text())
    rows = {}
    for name, case in sorted(cases().items()):
        if name not in index["cases"]:
            continue  # a bundle built for some cases only
        built = index["cases"][name]
        row = {"family": case.family, "idioms": list(case.idioms), "build": built}
        try:
            if "error" not in built["small"]:
                row["small"] = check_small(torch, bundle, name, case)
            if "error" not in built["big"]:
                row["big"] = bench_big(torch, do_bench, bundle, name, case)
        except Exception as e:  # recorded, and the next case runs
            row["error"] = f"{type(e).__name__}: {e}"[:1000]
        rows[name] = row
        print(f"{name}: small {row.get('small')}, big {row.get('big')}"
              f"{', ' + row['error'] if 'error' in row else ''}", flush=True)
    write_results(out, "conformance.py", bundle, index, cases=rows)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "conformance"))
