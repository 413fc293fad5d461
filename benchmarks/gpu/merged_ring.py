"""Two 32-wide K tiles per ring stage on the per-op sm_90a path (ws_loop.py's `merge`): numerics
of the merged forms, and the seed's example GEMM (examples/gemm.py, 128x128x32, 3 stages, 128
threads) through the per-op path beside the whole-kernel GEMM path (sm90_gemm.py, retired
since: targets/cuda/paths.py) and cuBLAS, fp16 4096^3, in one process.

Its results files were measured when the default was still the whole-kernel GEMM path: their
`seed_whole` rows are that path (compiled with no options then). The per-op path is the
default since 10fc5c4 and the script no longer builds the whole-path row.

benchmarks/results/merged_ring_h200_stages.json is this script's run at the commit before
merged rings took 4 stages at one block per SM (ws_plan.WsLoop.block_budget): its
`seed_per_op_s2` / `_s3` ran 3 ring stages at two blocks per SM (a 2-stage loop grew to 3),
`_s4` (num_stages=4) 4 stages at one.

Checked kernels (each against torch in float32):
- `nt_odd`: C = A B^T, bf16, B K-major, K = 4064 (127 K tiles: the last stage half empty);
- `nn_odd`: C = A B, fp16, B MN-major (panels of 2 x 32 K rows), K = 4064;
- `read_tile`: a T.Parallel that reads the merged A tile element by element after each gemm
  (acc += A_s[i, j % 32]), K = 160 (5 tiles).

Here (the CPU machine, with TVM):
    python benchmarks/gpu/merged_ring.py build --out .gpu/merged_ring
There (device tool, carry=[".gpu"]; thin runtime only):
    python3 benchmarks/gpu/merged_ring.py run --bundle .gpu/merged_ring \
        --out $OUT/merged_ring_h200.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from bundle_cli import (
    build_command,
    compile_into,
    load_kernel,
    machine,
    main,
    rotated_medians,
    smoke_in_child,
    smoke_order,
    write_results,
)

TARGET = "cuda:sm_90a"
ROUNDS = 5
SIZE = 4096
ODD_K = 4064  # 127 K tiles of 32
PER_OP = {"whole_kernel_paths": False}


def _nt(M, N, K, dtype="bfloat16", read_tile=False):
    import tiled
    import tiled.lang as T

    @tiled.kernel
    def gemm_nt(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype),
                C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // 128, M // 128, threads=128) as (bx, by):
            A_s = T.alloc_shared((128, 32), dtype)
            B_s = T.alloc_shared((128, 32), dtype)
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=3):
                T.copy(A[by * 128, k * 32], A_s)
                T.copy(B[bx * 128, k * 32], B_s)
                T.gemm(A_s, B_s, acc, transpose_B=True)
                if read_tile:
                    for i, j in T.Parallel(128, 128):
                        acc[i, j] = acc[i, j] + T.cast(A_s[i, j % 32], "float32")
            T.copy(acc, C[by * 128, bx * 128])

    return gemm_nt


def kernels() -> dict:
    """name -> (kernel, compile options, what it is)."""
    import gemm

    out = {"nt_odd": (_nt(SIZE, SIZE, ODD_K), PER_OP, "checked"),
           "nn_odd": (gemm.matmul(SIZE, SIZE, ODD_K, 128, 128, 32, 3, "float16",
                                  out_dtype="float32", threads=128), PER_OP, "checked"),
           "read_tile": (_nt(256, 256, 160, read_tile=True), PER_OP, "checked"),
           "seed_per_op": (gemm.matmul(SIZE, SIZE, SIZE, 128, 128, 32, 3, "float16",
                                       threads=128), PER_OP, "timed")}
    return out


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, (k, options, role) in kernels().items():
        compiled, seconds = compile_into(out, name, k, TARGET, **options)
        index[name] = {"role": role, "options": options,
                       "threads": compiled.manifest.block[0],
                       "dynamic_smem_bytes": compiled.manifest.dynamic_smem_bytes,
                       "cold_compile_s": round(seconds, 3)}
        print(name, index[name], flush=True)
    (out / "index.json").write_text(json.dumps({
        "command": build_command("merged_ring.py", out), "machine": machine(),
        "target": TARGET, "kernels": index}, indent=1))


def _operands(torch, name):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, dt):
        return torch.randn(*shape, device="cuda", dtype=dt, generator=g)

    if name == "nt_odd":
        a, b = rand(SIZE, ODD_K, dt=torch.bfloat16), rand(SIZE, ODD_K, dt=torch.bfloat16)
        ref = a.float() @ b.float().T
    elif name == "nn_odd":
        a, b = rand(SIZE, ODD_K, dt=torch.float16), rand(ODD_K, SIZE, dt=torch.float16)
        ref = a.float() @ b.float()
    elif name == "read_tile":
        a, b = rand(256, 160, dt=torch.bfloat16), rand(256, 160, dt=torch.bfloat16)
        # acc is read-modified after every K tile: each step adds A[:, 32 k + j % 32]
        cols = torch.arange(256, device="cuda") % 32
        extra = sum(a.float()[:, 32 * k + cols] for k in range(5))
        ref = a.float() @ b.float().T + extra
    else:
        a, b = rand(SIZE, SIZE, dt=torch.float16), rand(SIZE, SIZE, dt=torch.float16)
        return a, b, torch.empty(SIZE, SIZE, device="cuda", dtype=torch.float16), None
    c = torch.empty(ref.shape, device="cuda", dtype=torch.float32)
    return a, b, c, ref


def smoke(bundle: Path) -> None:
    import torch

    index = json.loads((bundle / "index.json").read_text())
    for name in smoke_order(index["kernels"]):
        a, b, c, _ = _operands(torch, name)
        load_kernel(bundle, name)(a, b, c)
        torch.cuda.synchronize()
        print(f"smoke {name}: ran", flush=True)


def run(bundle: Path, out: Path) -> None:
    import torch
    from triton.testing import do_bench

    hung = smoke_in_child(__file__, bundle, 300, stall_s=20)
    index = json.loads((bundle / "index.json").read_text())
    checked = {}
    for name, entry in index["kernels"].items():
        if entry["role"] != "checked" or name in hung:
            continue
        a, b, c, ref = _operands(torch, name)
        c.fill_(float("nan"))
        load_kernel(bundle, name)(a, b, c)
        torch.cuda.synchronize()
        checked[name] = {"rel_err": float((c - ref).norm() / ref.norm())}
        print(name, checked[name], flush=True)
    a, b, c, _ = _operands(torch, "seed")
    ref = torch.matmul(a, b)
    calls, errs = {"cublas": lambda: torch.matmul(a, b)}, {}
    for name, entry in index["kernels"].items():
        if entry["role"] != "timed" or name in hung:
            continue
        k = load_kernel(bundle, name)
        c.fill_(float("nan"))
        k(a, b, c)
        torch.cuda.synchronize()
        errs[name] = float((c.float() - ref.float()).norm() / ref.float().norm())
        calls[name] = lambda k=k: k(a, b, c)
    flop = 2 * SIZE ** 3
    tflops = {n: flop / v / 1e9 for n, v in rotated_medians(calls, ROUNDS, do_bench).items()}
    timed = {"dtype": "float16", "M": SIZE, "N": SIZE, "K": SIZE, "rel_err_vs_cublas": errs,
             "tflops": tflops,
             "ratio_to_cublas": {n: tflops[n] / tflops["cublas"] for n in errs}}
    print(json.dumps(timed), flush=True)
    write_results(out, "merged_ring.py", bundle, index, checked=checked, seed_gemm=timed,
                  hung=hung)


if __name__ == "__main__":
    main(build, run, smoke, str(ROOT / ".gpu" / "merged_ring"))
