"""tiled.ops' float8 ops on the H200 (issue 13's fp8 table): fp8_linear with per-tensor scales
beside torch._scaled_mm at 4096^3 and 8192^3; block-scaled (DeepSeek-V3: 1 x 128 activation
groups, 128 x 128 weight blocks) at N = 7168, K = 2048 / 18432, M = 128 .. 4096 beside
torch._scaled_mm per-tensor at the same shape (and torch's own block-scaled _scaled_mm where
this torch has one); quantize_fp8's numerics against torch and its GB/s.

Here (the CPU machine, with TVM): every config of tiled.ops.fp8's CUDA space per weight shape
(M is symbolic: one program per shape and config) and the quantize kernels
    python benchmarks/gpu/fp8.py build --out .gpu/fp8
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle's kernels)
    python3 benchmarks/gpu/fp8.py run --bundle .gpu/fp8 --out $OUT/fp8_h200.json
(FP8_PARTS=quantize or =gemm runs one part.)

Each call graph-replayed GRAPH_CALLS times; medians of ROUNDS interleaved rounds of do_bench.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, time_graphed, write_results

TARGET = "cuda:sm_90a"
PER_TENSOR = [(4096, 4096, 4096), (8192, 8192, 8192)]  # (M, N, K)
BLOCK_NK = [(7168, 2048), (7168, 18432)]
BLOCK_MS = (128, 512, 1024, 2048, 4096)
QUANT = [("quantize_fp8_groups", {"N": 128, "dtype": "bfloat16"}),
         ("fp8_absmax", {"N": 7168, "dtype": "bfloat16"}),
         ("quantize_fp8_scaled", {"N": 7168, "dtype": "bfloat16"})]
QUANT_MS = (128, 4096)
ROUNDS = 3
GRAPH_CALLS = 10


def _gemms():
    """(name, N, K, block_scaled) of every weight shape the run tunes."""
    out = [(f"pt_{n}x{k}", n, k, False) for _, n, k in PER_TENSOR]
    return out + [(f"bs_{n}x{k}", n, k, True) for n, k in BLOCK_NK]


def build(out: Path) -> None:
    import tiled.ops as ops
    from tiled import tuning
    from tiled.ops import fp8

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for shape, N, K, block_scaled in _gemms():
        for i, cfg in enumerate(fp8.CUDA_SPACE):
            name = f"{shape}__c{i}"
            options = cfg.get(tuning.OPTIONS_KEY, {})
            try:
                kernel = fp8.scaled_gemm_kernel(128, N, K, "bfloat16", block_scaled,
                                                **tuning.factory_kwargs(cfg))
            except ValueError as e:  # a config the factory refuses here (the tuner skips it)
                print(name, "not built:", e, flush=True)
                continue
            _, seconds = compile_into(out, name, kernel, TARGET, **options)
            index[name] = {"gemm": True, "N": N, "K": K, "block_scaled": block_scaled,
                           "config": cfg, "options": options,
                           "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    for op, params in QUANT:
        _, seconds = compile_into(out, op, ops.kernel_factory(op, TARGET, **params), TARGET)
        index[op] = {"op": op, "params": params, "cold_compile_s": round(seconds, 3)}
        print(op, index[op], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/fp8.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _operands(torch, M, N, K, block_scaled):
    """Quantized x and w with their scales, and the float32 product they stand for."""
    import tiled.ops as ops

    g = torch.Generator(device="cuda").manual_seed(0)
    xf = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    wf = torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
    xq, xs = ops.quantize_fp8(xf, block=128) if block_scaled else _per_tensor(torch, xf)
    if block_scaled:
        nb = -(-N // 128)
        blocks = wf.float().view(nb, 128, K // 128, 128)
        ws = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
        wq = (blocks / ws[:, None, :, None]).to(torch.float8_e4m3fn).view(N, K)
    else:
        wq, ws = _per_tensor(torch, wf)
    return xf, wf, xq, xs, wq, ws


def _per_tensor(torch, t):
    """t quantized to e4m3 with one scale, in torch (the GEMM's operands; quantize_fp8 is
    measured on its own below)."""
    s = (t.float().abs().max().clamp_min(1e-12) / 448.0).reshape(1)
    return (t.float() / s).to(torch.float8_e4m3fn), s


def _torch_blockwise(torch, xq, xs, wq, ws):
    """torch's own block-scaled _scaled_mm, where this torch has one for the H200; else None."""
    try:
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs.t().contiguous().t(),
                             scale_b=ws.t().contiguous().t(), out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        return y
    except Exception as e:  # not supported: reported, not timed
        return f"{type(e).__name__}: {str(e)[:200]}"


