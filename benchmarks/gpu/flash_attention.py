"""FlashAttention forward (examples/flash_attention.py, compiled for cuda:sm_90a) against torch
SDPA (flash and cuDNN backends) and a Triton flash-attention kernel, on the H200.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/flash_attention.py build --out .gpu/attn
    (TILED_ATTN_ONLY=name,name,... builds only those configs)
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/flash_attention.py run --bundle .gpu/attn --out $OUT/attn.json

Tensors are [batch, heads, seq, dim] (SDPA's layout). `build` compiles each config twice: as
compiled by default (the whole-kernel attention path, sm90_attn.py) and with
whole_kernel_paths=False (`<name>_per_op`: the per-op lowering, a TMA producer feeding the
loop), so that `run` shows whether the generic path can replace the recognizer; kernels have
static seq lengths (a symbolic seq does not compile for cuda today, see the example's
docstring), and each cold compile time is recorded.
`run` first launches every kernel once on a small problem in a child process with a timeout,
then for each config checks tiled, SDPA flash, SDPA cuDNN and Triton against a float32 SDPA
reference (outputs poisoned with NaN first) and times them with triton.testing.do_bench.
GQA: SDPA is called with enable_gqa=True; where a backend refuses that, K/V are repeated to
`heads` heads before timing (the repeat is not timed) and the row says so.
TFLOP/s counts 4 * B * H * S_q * S_kv * D flops, halved when causal.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bundle_cli import compile_into, load_kernel, machine, main, smoke_in_child

BATCH, HEADS = 8, 16
PER_OP = "_per_op"  # suffix of each config's build without the whole-kernel path
DEVICE = "cuda"
# name -> (kv_heads, seq, dim, causal, dtype, block_M, block_N, threads, stages). 128 x 128
# tiles with 256 threads take the sm_90a warp-specialized attention path (two consumer
# warpgroups of 64 query rows each, and a TMA producer warpgroup).
WS = (128, 128, 256, 2)
CONFIGS = {
    **{f"bf16_d128_s{s}{'_causal' if c else ''}": (16, s, 128, c, "bfloat16", *WS)
       for s in (1024, 2048, 4096, 8192, 16384) for c in (False, True)},
    **{f"fp16_d128_s{s}{'_causal' if c else ''}": (16, s, 128, c, "float16", *WS)
       for s in (4096, 16384) for c in (False, True)},
    "bf16_d64_s4096": (16, 4096, 64, False, "bfloat16", *WS),
    "bf16_d64_s4096_causal": (16, 4096, 64, True, "bfloat16", *WS),
    "fp16_d64_s1024_causal": (16, 1024, 64, True, "float16", *WS),
    "gqa4_bf16_d128_s4096": (4, 4096, 128, False, "bfloat16", *WS),
    "gqa4_bf16_d128_s4096_causal": (4, 4096, 128, True, "bfloat16", *WS),
    "bf16_d128_s1000_ragged": (16, 1000, 128, False, "bfloat16", *WS),
    "fp16_d64_s1000_ragged_causal": (16, 1000, 64, True, "float16", *WS),
}


# Numerics-only variants: name -> (batch, heads, kv_heads, seq_q, seq_kv, dim, causal, dtype,
# block_M, block_N, threads). "S" is a symbolic length (one kernel, run at several lengths).
VARIANTS = {
    "cross_q300_kv1000": (2, 8, 2, 300, 1000, 128, False, "bfloat16", 128, 128, 256),
    "bn64_causal": (2, 8, 8, 1000, 1000, 128, True, "float16", 128, 64, 256),
    "one_warpgroup_d128": (2, 8, 4, 777, 777, 128, True, "bfloat16", 64, 64, 128),
    "symbolic_seq": (2, 8, 4, "S", "S", 64, True, "float16", 128, 128, 256),
}
SYMBOLIC_LENGTHS = (1, 129, 1000, 2048)


def build_variants(out: Path, fa) -> dict:
    import tiled.lang as T

    meta = {}
    for name, (b, h, kvh, sq, skv, d, causal, dtype, bm, bn, threads) in VARIANTS.items():
        S = T.dyn("S")
        sq_, skv_ = (S if x == "S" else x for x in (sq, skv))
        kernel = fa.flash_attention(b, h, kvh, sq_, skv_, d, causal, dtype, block_M=bm,
                                    block_N=bn, threads=threads)
        compiled, seconds = compile_into(out, name, kernel)
        meta[name] = {"batch": b, "heads": h, "kv_heads": kvh, "seq_q": sq, "seq_kv": skv,
                      "dim": d, "causal": causal, "dtype": dtype, "block_M": bm,
                      "block_N": bn, "threads": threads, "cold_compile_s": round(seconds, 3),
                      "warp_specialized": "WsAttn<" in compiled.source}
        print(f"{name}: {seconds:.2f} s, warp specialized: {meta[name]['warp_specialized']}",
              flush=True)
    return meta


def check_variants(bundle: Path, variants: dict) -> list:
    """Each variant against a float32 SDPA reference (outputs poisoned with NaN first); the
    causal mask is top-left aligned, as the example's (torch's is_causal is too)."""
    import torch

    rows = []
    for name, m in variants.items():
        k = load_kernel(bundle, name)
        lengths = SYMBOLIC_LENGTHS if m["seq_q"] == "S" else [None]
        for n in lengths:
            sq = n if m["seq_q"] == "S" else m["seq_q"]
            skv = n if m["seq_kv"] == "S" else m["seq_kv"]
            torch.manual_seed(1)
            dt = getattr(torch, m["dtype"])
            q = torch.randn(m["batch"], m["heads"], sq, m["dim"], device=DEVICE, dtype=dt)
            kk, v = (torch.randn(m["batch"], m["kv_heads"], skv, m["dim"], device=DEVICE,
                                 dtype=dt) for _ in "kv")
            o = torch.full_like(q, float("nan"))
            k(q, kk, v, o)
            torch.cuda.synchronize()
            mask = None
            if m["causal"]:
                mask = torch.ones(sq, skv, device=DEVICE, dtype=torch.bool).tril()
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), kk.float(), v.float(), attn_mask=mask, enable_gqa=True)
            err = ((o.float() - ref).norm() / ref.norm()).item()
            ok = err < (1e-2 if m["dtype"] == "bfloat16" else 2e-3) and \
                not torch.isnan(o).any().item()
            rows.append({"name": name, "seq_q": sq, "seq_kv": skv, "err": err, "ok": ok})
            print(f"variant {name} seq_q={sq} seq_kv={skv}: rel err {err:.2e} "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
    return rows


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import flash_attention as fa

    out.mkdir(parents=True, exist_ok=True)
    index = {}
    only = [x for x in os.environ.get("TILED_ATTN_ONLY", "").split(",") if x]
    for name, (kvh, seq, d, causal, dtype, bm, bn, threads, stages) in CONFIGS.items():
        if only and name not in only:
            continue
        kernel = fa.flash_attention(BATCH, HEADS, kvh, seq, seq, d, causal, dtype, block_M=bm,
                                    block_N=bn, threads=threads, num_stages=stages)
        compiled, seconds = compile_into(out, name, kernel)
        # The same kernel through the per-op lowering (a TMA producer feeding the loop,
        # ws_loop.py) instead of the whole-kernel attention path: both timed by `run`.
        try:
            compile_into(out, name + PER_OP, kernel, whole_kernel_paths=False)
            per_op = "built"
        except Exception as e:  # recorded; `run` times what was built
            per_op = f"{type(e).__name__}: {e}"[:500]
        index[name] = {"per_op": per_op, "kv_heads": kvh, "seq": seq, "dim": d,
                       "causal": causal, "dtype": dtype, "block_M": bm, "block_N": bn,
                       "threads": threads, "num_stages": stages,
                       "cold_compile_s": round(seconds, 3),
                       "stages": {k: round(v, 3) for k, v in compiled.stages.items()},
                       "dynamic_smem_bytes": compiled.manifest.dynamic_smem_bytes,
                       "cubin_bytes": len(compiled.artifact)}
        print(f"{name}: {seconds:.2f} s, {compiled.manifest.dynamic_smem_bytes} B smem",
              flush=True)
    variants = build_variants(out, fa)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/flash_attention.py build --out {out}",
        "machine": machine(),
        "batch": BATCH, "heads": HEADS, "kernels": index, "variants": variants}, indent=1))


# -- on the GPU machine ------------------------------------------------------------------------

def triton_attention():
    """A blocked online-softmax attention forward in Triton: one program per (BM query rows,
    batch*head), K/V walked in BN-row tiles, exp2 with the scale folded in, fp32 accumulators."""
    import triton
    import triton.language as tl

    @triton.jit
    def fwd(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, seq_q, seq_kv, H: tl.constexpr,
            GROUP: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            CAUSAL: tl.constexpr, EVEN: tl.constexpr):
        tile = tl.program_id(0)
        bh = tl.program_id(1)
        kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
        rows = tile * BM + tl.arange(0, BM)
        d = tl.arange(0, D)
        q_off = bh.to(tl.int64) * seq_q * D
        kv_off = kv_bh.to(tl.int64) * seq_kv * D
        if EVEN:
            q = tl.load(q_ptr + q_off + rows[:, None] * D + d[None, :])
        else:
            q = tl.load(q_ptr + q_off + rows[:, None] * D + d[None, :],
                        mask=rows[:, None] < seq_q, other=0.0)
        row_max = tl.full([BM], float("-inf"), tl.float32)
        row_sum = tl.zeros([BM], tl.float32)
        out = tl.zeros([BM, D], tl.float32)
        end = seq_kv
        if CAUSAL:  # keys after the tile's last query row are all masked
            end = tl.minimum(seq_kv, (tile + 1) * BM)
        for start in range(0, end, BN):
            cols = start + tl.arange(0, BN)
            kt_ptrs = k_ptr + kv_off + cols[None, :] * D + d[:, None]
            v_ptrs = v_ptr + kv_off + cols[:, None] * D + d[None, :]
            if EVEN:
                kt = tl.load(kt_ptrs)
                v = tl.load(v_ptrs)
            else:
                kt = tl.load(kt_ptrs, mask=cols[None, :] < seq_kv, other=0.0)
                v = tl.load(v_ptrs, mask=cols[:, None] < seq_kv, other=0.0)
            s = tl.dot(q, kt) * qk_scale
            if not EVEN:
                s = tl.where(cols[None, :] < seq_kv, s, float("-inf"))
            if CAUSAL:
                s = tl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(s, 1))
            p = tl.math.exp2(s - new_max[:, None])
            rescale = tl.math.exp2(row_max - new_max)
            row_sum = row_sum * rescale + tl.sum(p, 1)
            out = tl.dot(p.to(v.dtype), v, out * rescale[:, None])
            row_max = new_max
        out = out / row_sum[:, None]
        o_ptrs = o_ptr + q_off + rows[:, None] * D + d[None, :]
        if EVEN:
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty))
        else:
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < seq_q)

    def run(q, k, v, o, causal):
        B, H, Sq, D = q.shape
        Skv = k.shape[2]
        BM, BN = 128, 64
        warps = 8 if D >= 128 else 4
        even = Sq % BM == 0 and Skv % BN == 0
        grid = (triton.cdiv(Sq, BM), B * H)
        fwd[grid](q, k, v, o, 1.4426950408889634 / D ** 0.5, Sq, Skv, H, H // k.shape[1], D,
                  BM, BN, causal, even, num_warps=warps, num_stages=3)

    return run


def problem(torch, kvh, seq, d, dtype, batch=BATCH, heads=HEADS, seed=0):
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(batch, heads, seq, d, device=DEVICE, dtype=dt)
    k = torch.randn(batch, kvh, seq, d, device=DEVICE, dtype=dt)
    v = torch.randn(batch, kvh, seq, d, device=DEVICE, dtype=dt)
    return q, k, v


def smoke(bundle: Path) -> None:
    """One small launch of every kernel (run in a child with a timeout: a hang costs seconds)."""
    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name, meta in index["kernels"].items():
        k = load_kernel(bundle, name)
        seq = meta["seq"]  # the shapes are static: the full problem, launched once
        q, kk, v = problem(torch, meta["kv_heads"], seq, meta["dim"], meta["dtype"])
        o = torch.full_like(q, float("nan"))
        k(q, kk, v, o)
        torch.cuda.synchronize()
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), kk.float(), v.float(), is_causal=meta["causal"], enable_gqa=True)
        err = ((o.float() - ref).norm() / ref.norm()).item()
        print(f"smoke {name}: rel err {err:.2e}", flush=True)


def sdpa_call(torch, backend, q, k, v, causal):
    """A zero-argument SDPA call on `backend`, and how GQA was given to it."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    gqa = k.shape[1] != q.shape[1]

    def call(k=k, v=v, enable_gqa=gqa):
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=enable_gqa)

    if not gqa:
        call()
        return call, "none"
    try:
        call()
        return call, "enable_gqa"
    except RuntimeError:
        rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        call(kr, vr, False)
        return (lambda: call(kr, vr, False)), "repeat_kv"


