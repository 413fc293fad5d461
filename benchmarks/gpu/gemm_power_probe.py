"""Is the 4096^3 GEMM power-limited? Times the sm_90a GEMM and cuBLAS at 4096^3 for fp16 and
bf16 on three kinds of input (normal samples, samples rounded to a few mantissa bits, zeros: the
fewer bits toggle, the less power the tensor cores draw), and samples the SM clock and the power
draw with nvidia-smi while each runs. Runs on the H200 from a hopper_gemm.py bundle:

    python3 benchmarks/gpu/gemm_power_probe.py --bundle .gpu/hopper --out $OUT/gemm_power.json
"""

import argparse
import json
import subprocess
import threading
import time
from pathlib import Path

FLOP = 2 * 4096**3  # one 4096^3 GEMM


def sampler(stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        try:
            line = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                   "--format=csv,noheader,nounits"], capture_output=True,
                                  text=True, timeout=5).stdout.strip()
            clock, power = (float(x) for x in line.split(","))
            out.append((clock, power))
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
        time.sleep(0.05)


def measure(fn, flop: int, seconds: float = 2.0) -> dict:
    """`fn` (`flop` operations) run back to back for `seconds`: its time and TFLOP/s, with
    nvidia-smi's SM clock and power averaged over the last two thirds."""
    import torch

    fn()
    torch.cuda.synchronize()
    samples: list = []
    stop = threading.Event()
    t = threading.Thread(target=sampler, args=(stop, samples))
    t.start()
    start, n = time.perf_counter(), 0
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    ev1.record()
    torch.cuda.synchronize()
    stop.set()
    t.join()
    ms = ev0.elapsed_time(ev1) / n
    tail = samples[len(samples) // 3:] or samples
    return {"ms": ms, "tflops": flop / ms / 1e9,
            "sm_clock_mhz": sum(c for c, _ in tail) / max(1, len(tail)),
            "power_w": sum(p for _, p in tail) / max(1, len(tail)), "samples": len(samples)}


def main() -> None:
    import torch
    from bundle_cli import load_kernel

    p = argparse.ArgumentParser()
    p.add_argument("--bundle", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    bundle = Path(args.bundle)
    rows = []
    for dtype in ("float16", "bfloat16"):
        name = f"ws_{dtype}_128x256"
        k = load_kernel(bundle, name)
        dt = getattr(torch, dtype)
        torch.manual_seed(0)
        base = [torch.randn(4096, 4096, device="cuda") for _ in range(2)]
        inputs = {"normal": [x.to(dt) for x in base],
                  "rounded_2bit": [(torch.round(x * 2) / 2).to(dt) for x in base],
                  "zeros": [torch.zeros(4096, 4096, device="cuda", dtype=dt)] * 2}
        for kind, (a, b) in inputs.items():
            c = torch.empty(4096, 4096, device="cuda", dtype=dt)
            row = {"dtype": dtype, "inputs": kind,
                   "cublas": measure(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), FLOP),
                   "tiled": measure(lambda a=a, b=b, c=c, k=k: k(a, b, c), FLOP)}
            row["ratio"] = row["tiled"]["tflops"] / row["cublas"]["tflops"]
            print(f"{dtype} {kind:13s} cuBLAS {row['cublas']['tflops']:6.1f} TFLOP/s "
                  f"{row['cublas']['sm_clock_mhz']:6.0f} MHz {row['cublas']['power_w']:5.0f} W | "
                  f"tiled {row['tiled']['tflops']:6.1f} {row['tiled']['sm_clock_mhz']:6.0f} MHz "
                  f"{row['tiled']['power_w']:5.0f} W | {row['ratio']:.3f}x", flush=True)
            rows.append(row)
    Path(args.out).write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/gemm_power_probe.py --bundle {bundle} --out "
                   f"{args.out}", "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
