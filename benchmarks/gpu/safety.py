"""Issue 10 on the H200: the memory-safety guards, launchable-by-construction GEMMs, and the
speed of the GEMM and attention kernels with guards on beside the same kernels with guards off
(`safe_access=False`), cuBLAS and cuDNN, in one run.

Here (the CPU machine, with TVM):
    python benchmarks/gpu/safety.py build --out .gpu/safety
There (device tool, carry=[".gpu"]; thin runtime only, no TVM):
    python3 benchmarks/gpu/safety.py run --bundle .gpu/safety --out $OUT/safety_h200.json

`run` checks (1) every kernel of safety_kernels.py on CUDA tensors surrounded by poisoned
canaries, (2) a GEMM with static K = 777 (fp16 rows of 1554 bytes, which TMA cannot describe)
and a GEMM with symbolic M, N, K at shapes that take its TMA kernel and shapes that take the
fallback shipped beside it, against torch; then (3) times GEMMs (fp16 / bf16, 4096^3 and
8192^3) and FlashAttention (bf16 d128 S=4096, plain and causal) with guards on and off and the
vendor reference, interleaved over 5 rounds (the H200's clock falls as it heats: whoever runs
later in a sequence runs slower), medians reported.
"""

import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import safety_kernels
from bundle_cli import compile_into, load_kernel, machine, main, smoke_in_child

GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
DYN_SHAPES = [(1000, 1024, 1024), (1000, 1024, 777), (1000, 1001, 1024), (4096, 4096, 4096)]
ATTN = {"bf16_d128_s4096": False, "bf16_d128_s4096_causal": True}
BATCH, HEADS, SEQ, DIM = 8, 16, 4096, 128
ROUNDS = 5


def build(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import flash_attention as fa
    import gemm

    import tiled.lang as T

    out.mkdir(parents=True, exist_ok=True)
    index = {"guards": {}, "launchable": {}, "speed": {}}
    for name, (factory, _) in safety_kernels.CASES.items():
        compiled, seconds = compile_into(out, f"guard_{name}", factory())
        index["guards"][name] = {"cold_compile_s": round(seconds, 3)}
    launchable = {
        "gemm_k777": gemm.matmul(1000, 1024, 777, 128, 128, 64, 3, "float16", threads=128),
        "gemm_dyn": gemm.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), 128, 256, 64, 4,
                                "float16", threads=256)}
    for name, kernel in launchable.items():
        compiled, seconds = compile_into(out, name, kernel)
        m = compiled.manifest
        index["launchable"][name] = {
            "cold_compile_s": round(seconds, 3), "threads": m.block[0],
            "tma": any(a.kind == "tensor_map" for a in m.kernel_args),
            "requires": m.to_dict().get("requires", []),
            "fallback": m.fallback["symbol"] if m.fallback else None}
    kernels = {f"gemm_{dt}": gemm.matmul(T.dyn("M"), T.dyn("N"), T.dyn("K"), 128, 256, 64, 4, dt,
                                         threads=256) for dt in ("float16", "bfloat16")}
    for name, causal in ATTN.items():
        kernels[f"attn_{name}"] = fa.flash_attention(BATCH, HEADS, HEADS, SEQ, SEQ, DIM, causal,
                                                     "bfloat16", block_M=128, block_N=128,
                                                     threads=256, num_stages=2)
    for name, kernel in kernels.items():
        shas = {}
        for guards in (True, False):
            compiled, seconds = compile_into(out, f"{name}_{'on' if guards else 'off'}", kernel,
                                             safe_access=guards)
            shas[guards] = hashlib.sha256(compiled.artifact).hexdigest()
        index["speed"][name] = {"identical_cubins": shas[True] == shas[False],
                                "sha256_on": shas[True], "sha256_off": shas[False]}
        same = "the same" if shas[True] == shas[False] else "different"
        print(f"{name}: guards on and off give {same} cubins", flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": f"python benchmarks/gpu/safety.py build --out {out}", "machine": machine(),
        **index}, indent=1))


