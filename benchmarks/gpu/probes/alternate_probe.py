"""Probe (issue 12): two consumer warpgroups taking a one-warpgroup GEMM's program blocks in
turn (the compile option `alternate`, ws_loop.py), against the same kernel as compiled by
default (one consumer warpgroup, whose epilogue nothing overlaps: about 5% of the seed
GEMM's time, seed_epilogue_probe_h100.json). Each case is built both ways; the run checks
both against torch and times them beside torch in one process (7 rounds, rotated,
do_bench medians).

Cases (forms `default` and `alternate`; the seed's also with 5- and 6-stage rings,
`alternate_ring5` / `_ring6`): the seed's GEMM (examples/gemm.py at 128x128x32, 3 stages,
128 threads) at 4096^3 in fp16 and bf16; the same with a symbolic M at 4000, 1000 and 256
rows (walks of odd and even lengths per block, and blocks with one program block, where the
second warpgroup has none);
tiled.ops.linear's 64 x 256 tile on 128 threads (a ring that takes the SM) at 64 and 128
tokens of W 28672 x 8192, beside F.linear.

Here:  python benchmarks/gpu/probes/alternate_probe.py build --out .gpu/alternate
There: python3 benchmarks/gpu/probes/alternate_probe.py run --bundle .gpu/alternate \\
           --out $OUT/alternate_probe.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from bundle_cli import (
    compile_into,
    load_kernel,
    machine,
    main,
    rotated_medians,
    smoke_in_child,
    smoke_order,
    write_results,
)

FORMS = {"default": {}, "alternate": {"alternate": 2}}
# Forms built for the seed's cases only (`ring`: ws_plan.MIN_RING for the build, 4 by
# default): does a deeper ring help where the warpgroups hand over? (The first run of this
# probe, alternate_probe_h100.json, had the two forms above only.)
SEED_FORMS = {"alternate_ring5": {"alternate": 2, "ring": 5},
              "alternate_ring6": {"alternate": 2, "ring": 6}}
ROUNDS = 7
# name -> (kind, dtype, M rows run, N, K); "seed": examples/gemm.py, "seed_dyn": its symbolic
# M, "linear": tiled.ops.linear's 64 x 256 tile on 128 threads
CASES = {
    "seed_f16": ("seed", "float16", (4096,), 4096, 4096),
    "seed_bf16": ("seed", "bfloat16", (4096,), 4096, 4096),
    "seed_dyn_bf16": ("seed_dyn", "bfloat16", (4000, 1000, 256), 4096, 4096),
    "linear_64x256": ("linear", "bfloat16", (64, 128), 28672, 8192),
}


def _kernel(kind: str, dtype: str, N: int, K: int):
    import gemm

    import tiled.lang as T
    from tiled.ops.gemm import linear_kernel

    if kind == "seed":
        return gemm.matmul(N, N, K, 128, 128, 32, 3, dtype, threads=128)
    if kind == "seed_dyn":
        return gemm.matmul(T.dyn("M"), N, K, 128, 128, 32, 3, dtype, threads=128)
    return linear_kernel(64, N, K, dtype, dtype, kind="tile", BM=64, BN=256, threads=128)


def _forms(case: str) -> dict:
    return {**FORMS, **(SEED_FORMS if case in ("seed_f16", "seed_bf16") else {})}


def build(out: Path) -> None:
    from tiled.compiler.targets.cuda import ws_plan

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for case, (kind, dtype, _rows, N, K) in CASES.items():
        for form, options in _forms(case).items():
            name = f"{case}__{form}"
            options = dict(options)
            ws_plan.MIN_RING = options.pop("ring", 4)
            c, sec = compile_into(out, name, _kernel(kind, dtype, N, K), "cuda:sm_90a",
                                  **options)
            ws_plan.MIN_RING = 4
            index[name] = {"case": case, "form": form, "options": options,
                           "block": c.manifest.block[0],
                           "smem": c.manifest.dynamic_smem_bytes,
                           "compile_s": round(sec, 2)}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/probes/alternate_probe.py build --out {out}",
        "machine": machine(), "kernels": index}, indent=1))


def _operands(torch, case: str, M: int):
    kind, dtype, _, N, K = CASES[case]
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    if kind == "linear":  # x [M, K], W [N, K]: y = x W^T
        b = (torch.randn(N, K, device="cuda", generator=g) / 64).to(dt)
        return a, b, torch.nn.functional.linear
    b = torch.randn(K, N, device="cuda", dtype=dt, generator=g)
    return a, b, torch.matmul


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())["kernels"]
    for name in smoke_order(index):
        case = index[name]["case"]
        for M in CASES[case][2]:
            a, b, _ = _operands(torch, case, M)
            c = torch.empty(M, CASES[case][3], device="cuda", dtype=a.dtype)
            load_kernel(bundle, name)(a, b, c)
            torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    hung = smoke_in_child(__file__, bundle, 300, stall_s=20)
    built = json.loads((bundle / "index.json").read_text())
    rows = []
    for case, (_, _, row_counts, N, K) in CASES.items():
        for M in row_counts:
            a, b, ref_fn = _operands(torch, case, M)
            ref = ref_fn(a, b)
            calls, errs = {"torch": lambda a=a, b=b, f=ref_fn: f(a, b)}, {}
            for form in _forms(case):
                name = f"{case}__{form}"
                if name in hung:
                    continue
                k, c = load_kernel(bundle, name), torch.empty_like(ref)
                c.fill_(float("nan"))
                k(a, b, c)
                torch.cuda.synchronize()
                errs[form] = float((c.float() - ref.float()).norm() / ref.float().norm())
                calls[form] = (lambda fn, x, y, dst: lambda: fn(x, y, dst))(k, a, b, c)
            ms = rotated_medians(calls, ROUNDS, do_bench)
            tflops = {n: 2 * M * N * K / v / 1e9 for n, v in ms.items()}
            row = {"case": case, "M": M, "N": N, "K": K, "rel_err_vs_torch": errs,
                   "ms": ms, "tflops": tflops,
                   "vs_torch": {n: ms["torch"] / ms[n] for n in errs},
                   "blocks": {f: built["kernels"][f"{case}__{f}"]["block"]
                              for f in _forms(case)}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_results(out, "probes/alternate_probe.py", bundle, built, rows=rows, hung=hung)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "alternate"))
