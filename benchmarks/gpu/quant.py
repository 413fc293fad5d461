"""tiled.ops.linear_w4a16 on the H200 (issue 14's quantized GEMV table): GPTQ 4-bit weights
(symmetric, group 128) at batch 1, 16, 64 for (K, N) = 4096 x 14336, 14336 x 4096 and
8192 x 28672, fp16, beside F.linear on the dequantized fp16 weights (cuBLAS) in the same
process; weight GB/s beside an in-place 512 MiB stream. With QUANT_BITS=8 (build and run),
tiled.ops.linear_w8a16 instead: int8 weights [N, K] with per-channel scales, same shapes.

Here (the CPU machine, with TVM): every config of tiled.ops.quant's CUDA space per shape, and
the splitk_sum kernels its split configs add their partials with
    python benchmarks/gpu/quant.py build --out .gpu/quant
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle)
    python3 benchmarks/gpu/quant.py run --bundle .gpu/quant --out $OUT/quant_h200.json

With QUANT_SR=1 (4-bit) at build, the bundle also holds the SR=1 twins of the space's tile
forms that are not in it (quant.sr_twins: group scales through shared tiles) and the run adds
them to the space before tuning. (quant_rs_h100.json's bundle was built, at 3561197, before
regs_w and SR regs_g joined the space, with the flags that then added them.)

With QUANT_LAYOUT=mma (4-bit, build and run): linear_w4a16(..., layout="mma") on words from
tiled.ops.repack_w4a16 (repacked before the timing, as a server does at load), tuned over
quant.MMA_CUDA_SPACE (lanes with X's indices permuted, regs_p whole and in H slices).

Each call graph-replayed GRAPH_CALLS times; medians of ROUNDS interleaved rounds of do_bench.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    build_command,
    compile_into,
    compile_sums,
    install_sums,
    machine,
    main,
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
SHAPES = [(4096, 14336), (14336, 4096), (8192, 28672)]  # (K, N)
MS = (1, 16, 64)
DTYPE, GROUP = "float16", 128
BITS = int(os.environ.get("QUANT_BITS", "4"))  # 4: linear_w4a16, 8: linear_w8a16
ROUNDS = 3
GRAPH_CALLS = 20
RW_FLOATS = 128 << 20


SR = os.environ.get("QUANT_SR") == "1" and BITS == 4
LAYOUT = os.environ.get("QUANT_LAYOUT", "gptq") if BITS == 4 else "gptq"


def _space() -> list:
    from tiled.ops import quant

    if LAYOUT == "mma":
        return quant.MMA_CUDA_SPACE
    return quant.CUDA_SPACE + (quant.sr_twins(quant.CUDA_SPACE) if SR else [])


def _sums() -> set[tuple[int, int]]:
    """(N, splits) of each splitk_sum kernel the split configs add their partials with."""
    splits = {c.get("splits", 1) for c in _space()} - {1}
    return {(n, s) for _, n in SHAPES for s in splits}


def build(out: Path) -> None:
    from tiled.ops import quant

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for K, N in SHAPES:
        for i, cfg in enumerate(_space()):
            if not any(quant._fits(cfg, m, BITS) for m in MS):
                continue  # a token tile no row of this run tunes
            name = f"w{BITS}_{K}x{N}__c{i}"
            try:
                kernel = quant.quant_linear_kernel(cfg["BM"], N, K, DTYPE, DTYPE, BITS,
                                                   GROUP if BITS == 4 else 0, False, LAYOUT,
                                                   **cfg)
            except ValueError as e:  # a config this shape does not take (the tuner skips it)
                print(name, "skipped:", e, flush=True)
                continue
            _, seconds = compile_into(out, name, kernel, TARGET)
            index[name] = {"K": K, "N": N, "config": cfg, "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    index.update(compile_sums(out, _sums(), DTYPE, TARGET))
    (out / "index.json").write_text(json.dumps({
        "command": build_command("quant.py", out, ("QUANT_BITS", "QUANT_SR", "QUANT_LAYOUT")),
        "machine": machine(), "bits": BITS, "sr": SR, "layout": LAYOUT,
        "target": TARGET, "kernels": index}, indent=1))


def _gptq(torch, q):
    """int32 [K / 8, N] words of 4-bit q [K, N] (0..15), the lowest nibble first."""
    words = torch.zeros(q.shape[0] // 8, q.shape[1], device=q.device, dtype=torch.int64)
    for i in range(8):
        words |= q[i::8].to(torch.int64) << (4 * i)
    return (words - ((words >> 31) << 32)).to(torch.int32)


def _w4_problem(torch, K, N, g, layout="gptq"):
    """GPTQ 4-bit weights: (the op on tokens x, W dequantized [N, K] fp16, weight bytes);
    layout "mma": the words repacked first (not timed)."""
    import tiled.ops as ops

    q = torch.randint(0, 16, (K, N), device="cuda", generator=g)
    scales = (torch.rand(K // GROUP, N, device="cuda", generator=g) / K ** 0.5 + 1e-3).half()
    qweight = _gptq(torch, q)
    if layout == "mma":
        qweight = ops.repack_w4a16(qweight)
    w = ((q.float() - 8) * scales.float().repeat_interleave(GROUP, 0)).t().contiguous().half()
    return (lambda x: ops.linear_w4a16(x, qweight, scales, group_size=GROUP, layout=layout)), \
        w, K * N // 2 + scales.numel() * 2


def _w8_problem(torch, K, N, g):
    """int8 weights [N, K] with per-channel fp16 scales, as _w4_problem."""
    import tiled.ops as ops

    q = torch.randint(-128, 128, (N, K), device="cuda", generator=g).to(torch.int8)
    scales = (torch.rand(N, device="cuda", generator=g) / K ** 0.5 / 64 + 1e-4).half()
    w = (q.float() * scales.float()[:, None]).half()
    return (lambda x: ops.linear_w8a16(x, q, scales)), w, K * N + N * 2


def _row(torch, K, N, M, bits: int, layout: str = "gptq") -> dict:
    import torch.nn.functional as F

    from tiled.ops import quant

    g = torch.Generator(device="cuda").manual_seed(0)
    op, w, wbytes = _w8_problem(torch, K, N, g) if bits == 8 else \
        _w4_problem(torch, K, N, g, layout)
    x = torch.randn(M, K, device="cuda", generator=g).half()
    y = op(x)  # tunes this bucket
    ref = x.float() @ w.float().T
    err = ((y.float() - ref).norm() / ref.norm()).item()
    group = GROUP if bits == 4 else 0
    tuner = quant.QUANT_LINEAR_MMA if layout == "mma" else quant.QUANT_LINEAR
    tuned = tuner.chosen[(TARGET, quant._bucket(M, N, K, DTYPE, DTYPE, bits, group, False,
                                                layout))]
    rw = torch.empty(RW_FLOATS, device="cuda", dtype=torch.float32)
    us = time_graphed(torch, {"tiled": lambda: op(x), "F.linear_fp16": lambda: F.linear(x, w),
                              "rw_kernel": rw.neg_}, ROUNDS, GRAPH_CALLS)
    row = {"K": K, "N": N, "M": M, "config": tuned.config, "us": us,
           "vs_F_linear_fp16": us["F.linear_fp16"] / us["tiled"],
           "weight_GB/s": wbytes / (us["tiled"] * 1e-6) / 1e9,
           "stream_GB/s": 2 * 4 * RW_FLOATS / (us["rw_kernel"] * 1e-6) / 1e9,
           "rel_err_vs_dequantized": err}
    print(f"w{bits}a16 K={K:5d} N={N:5d} M={M:3d}: {us['tiled']:7.1f} us, "
          f"{row['vs_F_linear_fp16']:.2f}x F.linear fp16, {row['weight_GB/s']:.0f} GB/s of "
          f"weights, config {tuned.config}, err {err:.1e}", flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    from tiled import tuning
    from tiled.ops import quant

    index = json.loads((bundle / "index.json").read_text())
    if index.get("sr"):  # the bundle's extra configs join the op's space (this process)
        quant.CUDA_SPACE.extend(quant.sr_twins(quant.CUDA_SPACE))
    install_sums(bundle, index, TARGET)
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
             for n, v in index["kernels"].items() if "op" not in v]
    rows = []
    with tuning.prebuilt(pairs):
        for K, N in SHAPES:
            for M in MS:
                rows.append(_row(torch, K, N, M, index.get("bits", 4),
                                 index.get("layout", "gptq")))
                torch.cuda.empty_cache()
    write_results(out, "quant.py", bundle, index, rounds=ROUNDS, graph_calls=GRAPH_CALLS,
                  rows=rows, tuning_stats=dict(tuning.STATS))


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels")


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "quant"))
