"""Probe (issue 14, w4a16 at 16 tokens: 1.47-1.80x F.linear where the goal is 3x): the swapped
tile form (weights unpacked into a 16-bit shared tile, then wgmma SS) against the regs form
(the same values unpacked straight into wgmma's register operand, RS) and the regs_g form
(regs over whole groups, q - zero in 16-bit arithmetic, scaled after the MMA) and the regs_w
form (regs_g with K reordered so that a thread unpacks whole words, two values an
instruction), config for config:
BN x threads in (64, 128), (128, 128), (128, 256), splits 1 / 4 / 8, 16 tokens (BM 16) and
64 (BM 64), GPTQ 4-bit symmetric fp16 weights, group 128, at issue 14's three shapes; F.linear
on the dequantized fp16 weights and an in-place stream in the same rounds (graph-replayed,
rotated, medians). Each kernel is checked against the dequantized product first.

The kinds built are W4_PROBE_KINDS's (default swap,regs_g,regs_w; the results of 2026-12-05,
w4_regs_g_probe_*.json, had swap,regs,regs_g, before regs_w existed). W4_PROBE_BITS=8 builds
the int8 forms instead (int8 W [N, K], channel scales; kinds swap,regs_w by default, and 1
token beside 16 and 64, as those forms serve decode too), beside F.linear on the dequantized
weights in the same way. regs_w's split configs are built twice, the second with their sum
in the GEMM kernel (sum="last"; the form `regs_w+last` in the results' `best`). With
W4_PROBE_SR=1 (4-bit) every config is also built with its group scales through the
pipelined loop's shared tiles (SR=1, quant_tiles._GroupRows: the forms `swap+SR`, ...).
The kind regs_p (W4_PROBE_KINDS=...,regs_p) is regs_w on words repacked once into the MMA's
order (quant_words.mma_order_words, done before the timing), without X's reordering.
W4_PROBE_H=1,2,4 builds regs_w / regs_p with a group's K in that many slices too (H, the
slice after each unpacked while its MMA runs: the forms `regs_w+H2`, ...); W4_PROBE_SR=only
builds the SR=1 configs alone, and W4_PROBE_M=16 the 16-token tiles alone.
W4_PROBE_TILES=64x128,...,256x128 sets the BN x threads tiles (256 x 128 with H = 4 holds 158
registers at 16 tokens, where H = 1 spills).

Here:  python benchmarks/gpu/probes/w4_regs_probe.py build --out .gpu/w4_regs
There: python3 benchmarks/gpu/probes/w4_regs_probe.py run --bundle .gpu/w4_regs \\
           --out $OUT/w4_regs_probe.json
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))

from bundle_cli import build_command, compile_into, load_kernel, machine, main, write_results

TARGET = "cuda:sm_90a"
SHAPES = [(4096, 14336), (14336, 4096), (8192, 28672)]  # (K, N)
TOKENS = {m: m for m in map(int, os.environ.get("W4_PROBE_M", "16,64").split(","))}  # M->BM
TILES = [tuple(map(int, t.split("x"))) for t in  # BN x threads
         os.environ.get("W4_PROBE_TILES", "64x128,128x128,128x256").split(",")]
SPLITS = (1, 4, 8)
BITS = int(os.environ.get("W4_PROBE_BITS", "4"))
KINDS = tuple(os.environ.get("W4_PROBE_KINDS",
                             "swap,regs_g,regs_w" if BITS == 4 else "swap,regs_w").split(","))
DTYPE = "float16"
W4_GROUP = 128
GROUP = W4_GROUP if BITS == 4 else 0
ROUNDS, GRAPH_CALLS = 5, 20
SR = os.environ.get("W4_PROBE_SR", "0") if BITS == 4 else "0"  # "1": both, "only": SR=1
SLICES = tuple(map(int, os.environ.get("W4_PROBE_H", "1").split(",")))
RW_FLOATS = 128 << 20


def tokens(bits: int) -> dict:
    """M -> BM: the 8-bit forms also at 1 token (a 16-token tile)."""
    return {1: 16, **TOKENS} if bits == 8 else TOKENS


def configs():
    """Each kind's tiles and splits; regs_w's splits also with their sum in the kernel
    (sum="last", tiled.ops.split_k) beside the splitk_sum kernel."""
    for kind in KINDS:
        for bm in sorted(set(tokens(BITS).values())):
            for bn, t in TILES:
                for s in SPLITS:
                    c = {"kind": kind, "BM": bm, "BN": bn, "threads": t, "stages": 2,
                         "splits": s}
                    variants = [c]
                    if kind in ("regs_w", "regs_p") and s > 1:
                        variants.append({**c, "sum": "last"})
                    if kind in ("regs_w", "regs_p") and BITS == 4:
                        variants = [{**v, "H": h} if h > 1 else v
                                    for v in variants for h in SLICES]
                    for v in variants:
                        if SR != "only":
                            yield v
                        if SR in ("1", "only"):
                            yield {**v, "SR": 1}


def _form(c) -> str:
    """The form a config belongs to in the results' `best`: its kind, "+last" with sum="last",
    "+H2" / "+H4" with H slices, "+SR" with SR=1."""
    return c["kind"] + ("+last" if c.get("sum") == "last" else "") + \
        (f"+H{c['H']}" if c.get("H", 1) > 1 else "") + ("+SR" if c.get("SR") else "")


def _name(K, N, c):
    return (f"{K}x{N}_{c['kind']}_m{c['BM']}_n{c['BN']}_t{c['threads']}_s{c['splits']}"
            + ("_last" if c.get("sum") == "last" else "")
            + (f"_h{c['H']}" if c.get("H", 1) > 1 else "") + ("_sr" if c.get("SR") else ""))


def build(out: Path) -> None:
    import tiled.ops as ops
    from tiled.ops.quant import quant_linear_kernel
    from tiled.ops.split_k import sum_params

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for K, N in SHAPES:
        for c in configs():
            name = _name(K, N, c)
            layout = "mma" if c["kind"] == "regs_p" else "gptq"
            kernel = quant_linear_kernel(c["BM"], N, K, DTYPE, DTYPE, BITS, GROUP, False, layout,
                                         **c)
            _, seconds = compile_into(out, name, kernel, TARGET)
            index[name] = {"K": K, "N": N, "config": c, "cold_compile_s": round(seconds, 3)}
            print(name, round(seconds, 1), flush=True)
        for s in SPLITS[1:]:
            params = sum_params(N, s, DTYPE)
            name = f"splitk_sum__{N}x{s}"
            compile_into(out, name, ops.kernel_factory("splitk_sum", TARGET, **params), TARGET)
            index[name] = {"op": "splitk_sum", "params": params}
    (out / "index.json").write_text(json.dumps({
        "command": build_command("probes/w4_regs_probe.py", out,
                                 ("W4_PROBE_BITS", "W4_PROBE_KINDS", "W4_PROBE_SR",
                                  "W4_PROBE_H", "W4_PROBE_M", "W4_PROBE_TILES")),
        "machine": machine(), "bits": BITS,
        "target": TARGET, "kernels": index}, indent=1))


def run(bundle: Path, out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from bundle_cli import time_graphed
    from quant import _gptq

    import tiled.ops as ops
    from tiled.ops import quant

    index = json.loads((bundle / "index.json").read_text())
    forms = sorted({_form(v["config"]) for v in index["kernels"].values() if "config" in v})
    bits = index.get("bits", 4)
    for name, v in index["kernels"].items():
        if v.get("op") == "splitk_sum":
            ops.install("splitk_sum", TARGET, load_kernel(bundle, name), **v["params"])
    rows = []
    for K, N in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        if bits == 8:  # int8 W [N, K], channel scales
            q = torch.randint(-128, 128, (N, K), device="cuda", generator=g, dtype=torch.int8)
            scales = (torch.rand(N, device="cuda", generator=g) / K ** 0.5 / 64 + 1e-5).half()
            qweight = q.view(torch.int32)
            w = (q.float() * scales.float()[:, None]).half()
            wbytes = K * N + scales.numel() * 2
        else:
            q = torch.randint(0, 16, (K, N), device="cuda", generator=g)
            scales = (torch.rand(K // W4_GROUP, N, device="cuda", generator=g) / K ** 0.5
                      + 1e-3).half()
            qweight = _gptq(torch, q)
            w = ((q.float() - 8) * scales.float().repeat_interleave(W4_GROUP, 0)).t() \
                .contiguous().half()
            wbytes = K * N // 2 + scales.numel() * 2
        z = scales.new_empty(1)
        if bits == 4:
            from tiled.ops.quant_words import mma_order_words
            repacked = mma_order_words(qweight)  # regs_p's words (load time: not timed)
        for M, bm in tokens(bits).items():
            x = torch.randn(M, K, device="cuda", generator=g).half()
            ref = x.float() @ w.float().T
            calls, errs = {"F.linear_fp16": lambda x=x, w=w: F.linear(x, w)}, {}
            form_of = {}
            for name, v in index["kernels"].items():
                c = v.get("config")
                if not c or v["K"] != K or v["N"] != N or c["BM"] != bm:
                    continue
                kern = load_kernel(bundle, name)
                y = torch.zeros(M, N, device="cuda", dtype=torch.float16)

                words = repacked if c["kind"] == "regs_p" else qweight

                def call(kern=kern, c=c, args=(x, words, scales, z, y)):
                    return quant._run(kern, c, list(args))
                call()
                torch.cuda.synchronize()
                errs[name] = ((y.float() - ref).norm() / ref.norm()).item()
                calls[name] = call
                form_of[name] = _form(c)
            rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
            calls["rw_kernel"] = rw.neg_
            us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS)
            best = {f: min((n for n in us if form_of.get(n) == f), key=us.get)
                    for f in forms if f in form_of.values()}
            row = {"K": K, "N": N, "M": M, "us": us, "rel_err": errs,
                   "stream_GB/s": 2 * 4 * RW_FLOATS / (us["rw_kernel"] * 1e-6) / 1e9,
                   "best": {k: {"kernel": n, "us": us[n],
                                "vs_F_linear_fp16": us["F.linear_fp16"] / us[n],
                                "weight_GB/s": wbytes / (us[n] * 1e-6) / 1e9}
                            for k, n in best.items()}}
            rows.append(row)
            print(f"K={K} N={N} M={M}: F.linear {us['F.linear_fp16']:.1f} us; " + "; ".join(
                f"{k} {b['us']:.1f} us {b['vs_F_linear_fp16']:.2f}x ({b['kernel']})"
                for k, b in row["best"].items()), flush=True)
            del rw
            torch.cuda.empty_cache()
    write_results(out, "probes/w4_regs_probe.py", bundle, index, rounds=ROUNDS,
                  graph_calls=GRAPH_CALLS, rows=rows)


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels")


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "w4_regs"))
