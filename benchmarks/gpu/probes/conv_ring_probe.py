"""Probe (issue 14's conv2d): tiled.ops.conv2d's implicit-GEMM kernel at a few layers and
configs, lowered three ways and timed beside F.conv2d (cuDNN, channels_last) in one process:

- `ring`: the default: the im2col gather and the filter tile run ahead on a producer
  warpgroup (targets/cuda/ws_loop.py; cp.async vectors for the gather, TMA for the filters),
  the blocks walking the grid;
- `blocks`: the same ring, one block per program block (compile option persistent=1);
- `pipeline`: no producer (warp_specialize=False): a cp.async multi-stage pipeline of the
  program's own threads, wgmma per gemm, as every conv2d config ran before the ring took
  gathers.

Each kernel is checked against float F.conv2d, then timed (graph-replayed, 5 interleaved
rounds of do_bench medians).

Here:  python benchmarks/gpu/probes/conv_ring_probe.py build .gpu/conv_probe
There: python3 benchmarks/gpu/probes/conv_ring_probe.py run .gpu/conv_probe $OUT/conv_probe.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, time_graphed
from conv import DTYPE, LAYERS, TARGET, _problem

PROBE_LAYERS = ["rn50_conv3_3x3", "rn50_conv5_3x3", "unet_640_32", "unet_1280_16"]
CONFIGS = {"w128x128": dict(BM=128, BN=128, BC=64, threads=256, stages=4),
           "w128x256": dict(BM=128, BN=256, BC=64, threads=256, stages=3),
           "n64x128": dict(BM=64, BN=128, BC=64, threads=128, stages=3),
           "n128x64": dict(BM=128, BN=64, BC=64, threads=128, stages=3),
           # tiles sized so that a layer's output fills the SMs in whole waves: 160-wide
           # (wgmma n128 + n32), three consumer warpgroups of 64 rows
           "w128x160": dict(BM=128, BN=160, BC=64, threads=256, stages=4),
           "n64x160": dict(BM=64, BN=160, BC=64, threads=128, stages=4),
           "w192x128": dict(BM=192, BN=128, BC=64, threads=384, stages=4)}
LABELS = {"ring": {}, "blocks": {"persistent": 1}, "pipeline": {"warp_specialize": False}}


def build(out: Path) -> None:
    from tiled.ops import conv

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for layer in PROBE_LAYERS:
        _, C, H, F, R, stride, pad = LAYERS[layer]
        for cname, cfg in CONFIGS.items():
            for label, options in LABELS.items():
                name = f"{layer}__{cname}__{label}"
                k = conv.conv2d_kernel(C, H, H, F, R, R, stride, pad, 1, DTYPE, False, **cfg)
                compile_into(out, name, k, TARGET, **options)
                index[name] = {"layer": layer, "config": cfg, "label": label,
                               "options": options}
                print(name, flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/probes/conv_ring_probe.py build {out}",
        "machine": machine(), "kernels": index}, indent=1))


def _layer(torch, bundle: Path, index: dict, layer: str) -> list[dict]:
    """The rows of one layer: its kernels checked, then timed beside cuDNN."""
    import torch.nn.functional as F

    N, C, _, Fo, R, stride, pad = LAYERS[layer]
    x, w = _problem(torch, layer)
    ref = F.conv2d(x.float(), w.float(), stride=stride, padding=pad)
    P = ref.shape[2]
    xs, ws = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
    b = torch.empty(1, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(N * P * P, Fo, device="cuda", dtype=torch.bfloat16)
    calls, errs = {"cudnn": lambda: F.conv2d(x, w, stride=stride, padding=pad)}, {}
    for name, v in index["kernels"].items():
        if v["layer"] != layer:
            continue
        k = load_kernel(bundle, name)
        y.fill_(float("nan"))
        k(xs, ws, b, y)
        torch.cuda.synchronize()
        got = y.view(N, P, P, Fo).permute(0, 3, 1, 2).float()
        errs[name] = ((got - ref).norm() / ref.norm()).item()
        calls[name] = (lambda k=k: k(xs, ws, b, y))
    us = time_graphed(torch, calls, 5, 10)
    flops = 2 * N * P * P * Fo * C * R * R
    rows = []
    for name, t in us.items():
        row = {"layer": layer, "kernel": name, "us": t, "TFLOP/s": flops / t / 1e6,
               "vs_cudnn": us["cudnn"] / t, "rel_err": errs.get(name)}
        rows.append(row)
        print(f"{name:40s} {t:8.1f} us {row['TFLOP/s']:5.0f} TFLOP/s "
              f"{row['vs_cudnn']:.2f}x cuDNN err {row['rel_err']}", flush=True)
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch

    torch.backends.cudnn.benchmark = True
    index = json.loads((bundle / "index.json").read_text())
    rows = []
    for layer in PROBE_LAYERS:
        rows += _layer(torch, bundle, index, layer)
        out.write_text(json.dumps({
            "command": f"python3 benchmarks/gpu/probes/conv_ring_probe.py run {bundle} {out}",
            "build": index["command"], "device": torch.cuda.get_device_name(),
            "versions": {"torch": torch.__version__}, "rows": rows}, indent=1))


if __name__ == "__main__":
    mode, path = sys.argv[1], Path(sys.argv[2])
    build(path) if mode == "build" else run(path, Path(sys.argv[3]))
