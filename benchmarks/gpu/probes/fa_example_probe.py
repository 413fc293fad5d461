"""Probe (issue 12): why the repo's FlashAttention example (examples/flash_attention.py as it was
at 5b4f6d9: P through shared memory, the scores scaled by a pass of their own before the
softmax) ran 13-19% behind the whole-kernel attention path on the per-op one. The example at
its fast config (128 x 128 tiles, 256 threads, 2 stages, d 128, 32 heads, bf16) through the
whole-kernel path (`whole`), and four forms through the per-op path (whole_kernel_paths=False):
`as_is`; `fold`, the scale folded into exp2's argument (no pass of its own); `v_late`, V's
copy moved to just before the second gemm; `both`. Checked against SDPA (cuDNN) and timed
with it, 5 rounds in rotated order (do_bench medians). benchmarks/results/
fa_example_probe_h200.json: folding is what closes the gap (non-causal 0.82 -> 0.96 and 0.84
-> 1.01x cuDNN); V's place changes nothing. (The causal form here masks with a pass of its
own on every tile, unlike the example, which masks only the tiles that reach the diagonal.)

Here:  python benchmarks/gpu/probes/fa_example_probe.py build .gpu/fa_variants
There: python3 benchmarks/gpu/probes/fa_example_probe.py run .gpu/fa_variants $OUT/fa.json
(the committed results were made by this script run from .gpu/ before it was committed here;
its `whole` builds take the example as it is now, whose scale is folded since.)
"""

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
HEADS, DIM = 32, 128
CONFIGS = [("bfloat16", 4096, 4, False), ("bfloat16", 16384, 1, False),
           ("bfloat16", 4096, 4, True)]
LOG2E = 1.4426950408889634
VARIANTS = {"as_is": (False, False), "fold": (True, False), "v_late": (False, True),
            "both": (True, True)}


def variant(batch, seq, causal, dtype, fold, v_late):
    """The example's kernel at 128 x 128 tiles, its scale folded or not, V's copy early or
    late."""
    import tiled
    import tiled.lang as T

    bm = bn = 128
    c = LOG2E / math.sqrt(DIM)
    neg_inf = -T.infinity("float32")
    shape = (batch, HEADS, seq, DIM)

    @tiled.kernel
    def flash_attn(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype),
                   V: T.Tensor(shape, dtype), Out: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq, bm), HEADS, batch, threads=256) as (bx, by, bz):
            Q_s = T.alloc_shared((bm, DIM), dtype)
            K_s = T.alloc_shared((bn, DIM), dtype)
            V_s = T.alloc_shared((bn, DIM), dtype)
            P_s = T.alloc_shared((bm, bn), dtype)
            S = T.alloc_fragment((bm, bn), "float32")
            acc = T.alloc_fragment((bm, DIM), "float32")
            row_max = T.alloc_fragment((bm,), "float32")
            row_sum = T.alloc_fragment((bm,), "float32")
            alpha = T.alloc_fragment((bm,), "float32")
            T.copy(Q[bz, by, bx * bm, 0], Q_s)
            T.clear(acc)
            T.fill(row_max, neg_inf)
            T.clear(row_sum)
            n_tiles = T.ceildiv(seq, bn)
            if causal:
                n_tiles = T.min(n_tiles, T.ceildiv((bx + 1) * bm, bn))
            for k in T.Pipelined(n_tiles, num_stages=2):
                T.copy(K[bz, by, k * bn, 0], K_s)
                if not v_late:
                    T.copy(V[bz, by, k * bn, 0], V_s)
                T.clear(S)
                T.gemm(Q_s, K_s, S, transpose_B=True)
                if causal:
                    for i, j in T.Parallel(bm, bn):
                        S[i, j] = T.if_then_else(bx * bm + i >= k * bn + j,
                                                 S[i, j] * (1.0 if fold else c), neg_inf)
                elif not fold:
                    for i, j in T.Parallel(bm, bn):
                        S[i, j] = S[i, j] * c
                for i in T.Parallel(bm):
                    alpha[i] = row_max[i]
                T.reduce_max(S, row_max, dim=1, clear=False)
                for i in T.Parallel(bm):
                    alpha[i] = T.exp2(alpha[i] * c - row_max[i] * c) if fold else \
                        T.exp2(alpha[i] - row_max[i])
                    row_sum[i] = row_sum[i] * alpha[i]
                for i, j in T.Parallel(bm, bn):
                    S[i, j] = T.exp2(S[i, j] * c - row_max[i] * c) if fold else \
                        T.exp2(S[i, j] - row_max[i])
                T.reduce_sum(S, row_sum, dim=1, clear=False)
                for i, j in T.Parallel(bm, DIM):
                    acc[i, j] = acc[i, j] * alpha[i]
                T.copy(S, P_s)
                if v_late:
                    T.copy(V[bz, by, k * bn, 0], V_s)
                T.gemm(P_s, V_s, acc)
            for i, j in T.Parallel(bm, DIM):
                acc[i, j] = acc[i, j] / row_sum[i]
            T.copy(acc, Out[bz, by, bx * bm, 0])

    return flash_attn


