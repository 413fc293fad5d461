"""Probe (issue 12): tiled.ops.grouped_linear's tile kernels, which the retired whole-kernel
GEMM path took (their copies' offsets come from the tile table), through the per-op path now
(the producer reads the table too: passes/pipeline.run_ahead). Each tile config of its CUDA
space at Mixtral's w1 (8 experts, 14336 x 4096) and DeepSeek's w1 (64 experts, 2048 x 7168),
8192 routed rows, balanced, built at two commits (labels: folders of the bundle; `whole` at
5b4f6d9, `per_op` after), checked against a float32 loop over the experts and timed together
(graph-replayed, rounds interleaved: bundle_cli.time_graphed; the tile table built once).

benchmarks/results/grouped_paths_h200.json: the per-op path, its blocks walking the grid, ran
1.06-1.30x the whole path's speed at every config (the fastest per shape: 656 against 612
TFLOP/s at Mixtral's w1, 441 against 389 at DeepSeek's); without the walk (`per_op_walled`:
a trip count that reaches a block index only through the table was counted as differing per
block) Mixtral's read 0.48-0.83x.

Here, once per commit (PROBE_ROOT: that commit's checkout):
    LABEL=whole PROBE_ROOT=/tmp/base python benchmarks/gpu/probes/grouped_paths_probe.py \\
        build .gpu/grouped_paths
    LABEL=per_op python benchmarks/gpu/probes/grouped_paths_probe.py build .gpu/grouped_paths
There: python3 benchmarks/gpu/probes/grouped_paths_probe.py run .gpu/grouped_paths \\
    $OUT/grouped_paths.json
"""

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[3]  # bundle_cli from this checkout
ROOT = Path(os.environ.get("PROBE_ROOT", HERE))  # tiled from the one building
sys.path.insert(0, str(HERE / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
SHAPES = {"mixtral_w1": (8, 14336, 4096), "deepseek_w1": (64, 2048, 7168)}
ROWS = 8192


def build(out: Path) -> None:
    from bundle_cli import compile_into, labelled_dir

    from tiled.ops import grouped

    label, where, commit = labelled_dir(out, "LABEL", "per_op")
    index = {}
    for shape, (E, N, K) in SHAPES.items():
        for i, cfg in enumerate(grouped.CUDA_SPACE):
            if cfg.get("kind", "tile") != "tile":
                continue
            name = f"{shape}__c{i}"
            compile_into(where, name, grouped.grouped_kernel(ROWS, E, N, K, "bfloat16", **cfg),
                         "cuda:sm_90a")
            index[name] = {"E": E, "N": N, "K": K, "config": cfg}
            print(label, name, cfg, flush=True)
    (where / "index.json").write_text(json.dumps({"commit": commit, "kernels": index},
                                                 indent=1))


def _shape(torch, bundle: Path, labels: dict, shape: str) -> list[dict]:
    from bundle_cli import load_kernel, time_graphed

    from tiled.ops.grouped import tile_table

    E, N, K = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(E * N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    offsets = (torch.arange(E + 1, device="cuda") * ROWS).div(E, rounding_mode="floor")
    ref = torch.cat([x[offsets[e]:offsets[e + 1]].float() @ w[e * N:(e + 1) * N].float().T
                     for e in range(E)])
    calls, meta, errs = {}, {}, {}
    for label, index in labels.items():
        for name, m in index["kernels"].items():
            if not name.startswith(shape + "__"):
                continue
            kernel = load_kernel(bundle / label, name)
            table = tile_table(offsets, ROWS, m["config"]["BM"])
            y = torch.zeros(ROWS, N, device="cuda", dtype=torch.bfloat16)
            kernel(x, w, table, y)
            torch.cuda.synchronize()
            key = f"{label}:{name}"
            errs[key] = float((y.float() - ref).norm() / ref.norm())
            calls[key] = (lambda fn, t, dst: lambda: fn(x, w, t, dst))(kernel, table, y)
            meta[key] = m["config"]
    us = time_graphed(torch, calls, 3, 10)
    rows = []
    for key, t in us.items():
        row = {"shape": shape, "kernel": key, "us": round(t, 2),
               "tflops": round(2 * ROWS * N * K / (t * 1e-6) / 1e12, 1),
               "rel_err": errs[key], "config": meta[key]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import labelled_indexes, write_labelled_rows

    labels = labelled_indexes(bundle)
    write_labelled_rows(out, labels,
                        [r for shape in SHAPES for r in _shape(torch, bundle, labels, shape)])


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
