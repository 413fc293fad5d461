"""Plots the Hopper GEMM results: tiled's and Triton's TFLOP/s as a ratio to cuBLAS, per shape
and dtype, from the JSON `hopper_gemm.py run` writes. Needs matplotlib (`pip install
matplotlib`; it is not a dependency of tiled).

    python benchmarks/gpu/plot_hopper.py benchmarks/results/hopper_gemm_h200.json \\
        --out benchmarks/results/hopper_gemm_h200.png
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.results).read_text())
    dtypes = sorted({r["dtype"] for r in data["rows"]})
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(11, 3.6 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes, strict=True):
        rows = [r for r in data["rows"] if r["dtype"] == dtype]
        labels = [f"{r['M']}x{r['N']}x{r['K']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["ratio_to_cublas"] for r in rows], 0.4,
               label="tiled (best tile config)")
        ax.bar([i + 0.2 for i in x], [r["triton_tflops"] / r["cublas_tflops"] for r in rows],
               0.4, label="Triton 3.6 (autotuned)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.95, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xticks(list(x), labels, rotation=20, fontsize=8)
        ax.set_ylabel("TFLOP/s / cuBLAS")
        ax.set_ylim(0, 1.15)
        ax.set_title(f"GEMM {dtype}, {data['device']} ({data['date']})", fontsize=10)
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