def _gemm_row(torch, M, N, K, block_scaled) -> dict:
    """One GEMM shape: the tuned fp8_linear's numerics and its time beside torch's."""
    import tiled.ops as ops
    from tiled.ops.fp8 import FP8_LINEAR

    one = torch.ones((), device="cuda", dtype=torch.float32)
    xf, wf, xq, xs, wq, ws = _operands(torch, M, N, K, block_scaled)
    t0 = time.perf_counter()
    y = ops.fp8_linear(xq, wq, xs, ws)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - t0
    if block_scaled:
        xd = (xq.float().view(M, -1, 128) * xs[..., None]).view(M, K)
        wd = (wq.float().view(-1, 128, K // 128, 128) *
              ws[:, None, :, None]).view(N, K)
    else:
        xd, wd = xq.float() * xs, wq.float() * ws
    ref = xd @ wd.T
    err = float((y.float() - ref).norm() / ref.norm())
    err_vs_bf16 = float((y.float() - xf.float() @ wf.float().T).norm() /
                        (xf.float() @ wf.float().T).norm())
    pxq, pxs = _per_tensor(torch, xf)
    pwq, pws = _per_tensor(torch, wf)
    calls = {"tiled": lambda: ops.fp8_linear(xq, wq, xs, ws),
             "torch._scaled_mm per-tensor": lambda: torch._scaled_mm(
                 pxq, pwq.t(), scale_a=pxs.reshape(()) * one,
                 scale_b=pws.reshape(()) * one, out_dtype=torch.bfloat16)}
    torch_block = _torch_blockwise(torch, xq, xs, wq, ws) if block_scaled else None
    if isinstance(torch_block, torch.Tensor):
        calls["torch._scaled_mm blockwise"] = lambda: _torch_blockwise(
            torch, xq, xs, wq, ws)
    us = time_graphed(torch, calls, ROUNDS, GRAPH_CALLS, rep_ms=50)
    tflops = {k: 2 * M * N * K / (v * 1e-6) / 1e12 for k, v in us.items()}

    tuned = next(v for (_, (m, n, k, _, bs)), v in FP8_LINEAR.chosen.items()
                 if bs == block_scaled and (n, k) == (N, K) and M <= m < 2 * M)
    row = {"M": M, "N": N, "K": K, "block_scaled": block_scaled,
           "config": tuned.config, "first_call_s": tune_s, "us": us,
           "TFLOP/s": tflops, "rel_err_vs_dequantized": err,
           "rel_err_vs_bf16_product": err_vs_bf16,
           "vs_scaled_mm_per_tensor": us["torch._scaled_mm per-tensor"] / us["tiled"],
           "torch_blockwise": None if torch_block is None or
           isinstance(torch_block, torch.Tensor) else torch_block,
           # every candidate's time as the tuner measured it (L2 flushed), or why it was
           # skipped: the forms of the space compared in one process
           "candidates": [{"config": c.config, "us": c.us, "skipped": c.skipped}
                          for c in tuned.candidates]}
    print(f"{'block' if block_scaled else 'tensor'} M={M} N={N} K={K}: "
          f"{tflops['tiled']:.0f} TFLOP/s, "
          f"{row['vs_scaled_mm_per_tensor']:.3f}x _scaled_mm per-tensor, "
          f"config {tuned.config}, err {err:.1e}", flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    import tiled.ops as ops
    from tiled import tuning

    index = json.loads((bundle / "index.json").read_text())
    for op, params in QUANT:
        ops.install(op, TARGET, load_kernel(bundle, op), **params)
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text(),
              v.get("options", {})) for n, v in index["kernels"].items() if v.get("gemm")]
    rows, quant = [], []
    parts = os.environ.get("FP8_PARTS", "quantize,gemm").split(",")
    for M in QUANT_MS if "quantize" in parts else ():
        x = torch.randn(M, 7168, device="cuda", dtype=torch.bfloat16) * 3
        for block in (128, None):
            q, s = ops.quantize_fp8(x, block=block)
            if block:
                g = x.float().view(M, -1, block)
                want_s = g.abs().amax(-1).clamp_min(1e-12) / 448.0
                want_q = (g / want_s[..., None]).to(torch.float8_e4m3fn).view(M, -1)
            else:
                want_s = (x.float().abs().max().clamp_min(1e-12) / 448.0).reshape(1)
                want_q = (x.float() / want_s).clamp(-448, 448).to(torch.float8_e4m3fn)
            mismatch = float((q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean())
            scale_err = float(((s - want_s).abs() / want_s).max())
            us = time_graphed(torch, {"tiled": lambda x=x, b=block: ops.quantize_fp8(x, block=b)},
                              ROUNDS, GRAPH_CALLS, rep_ms=50)
            nbytes = M * 7168 * 3 + s.numel() * 4
            quant.append({"M": M, "N": 7168, "block": block, "us": us["tiled"],
                          "GB/s": nbytes / (us["tiled"] * 1e-6) / 1e9,
                          "q_bits_differing_from_torch": mismatch,
                          "max_scale_rel_err": scale_err})
            print("quantize", quant[-1], flush=True)
    with tuning.prebuilt(pairs):
        cases = [] if "gemm" not in parts else [(m, n, k, False) for m, n, k in PER_TENSOR]
        cases += [(m, n, k, True) for n, k in BLOCK_NK for m in BLOCK_MS if "gemm" in parts]
        for M, N, K, block_scaled in cases:
            rows.append(_gemm_row(torch, M, N, K, block_scaled))
            torch.cuda.empty_cache()
    write_results(out, "fp8.py", bundle, index, rounds=ROUNDS, graph_calls=GRAPH_CALLS,
                  parts=parts, gemm=rows, quantize=quant, tuning_stats=dict(tuning.STATS))


def smoke(bundle: Path) -> None:
    print(len(json.loads((bundle / "index.json").read_text())["kernels"]), "kernels", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "fp8"))
