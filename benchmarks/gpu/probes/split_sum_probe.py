"""Split-K's two sums side by side (tiled.ops.split_k: a `splitk_sum` kernel launched after the
GEMM, or the tile's last split adding the partials up inside the GEMM): every split config of
tiled.ops.linear's CUDA space in both forms (the second: tiled.ops.gemm.LAST_SUM_CONFIGS),
with F.linear, at the bundle's shapes and token counts: graph-replayed back to back (`hot`:
a weight that fits the L2 stays there) and with the L2 flushed before each call (`cold`: as
the tuner times candidates), in interleaved rounds; and the sum-in-kernel output replayed
from a CUDA graph (its counters the capture's own) checked against F.linear.

Here: AUTOTUNE_LINEAR_LAST=1 AUTOTUNE_LINEAR_SHAPES=8b_q_o AUTOTUNE_LINEAR_MS=16,64,128 \\
    python benchmarks/gpu/autotune_linear.py build --out .gpu/linear_last
There (carry .gpu): python3 benchmarks/gpu/probes/split_sum_probe.py .gpu/linear_last \\
    $OUT/split_sum_probe.json
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

ROUNDS = 3


def main(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import install_sums, load_kernel, time_graphed

    import tiled.tuning_bench as tb
    from tiled.ops.gemm import _fits, _run

    index = json.loads((bundle / "index.json").read_text())
    install_sums(bundle, index, "cuda:sm_90a")
    kernels = {n: v for n, v in index["kernels"].items() if "config" in v}
    flush = torch.empty(tb.GRAPH_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    rows = []
    for shape, (N, K) in index["shapes"].items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        for M in index["ms"]:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            want = torch.nn.functional.linear(x, w).float()
            lasts = {n: v for n, v in kernels.items() if n.startswith(shape + "__")
                     and v["config"].get("sum") == "last" and _fits(v["config"], M)}
            for name, v in lasts.items():
                twin = {k: c for k, c in v["config"].items() if k != "sum"}
                other = next(n for n, u in kernels.items() if n.startswith(shape + "__")
                             and u["config"] == twin)
                calls, err = {"F.linear": lambda x=x, w=w: torch.nn.functional.linear(x, w)}, {}
                for form, n, cfg in (("kernel", other, twin), ("last", name, v["config"])):
                    kern = load_kernel(bundle, n)
                    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    calls[form] = (lambda kern=kern, cfg=cfg, x=x, w=w, y=y:
                                   _run(kern, cfg, [x, w, y]))
                    calls[form]()
                    torch.cuda.synchronize()
                    err[form] = ((y.float() - want).norm() / want.norm()).item()
                err["last_graph"] = _graph_error(torch, calls["last"], want)
                hot = time_graphed(torch, calls, ROUNDS, 20, rep_ms=20)
                cold = {k: [] for k in calls}
                for _ in range(ROUNDS):
                    for k, fn in calls.items():
                        cold[k].append(tb._graph_time(torch, fn, flush, 10, 20))
                row = {"shape": shape, "M": M, "N": N, "K": K, "config": twin,
                       "hot_us": hot, "cold_us": {k: statistics.median(s)
                                                  for k, s in cold.items()},
                       "rel_err": err}
                print(json.dumps(row), flush=True)
                rows.append(row)
    out.write_text(json.dumps({
        "command": "python3 benchmarks/gpu/probes/split_sum_probe.py " + str(bundle),
        "build": index.get("command"), "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "rows": rows}, indent=1))


def _graph_error(torch, call, want) -> float:
    """The relative error of `call`'s output replayed three times from a CUDA graph (its
    counters from the capture's own buffer: tiled.ops.split_k.counters)."""
    y = call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = call()
    worst = 0.0
    for _ in range(3):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        worst = max(worst, ((y.float() - want).norm() / want.norm()).item())
    return worst


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