# -- on the GPU machine ------------------------------------------------------------------------

class TorchSpace:
    """safety_kernels.NumpySpace on CUDA tensors: each sits between two poisoned zones."""

    def __init__(self, torch):
        self.torch, self.wholes = torch, []

    def tensor(self, values):
        torch, values = self.torch, np.asarray(values)
        if values.size == 0:  # stands alone: torch gives an empty CUDA tensor a NULL pointer
            return torch.empty(values.shape, device="cuda", dtype=getattr(torch,
                                                                          str(values.dtype)))
        c = safety_kernels.CANARY
        whole = torch.full((values.size + 2 * c,), safety_kernels.POISON, device="cuda",
                           dtype=getattr(torch, str(values.dtype)))
        view = whole[c:c + values.size].view(values.shape)
        view.copy_(torch.from_numpy(values))
        self.wholes.append(whole)
        return view

    def numpy(self, t):
        self.torch.cuda.synchronize()
        return t.cpu().numpy()

    def check(self):
        self.torch.cuda.synchronize()
        c = safety_kernels.CANARY
        for w in self.wholes:
            assert bool((w[:c] == safety_kernels.POISON).all()), "memory before a tensor written"
            assert bool((w[-c:] == safety_kernels.POISON).all()), "memory after a tensor written"


def smoke(bundle: Path) -> None:
    """Every guard kernel and the two launchable GEMMs once (in a child with a timeout)."""
    import torch

    for name, (_, check) in safety_kernels.CASES.items():
        check(load_kernel(bundle, f"guard_{name}"), TorchSpace(torch))
        print(f"smoke guard_{name}: ran", flush=True)
    for name in ("gemm_k777", "gemm_dyn"):
        a = torch.randn(1000, 777, device="cuda", dtype=torch.float16)
        b = torch.randn(777, 1024, device="cuda", dtype=torch.float16)
        load_kernel(bundle, name)(a, b, torch.empty(1000, 1024, device="cuda",
                                                    dtype=torch.float16))
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def check_guards(torch, bundle: Path) -> dict:
    out = {}
    for name, (_, check) in safety_kernels.CASES.items():
        space = TorchSpace(torch)
        try:
            check(load_kernel(bundle, f"guard_{name}"), space)
            space.check()
            out[name] = {"ok": True}
        except AssertionError as e:
            out[name] = {"ok": False, "error": str(e)[:2000]}
        print(f"guard {name}: {'ok' if out[name]['ok'] else out[name]['error']}", flush=True)
    return out


def gemm_error(torch, k, M, N, K) -> float:
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    k(a, b, c)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    return ((c.float() - ref).norm() / ref.norm()).item()


def check_launchable(torch, bundle: Path) -> dict:
    from tiled.runtime.manifest import eval_expr

    out = {"gemm_k777": {"M": 1000, "N": 1024, "K": 777,
                         "rel_err": gemm_error(torch, load_kernel(bundle, "gemm_k777"),
                                               1000, 1024, 777)}}
    k = load_kernel(bundle, "gemm_dyn")
    out["gemm_dyn"] = []
    for M, N, K in DYN_SHAPES:
        dims = {"M": M, "N": N, "K": K}
        variant = "fallback" if any(eval_expr(e, dims) for e in k.manifest.requires) else "tma"
        out["gemm_dyn"].append({"M": M, "N": N, "K": K, "variant": variant,
                                "rel_err": gemm_error(torch, k, M, N, K)})
    for row in [out["gemm_k777"], *out["gemm_dyn"]]:
        print(f"launchable {row}", flush=True)
    return out


