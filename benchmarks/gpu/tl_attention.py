"""FlashAttention forward written in TileLang's style (the conformance suite's kernel,
tests/conformance/k_attention.py: BSHD, macros, row statistics copied fragment to fragment, P
cast fragment to fragment and fed to T.gemm from registers, the output staged through shared
memory), compiled for cuda:sm_90a by the generic lowering, against torch SDPA on the H200.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/tl_attention.py build --out .gpu/tl_attn
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/tl_attention.py run --bundle .gpu/tl_attn --out $OUT/tl_attn.json

d = 128, S = 4096 (batch 8) and 16384 (batch 2), 16 heads, bf16 and fp16, causal and not;
128 x 128 tiles, 256 threads. Each config is built as compiled by default and with the
compile options of VARIANTS (pingpong=True: the consumer warpgroups take turns issuing
their gemms; persistent=1 / 2: one block per program block / min(blocks, SMs) blocks walking
the grid, one of which is the default's choice), all timed in the same rounds.
The reference is the faster of SDPA's flash and
cuDNN backends, each given the same BSHD tensors as transposed views (what a BSHD caller
writes) and as contiguous BHSD copies made before timing; the row keeps all four. Kernels are
timed in interleaved rounds (triton.testing.do_bench, median of ROUNDS). TFLOP/s counts
4 * B * H * S^2 * D, halved when causal.
"""

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, smoke_in_child, write_results

HEADS, DIM = 16, 128
ROUNDS = 3
VARIANTS = {"_pingpong": {"pingpong": True}, "_persistent_off": {"persistent": 1},
            "_persistent_on": {"persistent": 2}}
CONFIGS = {f"{dt}_s{s}{'_causal' if c else ''}": (b, s, c, dt)
           for dt in ("bfloat16", "float16") for s, b in ((4096, 8), (16384, 2))
           for c in (False, True)}


def kernel(batch, seq, causal, dtype):
    from tests.conformance.k_attention import flash_attention

    return flash_attention(batch, HEADS, seq, DIM, causal=causal, block_M=128, block_N=128,
                           threads=256, num_stages=2, dtype=dtype)


def build(out: Path) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, (b, s, c, dt) in CONFIGS.items():
        for suffix, options in VARIANTS.items():
            compile_into(out, name + suffix, kernel(b, s, c, dt).kernel, **options)
        compiled, seconds = compile_into(out, name, kernel(b, s, c, dt).kernel)
        m = compiled.manifest
        index[name] = {"batch": b, "seq": s, "causal": c, "dtype": dt,
                       "cold_compile_s": round(seconds, 3), "block": list(m.block),
                       "dynamic_smem_bytes": m.dynamic_smem_bytes,
                       "tensor_maps": sum(a.kind == "tensor_map" for a in m.kernel_args)}
        print(f"{name}: {index[name]}", flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/tl_attention.py build --out {out}",
        "machine": machine(), "heads": HEADS, "dim": DIM, "kernels": index}, indent=1))


def problem(torch, b, s, dt):
    torch.manual_seed(0)
    return [torch.randn(b, s, HEADS, DIM, device="cuda", dtype=getattr(torch, dt))
            for _ in "qkv"]


def smoke(bundle: Path) -> None:
    import json

    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name, m in index["kernels"].items():
        q, k, v = problem(torch, m["batch"], m["seq"], m["dtype"])
        load_kernel(bundle, name)(q, k, v, torch.empty_like(q))
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def bench_one(torch, do_bench, kernels: dict, m: dict) -> dict:
    """One config: the kernels (name -> loaded kernel) and the four SDPA calls, checked,
    then timed interleaved."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v = problem(torch, m["batch"], m["seq"], m["dtype"])
    o = torch.full_like(q, float("nan"))
    views = [t.transpose(1, 2) for t in (q, k, v)]
    copies = [t.contiguous() for t in views]
    causal = m["causal"]

    def sdpa_on(backend, args):
        def call():
            with sdpa_kernel(backend):
                return sdpa(*args, is_causal=causal)
        return call

    calls = {name: (lambda kern=kern: kern(q, k, v, o)) for name, kern in kernels.items()}
    for bname, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                           ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        calls[f"sdpa_{bname}_views"] = sdpa_on(backend, views)
        calls[f"sdpa_{bname}_bhsd"] = sdpa_on(backend, copies)
    ref = calls["sdpa_cudnn_bhsd"]().transpose(1, 2).float()
    err = {}
    for name in kernels:
        o.fill_(float("nan"))
        calls[name]()
        err[name] = ((o.float() - ref).norm() / ref.norm()).item()
    samples = {c: [] for c in calls}
    for _ in range(ROUNDS):
        for c, fn in calls.items():
            samples[c].append(do_bench(fn))
    ms = {c: statistics.median(x) for c, x in samples.items()}
    flop = 4 * m["batch"] * HEADS * m["seq"] ** 2 * DIM // (2 if causal else 1)
    tflops = {c: flop / t / 1e9 for c, t in ms.items()}
    best = max((c for c in tflops if c.startswith("sdpa")), key=tflops.get)
    return {**m, "rel_err_vs_cudnn": err, "ok": all(e < 1e-2 for e in err.values()),
            "ms": ms, "tflops": tflops, "reference": best,
            "ratio": {name: tflops[name] / tflops[best] for name in kernels}}


def run(bundle: Path, out: Path) -> None:
    import json

    import torch
    from triton.testing import do_bench

    smoke_in_child(__file__, bundle, 300)
    index = json.loads((bundle / "index.json").read_text())
    rows = {}
    for name, m in index["kernels"].items():
        kernels = {"tiled": load_kernel(bundle, name),
                   **{"tiled" + sfx: load_kernel(bundle, name + sfx) for sfx in VARIANTS}}
        rows[name] = r = bench_one(torch, do_bench, kernels, m)
        tiled_rates = ", ".join(f"{k} {r['tflops'][k]:.0f} ({r['ratio'][k]:.3f}x)"
                                for k in kernels)
        print(f"{name}: {tiled_rates}; {r['reference']} {r['tflops'][r['reference']]:.0f}; "
              f"rel err {max(r['rel_err_vs_cudnn'].values()):.1e}", flush=True)
    write_results(out, "tl_attention.py", bundle, index, rounds=ROUNDS, rows=rows)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "tl_attn"))
