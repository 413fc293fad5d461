"""Compiles the spine's kernels for the H200 (cuda:sm_90a) on this machine and writes a folder
of artifacts + manifests that run_spine.py launches there with the thin runtime only.

    python benchmarks/gpu/build_bundle.py --out .gpu/bundle
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import elementwise
import gemm
import op_kernels
import softmax

import tiled
import tiled.lang as T

# name -> (kernel factory, role). "bench" kernels are timed against torch.matmul.
GEMM_CONFIGS = {  # block_M, block_N, block_K, num_stages, threads
    "gemm4096_128x128x32_s3_t128": (128, 128, 32, 3, 128),
    "gemm4096_128x128x32_s4_t128": (128, 128, 32, 4, 128),
    "gemm4096_128x256x32_s3_t256": (128, 256, 32, 3, 256),
    "gemm4096_128x128x64_s3_t128": (128, 128, 64, 3, 128),
    "gemm4096_256x128x32_s3_t256": (256, 128, 32, 3, 256),
}


def kernels():
    out = {}
    for name, (bm, bn, bk, st, th) in GEMM_CONFIGS.items():
        out[name] = gemm.matmul(4096, 4096, 4096, bm, bn, bk, st, "float16", threads=th)
    out["gemm_fp16_symM"] = gemm.matmul(T.dyn("M"), 1024, 1024)
    out["gemm_fp16_out16_1000"] = gemm.matmul(1000, 1000, 1000)
    out["gemm_bf16_1000"] = gemm.matmul(1000, 1000, 1000, dtype="bfloat16", out_dtype="float32")
    out["gemm_fp32_1000"] = gemm.matmul(1000, 1000, 1000, block_M=64, block_N=64,
                                        dtype="float32")
    out["softmax_256"] = softmax.softmax(256)
    out["vadd"] = elementwise.add()
    out.update(op_kernels.kernels())
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / ".gpu" / "bundle"))
    p.add_argument("--target", default="cuda:sm_90a")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, k in kernels().items():
        t0 = time.perf_counter()
        c = tiled.compile(k, target=args.target)
        dt = time.perf_counter() - t0
        (out / f"{name}.cubin").write_bytes(c.artifact)
        (out / f"{name}.manifest.json").write_text(c.manifest.to_json())
        index[name] = {"compile_seconds": round(dt, 3),
                       "stages": {k: round(v, 4) for k, v in c.stages.items()}}
        print(f"{name}: {dt:.2f} s", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
