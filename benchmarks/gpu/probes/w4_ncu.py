"""Driver for results/w4_regs_ncu_h100.txt (run under ncu; the command is there): the w4a16
swapped-tile and regs_g kernels of probes/w4_regs_probe.py's bundle at K x N = 8192 x 28672,
16 tokens, each launched three times (their split-K partials left unsummed: ncu times the
GEMM kernel alone)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

NAMES = ("8192x28672_swap_m16_n128_t128_s4", "8192x28672_regs_g_m16_n128_t128_s8",
         "8192x28672_regs_m16_n128_t128_s1")


def main() -> None:
    import torch
    from bundle_cli import load_kernel

    b = Path(sys.argv[1])
    K, N, M = 8192, 28672, 16
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randint(-2**31, 2**31 - 1, (K // 8, N), device="cuda", dtype=torch.int32)
    s = torch.rand(K // 128, N, device="cuda").half()
    z = s.new_empty(1)
    for name in NAMES:
        splits = int(name.rsplit("_s", 1)[1])
        y = torch.empty(*((splits,) if splits > 1 else ()), M, N, device="cuda",
                        dtype=torch.float32 if splits > 1 else torch.float16)
        kern = load_kernel(b, name)
        for _ in range(3):
            kern(x, w, s, z, y)
        torch.cuda.synchronize()
        print(name, "ran", flush=True)


if __name__ == "__main__":
    main()