def build(out: Path) -> None:
    import flash_attention as fa
    from bundle_cli import compile_into

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for dtype, seq, batch, causal in CONFIGS:
        tag = f"s{seq}{'_c' if causal else ''}"
        k = fa.flash_attention(batch, HEADS, HEADS, seq, seq, DIM, causal, dtype, block_M=128,
                               block_N=128, threads=256, num_stages=2)
        compile_into(out, f"{tag}__whole", k, "cuda:sm_90a")
        index[f"{tag}__whole"] = [dtype, seq, batch, causal]
        for name, (fold, late) in VARIANTS.items():
            compile_into(out, f"{tag}__{name}", variant(batch, seq, causal, dtype, fold, late),
                         "cuda:sm_90a", whole_kernel_paths=False)
            index[f"{tag}__{name}"] = [dtype, seq, batch, causal]
        print(tag, flush=True)
    (out / "index.json").write_text(json.dumps(index))


def _config(torch, do_bench, load_kernel, bundle: Path, index: dict, config) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    dtype, seq, batch, causal = config
    tag = f"s{seq}{'_c' if causal else ''}"
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(batch, HEADS, seq, DIM, device="cuda", generator=g, dtype=dt)
               for _ in "qkv")
    o = torch.empty_like(q)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, is_causal=causal)

    ref = cudnn().float()
    calls, errs = {"cudnn": cudnn}, {}
    for name in index:
        if not name.startswith(tag + "__"):
            continue
        kernel = load_kernel(bundle, name)
        o.fill_(float("nan"))
        kernel(q, k, v, o)
        torch.cuda.synchronize()
        errs[name] = ((o.float() - ref).norm() / ref.norm()).item()
        calls[name] = (lambda fn: lambda: fn(q, k, v, o))(kernel)
    samples = {n: [] for n in calls}
    order = list(calls)
    for r in range(5):
        for n in order[r % len(order):] + order[:r % len(order)]:
            samples[n].append(do_bench(calls[n]))
    ms = {n: statistics.median(x) for n, x in samples.items()}
    return {"config": tag, "ratio_vs_cudnn": {n: ms["cudnn"] / ms[n] for n in ms},
            "errs": errs, "ms": ms}


def run(bundle: Path, out: Path) -> None:
    import torch
    from bundle_cli import load_kernel
    from triton.testing import do_bench

    index = json.loads((bundle / "index.json").read_text())
    rows = [_config(torch, do_bench, load_kernel, bundle, index, c) for c in CONFIGS]
    for row in rows:
        print(row["config"], {n: round(x, 3) for n, x in row["ratio_vs_cudnn"].items()},
              flush=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