def run(bundle: Path, out: Path) -> None:
    import torch
    import triton
    from torch.nn.attention import SDPBackend
    from triton.testing import do_bench

    smoke_in_child(__file__, bundle, 150)
    index = json.loads((bundle / "index.json").read_text())
    tri = triton_attention()
    rows = []
    for name, meta in index["kernels"].items():
        kern = load_kernel(bundle, name)
        per_op = load_kernel(bundle, name + PER_OP) if \
            (bundle / f"{name}{PER_OP}.cubin").exists() else None
        rows.append(bench_one(torch, do_bench, tri, SDPBackend, kern, name, meta, meta["seq"],
                              per_op))
    variants = check_variants(bundle, index.get("variants", {}))
    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/flash_attention.py run --bundle {bundle} --out {out}",
        "build": index, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
        "variants": variants}, indent=1))


def bench_one(torch, do_bench, tri, SDPBackend, kern, name, meta, seq, per_op=None) -> dict:
    causal, d = meta["causal"], meta["dim"]
    q, k, v = problem(torch, meta["kv_heads"], seq, d, meta["dtype"])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=True)
    flop = 4 * BATCH * HEADS * seq * seq * d // (2 if causal else 1)
    row = {"name": name, "seq": seq, **{x: meta[x] for x in ("kv_heads", "dim", "causal",
                                                              "dtype")}}

    def check(o) -> dict:
        return {"err": ((o.float() - ref).norm() / ref.norm()).item(),
                "max_abs_err": (o.float() - ref).abs().max().item(),
                "nan": bool(torch.isnan(o).any().item())}

    def timed(fn) -> dict:
        ms = do_bench(fn)
        return {"ms": ms, "tflops": flop / ms / 1e9}

    o = torch.full_like(q, float("nan"))
    kern(q, k, v, o)
    torch.cuda.synchronize()
    row["tiled"] = {**check(o), **timed(lambda: kern(q, k, v, o))}
    if per_op is not None:  # whole_kernel_paths=False: the per-op lowering of the example
        o2 = torch.full_like(q, float("nan"))
        per_op(q, k, v, o2)
        torch.cuda.synchronize()
        row["tiled_per_op"] = {**check(o2), **timed(lambda: per_op(q, k, v, o2))}
    for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                           ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            fn, gqa_mode = sdpa_call(torch, backend, q, k, v, causal)
        except RuntimeError as e:  # the backend does not take this problem: recorded, not timed
            row[label] = {"error": str(e).splitlines()[0][:300]}
            continue
        row[label] = {**check(fn()), **timed(fn), "gqa": gqa_mode}
    o_tri = torch.full_like(q, float("nan"))
    tri(q, k, v, o_tri, causal)
    row["triton"] = {**check(o_tri), **timed(lambda: tri(q, k, v, o_tri, causal))}
    for other in ("sdpa_flash", "sdpa_cudnn", "triton"):
        if "tflops" in row[other]:
            row[f"tiled_vs_{other}"] = row["tiled"]["tflops"] / row[other]["tflops"]
            if per_op is not None:
                row[f"tiled_per_op_vs_{other}"] = \
                    row["tiled_per_op"]["tflops"] / row[other]["tflops"]
    fmt = lambda r: f"{r['tflops']:6.1f}" if "tflops" in r else "   n/a"  # noqa: E731
    print(f"{name:30s} S={seq:5d} TFLOP/s tiled {fmt(row['tiled'])} | flash "
          f"{fmt(row['sdpa_flash'])} | cudnn {fmt(row['sdpa_cudnn'])} | triton "
          f"{fmt(row['triton'])} | errs tiled {row['tiled']['err']:.1e} flash "
          f"{row['sdpa_flash'].get('err', float('nan')):.1e} triton "
          f"{row['triton']['err']:.1e}", flush=True)
    return row


if __name__ == "__main__":
    main(build, run, smoke, ".gpu/attn")
