"""Probe (issue 12): the tiled.ops configs that two consumer warpgroups taking blocks in turn
(the compile option `alternate`, on by default where it applies) changes, built with it off
(`off`: alternate=1) and as compiled by default (`on`), checked against torch and timed in
one process (7 rotated rounds, do_bench medians): tiled.ops.linear's 64 x 64 swap tiles with
8-stage rings (1, 2 and 4 splits; the tuner's picks at 16-64 tokens), whose GEMM kernel is
timed alone (its float32 partials summed by torch for the check), and the float8 GEMM's 64 x
256 tile on 128 threads, per-tensor and block-scaled.

Here:  python benchmarks/gpu/probes/alternate_ops_probe.py build --out .gpu/alternate_ops
There: python3 benchmarks/gpu/probes/alternate_ops_probe.py run --bundle .gpu/alternate_ops \\
           --out $OUT/alternate_ops_probe.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))

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

FORMS = {"off": {"alternate": 1}, "on": {}}
ROUNDS = 7
# name -> (kind, config, tokens M, N, K)
CASES = {
    "swap64_s1_4096": ("swap", {"splits": 1}, 64, 4096, 4096),
    "swap64_s2_4096": ("swap", {"splits": 2}, 64, 4096, 4096),
    "swap64_s4_4096": ("swap", {"splits": 4}, 16, 4096, 4096),
    "swap64_s1_14336": ("swap", {"splits": 1}, 64, 14336, 4096),
    "swap64_s2_down": ("swap", {"splits": 2}, 64, 4096, 14336),
    "fp8_tensor_64x256": ("fp8", {"block_scaled": False}, 128, 7168, 2048),
    "fp8_block_64x256": ("fp8", {"block_scaled": True}, 128, 7168, 2048),
    "fp8_block_64x256_m512": ("fp8", {"block_scaled": True}, 512, 7168, 2048),
}


def _kernel(case: str):
    from tiled.ops.fp8 import scaled_gemm_kernel
    from tiled.ops.gemm import linear_kernel

    kind, cfg, M, N, K = CASES[case]
    if kind == "swap":
        return linear_kernel(M, N, K, "bfloat16", "bfloat16", kind="swap", BM=64, BN=64,
                             threads=128, splits=cfg["splits"], stages=8)
    return scaled_gemm_kernel(M, N, K, "bfloat16", cfg["block_scaled"], BM=64, BN=256,
                              threads=128, stages=4)


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for case in CASES:
        for form, options in FORMS.items():
            name = f"{case}__{form}"
            c, sec = compile_into(out, name, _kernel(case), "cuda:sm_90a", **options)
            index[name] = {"case": case, "form": form, "block": c.manifest.block[0],
                           "smem": c.manifest.dynamic_smem_bytes, "compile_s": round(sec, 2)}
            print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/probes/alternate_ops_probe.py build --out {out}",
        "machine": machine(), "kernels": index}, indent=1))


def _problem(torch, case: str):
    """(kernel args less the output, the output, a function of the output that should equal
    the reference, the reference)."""
    kind, cfg, M, N, K = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "swap":
        x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda", generator=g) / 64).to(torch.bfloat16)
        s = cfg["splits"]
        y = torch.empty((s, M, N) if s > 1 else (M, N), device="cuda",
                        dtype=torch.float32 if s > 1 else torch.bfloat16)
        return [x, w], y, (lambda o: o.sum(0) if s > 1 else o), \
            torch.nn.functional.linear(x, w).float()
    a = (torch.randn(M, K, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
    if cfg["block_scaled"]:
        sa = torch.rand(M, K // 128, device="cuda", generator=g) + 0.5
        sb = torch.rand(N // 128, K // 128, device="cuda", generator=g) + 0.5
        af = a.float() * sa.repeat_interleave(128, dim=1)
        bf = b.float() * sb.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    else:
        sa = torch.tensor([0.5], device="cuda")
        sb = torch.tensor([2.0], device="cuda")
        af, bf = a.float() * 0.5, b.float() * 2.0
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    return [a, b, sa, sb], y, (lambda o: o), af @ bf.T


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())["kernels"]
    for name in smoke_order(index):
        args, y, _, _ = _problem(torch, index[name]["case"])
        load_kernel(bundle, name)(*args, y)
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    hung = smoke_in_child(__file__, bundle, 300, stall_s=20)
    built = json.loads((bundle / "index.json").read_text())
    rows = []
    for case in CASES:
        args, y0, finish, ref = _problem(torch, case)
        calls, errs = {}, {}
        for form in FORMS:
            name = f"{case}__{form}"
            if name in hung:
                continue
            k, y = load_kernel(bundle, name), torch.empty_like(y0)
            y.fill_(float("nan"))
            k(*args, y)
            torch.cuda.synchronize()
            got = finish(y).float()
            errs[form] = float((got - ref).norm() / ref.norm())
            calls[form] = (lambda fn, xs, dst: lambda: fn(*xs, dst))(k, args, y)
        ms = rotated_medians(calls, ROUNDS, do_bench)
        row = {"case": case, "config": CASES[case][1], "M": CASES[case][2],
               "N": CASES[case][3], "K": CASES[case][4], "rel_err_vs_torch": errs,
               "us": {f: v * 1e3 for f, v in ms.items()},
               "on_vs_off": ms["off"] / ms["on"] if len(ms) == 2 else None,
               "blocks": {f: built["kernels"][f"{case}__{f}"]["block"] for f in FORMS}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_results(out, "probes/alternate_ops_probe.py", bundle, built, rows=rows, hung=hung)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "alternate_ops"))
