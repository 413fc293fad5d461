"""Plots the FlashAttention results: tiled's, SDPA flash's and Triton's TFLOP/s as a ratio to
the faster of SDPA's flash and cuDNN backends, per config, from the JSON `flash_attention.py run`
writes. Needs matplotlib (`pip install matplotlib`; it is not a dependency of tiled).

    python benchmarks/gpu/plot_attention.py benchmarks/results/attn_h200.json \\
        --out benchmarks/results/attn_h200.png
"""

import argparse
import json
from pathlib import Path


def best_sdpa(row: dict) -> float:
    return max(row[b]["tflops"] for b in ("sdpa_flash", "sdpa_cudnn") if "tflops" in row[b])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.results).read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(13, 4.8))
    x = range(len(rows))
    width = 0.27
    series = (("tiled", "tiled"), ("sdpa_flash", "SDPA flash"), ("triton", "Triton 3.6"))
    for i, (key, label) in enumerate(series):
        ratios = [r[key]["tflops"] / best_sdpa(r) if "tflops" in r[key] else 0 for r in rows]
        ax.bar([j + (i - 1) * width for j in x], ratios, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.9, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["name"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s / best of SDPA flash, cuDNN")
    ax.set_title(f"FlashAttention forward on {data['device']}, batch 8, 16 heads "
                 f"(torch {data['versions']['torch']}, triton {data['versions']['triton']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
