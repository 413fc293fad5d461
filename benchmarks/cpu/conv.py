"""tiled.ops.conv2d on CPU tensors against torch's CPU conv2d, same process, same threads.

    python benchmarks/cpu/conv.py [--repeat 5] [--out benchmarks/results/cpu_conv.json]

bf16 layers (3x3, padding 1): x [4, C, 56, 56] and C -> F filters for (C, F) = (64, 64) and
(128, 128), and (16, 32) where the narrow config serves. For each: every config of the op's
CPU space that takes the layer (tiled/ops/conv.py's CPU_SPACE), the op restricted to that
one config, then `tiled.ops.conv2d` as a user calls it (tuned into a fresh cache, then
timed). References in the same rounds (one call each per round): F.conv2d on the same bf16
NCHW tensors, and on channels-last copies of them. Every result is checked against F.conv2d
in float32 first. GFLOP/s count 2 N P Q F C R S.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import each_config_then_tuned, run_rows

ROOT = Path(__file__).resolve().parents[2]


def bench(C: int, F_: int, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F

    import tiled.ops as ops
    from tiled.ops import conv

    N, H, W = 4, 56, 56
    g = torch.Generator().manual_seed(C)
    x = torch.randn(N, C, H, W, generator=g).bfloat16()
    w = (torch.randn(F_, C, 3, 3, generator=g) / (9 * C) ** 0.5).bfloat16()
    xcl, wcl = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    want = F.conv2d(x.float(), w.float(), padding=1)
    flop = 2.0 * N * H * W * F_ * C * 9

    def check(y) -> float:
        err = ((y.float() - want).norm() / want.norm()).item()
        assert err < 1e-2, (C, F_, err)
        return err

    refs = {"torch_conv2d_bf16": lambda: F.conv2d(x, w, padding=1),
            "torch_conv2d_bf16_channels_last": lambda: F.conv2d(xcl, wcl, padding=1)}
    row = each_config_then_tuned(
        conv.CONV2D, lambda cfg: min(C, F_) >= cfg.get("min_channels", 0),
        lambda: ops.conv2d(x, w, padding=1), check, refs, flop, repeat, f"C={C} F={F_}")
    return {"N": N, "C": C, "H": H, "W": W, "F": F_, "R": 3, "S": 3, "dtype": "bfloat16",
            **row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_conv.json")
    args = p.parse_args()

    run_rows(args.out, "tiled-cpu-conv-",
             lambda: [bench(c, f, args.repeat) for c, f in ((64, 64), (128, 128), (16, 32))])


if __name__ == "__main__":
    main()
