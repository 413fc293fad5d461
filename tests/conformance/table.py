"""Writes the table of tests/conformance/README.md from the registry and one H200 run:

    python -m tests.conformance.table benchmarks/results/conformance_h200.json

The cpu and sm_80 columns state what CI checks (test_conformance.py runs every kernel on cpu
against numpy; test_conformance_cuda.py compiles it for sm_80 and sm_90a); the sm_90a and speed
columns come from the run file, and say so where a case failed or was not run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conformance.cases import load_all

README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- table: begin -->", "<!-- table: end -->"

# The torch op each kernel is timed beside (its case's torch_op).
REFERENCE = {
    "absmax_quant_fp8": "torch amax / div / cast", "absmax_quant_int8": "torch amax / div / round",
    "column_extrema": "torch.aminmax", "conv2d_nhwc": "F.conv2d (cuDNN)",
    "conv2d_im2col": "F.conv2d (cuDNN)",
    "cumsum_rows": "torch.cumsum", "dequant_gemm_int4": "torch unpack + matmul",
    "elementwise_add": "torch.add", "gemm": "torch.matmul", "gemm_fp8_e4m3": "torch._scaled_mm",
    "gemm_nt": "torch.matmul", "gemm_nt_tf32": "torch.matmul (tf32)", "gemm_rs": "torch.matmul",
    "gemm_splitk": "torch.matmul",
    "gemm_streamk": "torch.matmul", "gemv_scalar": "torch.mv", "gemv_tile": "torch.mv",
    "gqa_decode_split": "SDPA, masked, GQA", "mha_split_kv": "SDPA", "nsa_sparse_fwd": "",
    "topk_gating": "torch.topk",
    "gqa_fwd_bshd": "SDPA (cuDNN)", "layer_norm": "F.layer_norm", "mha_fwd_bhsd": "SDPA (cuDNN)",
    "mha_fwd_bhsd_wgmma_pipelined": "SDPA (cuDNN)", "mha_fwd_bshd": "SDPA (cuDNN)",
    "mha_fwd_bshd_causal": "SDPA (cuDNN)", "rms_norm": "F.rms_norm",
    "silu_and_mul": "torch silu * mul",
    "softmax": "torch.softmax", "tiled_copy_scale": "torch mul + add",
}


def _sm90(row: dict | None) -> str:
    if row is None:
        return "not run"
    if "error" in row:
        return "error: " + row["error"][:60]
    small = row.get("small")
    if small is None:
        return "did not build"
    worst = max(small["rel_err"])
    return f"{'correct' if small['ok'] else 'WRONG'} (rel err {worst:.0e})"


def _speed(name: str, row: dict | None) -> str:
    big = (row or {}).get("big")
    if not big or big.get("ratio") is None:
        return "not timed"
    unit, rate = big["unit"], big["rate"]
    return (f"{big['ratio']:.2g}x {REFERENCE.get(name, 'torch')} "
            f"({_num(rate['tiled'])} vs {_num(rate['torch'])} {unit})")


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def table(run: dict) -> str:
    lines = ["| kernel | family | idioms | cpu | sm_80 | sm_90a (H200) | H200 speed vs torch |",
             "|---|---|---|---|---|---|---|"]
    for name, case in sorted(load_all().items()):
        row = run["cases"].get(name)
        lines.append(f"| `{name}` | {case.family} | {', '.join(case.idioms)} | pass | compiles "
                     f"| {_sm90(row)} | {_speed(name, row)} |")
    return "\n".join(lines)


def main(path: str) -> None:
    run = json.loads(Path(path).read_text())
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    note = (f"From `{path}` ({run['device']}, {run['date']}, torch {run['versions']['torch']}); "
            "regenerate with `python -m tests.conformance.table " + path + "`.")
    README.write_text(f"{head}{BEGIN}\n{note}\n\n{table(run)}\n{END}{tail}")


if __name__ == "__main__":
    main(sys.argv[1])