def interleaved(torch, do_bench, calls: dict, flop: int) -> dict:
    """calls: name -> zero-argument launch. ROUNDS rounds of do_bench over every call in turn;
    medians of TFLOP/s, and each tiled call's ratio to the reference."""
    samples = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            samples[name].append(flop / do_bench(fn) / 1e9)
    med = {name: statistics.median(v) for name, v in samples.items()}
    ref = med["reference"]
    return {"tflops": samples, "median": med,
            "ratio_on": med["guards_on"] / ref, "ratio_off": med["guards_off"] / ref,
            "on_over_off": med["guards_on"] / med["guards_off"]}


def speed(torch, do_bench, bundle: Path) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for dtype in ("float16", "bfloat16"):
        dt = getattr(torch, dtype)
        on, off = (load_kernel(bundle, f"gemm_{dtype}_{x}") for x in ("on", "off"))
        for M, N, K in GEMM_SHAPES:
            torch.manual_seed(0)
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b = torch.randn(K, N, device="cuda", dtype=dt)
            c, c_ref = (torch.empty(M, N, device="cuda", dtype=dt) for _ in range(2))
            calls = {"reference": lambda a=a, b=b, c=c_ref: torch.matmul(a, b, out=c),
                     "guards_on": lambda a=a, b=b, c=c, k=on: k(a, b, c),
                     "guards_off": lambda a=a, b=b, c=c, k=off: k(a, b, c)}
            on(a, b, c)
            ref = a.float() @ b.float()
            row = {"kernel": f"gemm_{dtype}", "M": M, "N": N, "K": K, "reference": "cuBLAS",
                   "rel_err_on": ((c.float() - ref).norm() / ref.norm()).item(),
                   **interleaved(torch, do_bench, calls, 2 * M * N * K)}
            rows.append(row)
            print(f"{dtype} {M}^3: cuBLAS {row['median']['reference']:.0f}, guards on "
                  f"{row['median']['guards_on']:.0f} ({row['ratio_on']:.3f}x), off "
                  f"{row['median']['guards_off']:.0f} ({row['ratio_off']:.3f}x)", flush=True)
    for name, causal in ATTN.items():
        on, off = (load_kernel(bundle, f"attn_{name}_{x}") for x in ("on", "off"))
        torch.manual_seed(0)
        q, k, v = (torch.randn(BATCH, HEADS, SEQ, DIM, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        o = torch.empty_like(q)

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q, k, v, is_causal=causal)

        on(q, k, v, o)
        ref = sdpa(q.float(), k.float(), v.float(), is_causal=causal)
        calls = {"reference": cudnn,
                 "guards_on": lambda q=q, k=k, v=v, o=o, f=on: f(q, k, v, o),
                 "guards_off": lambda q=q, k=k, v=v, o=o, f=off: f(q, k, v, o)}
        flop = 4 * BATCH * HEADS * SEQ * SEQ * DIM // (2 if causal else 1)
        row = {"kernel": f"attn_{name}", "batch": BATCH, "heads": HEADS, "seq": SEQ,
               "dim": DIM, "causal": causal, "reference": "cuDNN SDPA",
               "rel_err_on": ((o.float() - ref).norm() / ref.norm()).item(),
               **interleaved(torch, do_bench, calls, flop)}
        rows.append(row)
        print(f"attention {name}: cuDNN {row['median']['reference']:.0f}, guards on "
              f"{row['median']['guards_on']:.0f} ({row['ratio_on']:.3f}x), off "
              f"{row['median']['guards_off']:.0f} ({row['ratio_off']:.3f}x)", flush=True)
    return rows


def run(bundle: Path, out: Path) -> None:
    import torch
    import triton
    from triton.testing import do_bench

    smoke_in_child(__file__, bundle, 120)
    index = json.loads((bundle / "index.json").read_text())
    result = {"guards": check_guards(torch, bundle),
              "launchable": check_launchable(torch, bundle)}
    result["speed"] = speed(torch, do_bench, bundle)
    out.write_text(json.dumps({
        "command": f"python3 benchmarks/gpu/safety.py run --bundle {bundle} --out {out}",
        "build": index, "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}, indent=1))


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "safety"))
