"""tiled.ops.conv2d on the H200 (issue 14's convolution table): ResNet-50 layers (batch 32,
224-pixel images) and SD-UNet-like layers (batch 4, 64x64 latents), bf16, channels_last,
beside F.conv2d (cuDNN, torch.backends.cudnn.benchmark on) on the same channels_last
tensors in the same process. The 1x1 stride-1 layers run as tiled.ops.linear (as
tiled.ops.conv2d runs them); the bundle holds linear's whole-tile kernels for them.

Here (the CPU machine, with TVM): every config of tiled.ops.conv's CUDA space per layer (of
linear's for the 1x1 layers)
    python benchmarks/gpu/conv.py build --out .gpu/conv
There (device tool, carry=[".gpu"]; tiled.tuning.prebuilt hands the tuner the bundle)
    python3 benchmarks/gpu/conv.py run --bundle .gpu/conv --out $OUT/conv_h200.json

Each call graph-replayed GRAPH_CALLS times; medians of ROUNDS interleaved rounds of do_bench.
TFLOP/s counts 2 * N * P * Q * F * C * R * S.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import (
    compile_into,
    compile_sums,
    install_sums,
    load_kernel,
    machine,
    main,
    smoke_in_child,
    smoke_order,
    time_graphed,
    write_results,
)

TARGET = "cuda:sm_90a"
DTYPE = "bfloat16"
# name -> (batch, C, H (= W), F, R (= S), stride, pad)
LAYERS = {
    "rn50_conv2_3x3": (32, 64, 56, 64, 3, 1, 1),
    "rn50_conv2_1x1_up": (32, 64, 56, 256, 1, 1, 0),
    "rn50_conv2_1x1_down": (32, 256, 56, 64, 1, 1, 0),
    "rn50_conv3_3x3_s2": (32, 128, 56, 128, 3, 2, 1),
    "rn50_conv3_3x3": (32, 128, 28, 128, 3, 1, 1),
    "rn50_conv4_3x3": (32, 256, 14, 256, 3, 1, 1),
    "rn50_conv4_1x1_down": (32, 1024, 14, 256, 1, 1, 0),
    "rn50_conv5_3x3": (32, 512, 7, 512, 3, 1, 1),
    "unet_320_64": (4, 320, 64, 320, 3, 1, 1),
    "unet_640_32": (4, 640, 32, 640, 3, 1, 1),
    "unet_1280_16": (4, 1280, 16, 1280, 3, 1, 1),
    "unet_1280_8": (4, 1280, 8, 1280, 3, 1, 1),
}
ROUNDS = 3
GRAPH_CALLS = 10


def _kernel(layer: str, cfg: dict):
    from tiled.ops import conv

    _, C, H, F, R, stride, pad = LAYERS[layer]
    return conv.conv2d_kernel(C, H, H, F, R, R, stride, pad, 1, DTYPE, False, **cfg)


def _as_linear(layer: str) -> bool:
    """Whether tiled.ops.conv2d runs the layer as tiled.ops.linear (1x1, stride 1, pad 0)."""
    _, _, _, _, R, stride, pad = LAYERS[layer]
    return R == 1 and stride == 1 and pad == 0


def build(out: Path) -> None:
    from tiled.ops import conv, gemm

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for layer in LAYERS:
        if _as_linear(layer):  # linear's whole-tile configs (the pixel count is large)
            _, C, _, Fo, _, _, _ = LAYERS[layer]
            for i, cfg in enumerate(gemm.CUDA_SPACE):
                if cfg["kind"] != "tile" or cfg.get("splits", 1) != 1:
                    continue
                name = f"{layer}__linear{i}"
                _, seconds = compile_into(out, name, gemm.linear_kernel(
                    8192, Fo, C, DTYPE, DTYPE, **cfg), TARGET)
                index[name] = {"layer": layer, "linear": True, "config": cfg,
                               "cold_compile_s": round(seconds, 3)}
                print(name, index[name], flush=True)
            continue
        for i, cfg in enumerate(conv.CUDA_SPACE):
            name = f"{layer}__c{i}"
            _, seconds = compile_into(out, name, _kernel(layer, cfg), TARGET)
            index[name] = {"layer": layer, "config": cfg, "cold_compile_s": round(seconds, 3)}
            print(name, index[name], flush=True)
    # The split configs' partials are added up by splitk_sum (split_k.run_split_k): one per
    # filter count and split count, installed into tiled.ops by `run`.
    index.update(compile_sums(out, {(LAYERS[layer][3], cfg["splits"]) for layer in LAYERS
                                     if not _as_linear(layer) for cfg in conv.CUDA_SPACE
                                     if cfg.get("splits", 1) > 1}, DTYPE, TARGET))
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/conv.py build --out {out}", "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _problem(torch, layer: str, batch: int | None = None):
    N, C, H, F, R, _, _ = LAYERS[layer]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch or N, C, H, H, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(F, C, R, R, device="cuda", generator=g, dtype=torch.bfloat16) / \
        (C * R * R) ** 0.5
    return x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)


def _row(torch, layer: str) -> dict:
    import torch.nn.functional as F

    import tiled.ops as ops
    from tiled.ops import conv

    N, C, H, Fo, R, stride, pad = LAYERS[layer]
    x, w = _problem(torch, layer)
    y = ops.conv2d(x, w, stride=stride, padding=pad)  # tunes this layer
    if _as_linear(layer):
        from tiled.ops import gemm

        tuned = gemm.LINEAR.chosen[(TARGET, gemm.token_bucket(N * H * H, Fo, C, DTYPE,
                                                              DTYPE))]
    else:
        tuned = conv.CONV2D.chosen[(TARGET, conv._bucket(C, H, H, Fo, R, R, stride, pad, 1,
                                                         DTYPE, False, N))]
    ref = F.conv2d(x.float(), w.float(), stride=stride, padding=pad)
    err = ((y.float() - ref).norm() / ref.norm()).item()
    us = time_graphed(torch, {
        "tiled": lambda: ops.conv2d(x, w, stride=stride, padding=pad),
        "F.conv2d_cudnn": lambda: F.conv2d(x, w, stride=stride, padding=pad)}, ROUNDS,
        GRAPH_CALLS)
    P = y.shape[2]
    flops = 2 * N * P * P * Fo * C * R * R
    row = {"layer": layer, "batch": N, "C": C, "H": H, "F": Fo, "R": R, "stride": stride,
           "pad": pad, "config": tuned.config, "us": us,
           "TFLOP/s": flops / (us["tiled"] * 1e-6) / 1e12,
           "cudnn_TFLOP/s": flops / (us["F.conv2d_cudnn"] * 1e-6) / 1e12,
           "vs_cudnn": us["F.conv2d_cudnn"] / us["tiled"], "rel_err_vs_float": err,
           "candidates_us": {json.dumps(c.config): c.us for c in tuned.candidates}}
    print(f"{layer:22s}: {us['tiled']:8.1f} us, {row['TFLOP/s']:4.0f} TFLOP/s, "
          f"{row['vs_cudnn']:.2f}x cuDNN ({row['cudnn_TFLOP/s']:.0f} TFLOP/s), config "
          f"{tuned.config}, err {err:.1e}", flush=True)
    return row


def run(bundle: Path, out: Path) -> None:
    import torch

    from tiled import tuning

    torch.backends.cudnn.benchmark = True  # cuDNN picks its fastest algorithm per shape
    hung = smoke_in_child(__file__, bundle, 240, stall_s=30)
    index = json.loads((bundle / "index.json").read_text())
    install_sums(bundle, index, TARGET)
    pairs = [((bundle / f"{n}.cubin").read_bytes(), (bundle / f"{n}.manifest.json").read_text())
             for n, v in index["kernels"].items() if n not in hung and "op" not in v]
    rows = []
    with tuning.prebuilt(pairs):
        for layer in LAYERS:
            rows.append(_row(torch, layer))
            torch.cuda.empty_cache()
            write_results(out, "conv.py", bundle, index, rounds=ROUNDS,
                          graph_calls=GRAPH_CALLS, hung=hung, rows=rows,
                          tuning_stats=dict(tuning.STATS))


def smoke(bundle: Path) -> None:
    """Each kernel once on a batch of 2, against float F.conv2d."""
    import torch
    import torch.nn.functional as F

    index = json.loads((bundle / "index.json").read_text())
    for name in smoke_order([n for n, v in index["kernels"].items() if "op" not in v]):
        layer = index["kernels"][name]["layer"]
        splits = index["kernels"][name]["config"].get("splits", 1)
        _, C, _, Fo, _, stride, pad = LAYERS[layer]
        x, w = _problem(torch, layer, batch=2)
        ref = F.conv2d(x.float(), w.float(), stride=stride, padding=pad)
        P = ref.shape[2]
        y = torch.full((2, P, P, Fo), float("nan"), device="cuda", dtype=torch.bfloat16)
        xs, ws = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
        if index["kernels"][name].get("linear"):
            load_kernel(bundle, name)(xs.view(-1, C), ws.view(Fo, C), y.view(-1, Fo))
        else:  # a split config's partials, summed here (the bundle's sum kernel is timed)
            out = y.view(-1, Fo) if splits == 1 else torch.full(
                (splits, 2 * P * P, Fo), float("nan"), device="cuda")
            load_kernel(bundle, name)(xs, ws, torch.empty(1, device="cuda",
                                                          dtype=torch.bfloat16), out)
            if splits > 1:
                y.view(-1, Fo).copy_(out.sum(0))
        torch.cuda.synchronize()
        err = ((y.permute(0, 3, 1, 2).float() - ref).norm() / ref.norm()).item()
        print(f"smoke {name}: rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "conv"))
