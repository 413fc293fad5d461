"""tiled.ops.attention (prefill) on CPU tensors against torch's CPU scaled_dot_product_attention,
same process, same threads.

    python benchmarks/cpu/attention.py [--seq 1024 --heads 8 --dim 128 --repeat 5]
        [--out benchmarks/results/cpu_attention.json]

q, k, v [1, S, H, D] bfloat16 (bshd), dense and causal. For each: every config of the op's
CPU space that takes S (tiled/ops/prefill.py's CPU_SPACE), the op restricted to that one
config, then `tiled.ops.attention` as a user calls it (tuned into a fresh cache, then
timed). The reference is F.scaled_dot_product_attention on the same bf16 tensors (bhsd
views), timed in the same rounds (one call each per round); every result is checked
against SDPA in float32 first. GFLOP/s count 4 S^2 H D (halved when causal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import each_config_then_tuned, run_rows

ROOT = Path(__file__).resolve().parents[2]


def bench(S: int, H: int, D: int, causal: bool, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F

    import tiled.ops as ops
    from tiled.ops import prefill

    g = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(1, S, H, D, generator=g).bfloat16() for _ in range(3))
    tq, tk, tv = (t.transpose(1, 2) for t in (q, k, v))
    want = F.scaled_dot_product_attention(tq.float(), tk.float(), tv.float(),
                                          is_causal=causal).transpose(1, 2)
    flop = 4.0 * S * S * H * D / (2 if causal else 1)

    def check(y) -> float:
        err = ((y.float() - want).norm() / want.norm()).item()
        assert err < 1e-2, (S, causal, err)
        return err

    refs = {"torch_sdpa_bf16": lambda: F.scaled_dot_product_attention(tq, tk, tv,
                                                                      is_causal=causal)}
    row = each_config_then_tuned(
        prefill.ATTENTION, lambda cfg: prefill.seq_bucket(S) >= cfg.get("min_seq", 0),
        lambda: ops.attention(q, k, v, causal=causal), check, refs, flop, repeat,
        f"S={S} causal={causal}")
    return {"S": S, "H": H, "D": D, "causal": causal, "dtype": "bfloat16", **row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_attention.json")
    args = p.parse_args()

    run_rows(args.out, "tiled-cpu-attention-",
             lambda: [bench(args.seq, args.heads, args.dim, c, args.repeat)
                      for c in (False, True)])


if __name__ == "__main__":
    main()
