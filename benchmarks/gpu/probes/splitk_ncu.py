"""Driver for the ncu probe of results/splitk_ncu_h200.txt (run under ncu; the command is
there): the split-K swap 64x64, 4 splits, at M = 64, N = K = 4096, bf16, launched three times
as two kernels (the GEMM into float32 partials, then splitk_sum) and as one that sums in its
last split per tile. The kernels come prebuilt in .gpu/prof2 (two.*, sum.*, fix.*; "fix" from
the code of results/linear_h200_issue12_last_split_sums.diff)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch
    from bundle_cli import load_kernel

    b = Path(".gpu/prof2")
    two, total, fix = (load_kernel(b, n) for n in ("two", "sum", "fix"))
    M, N, K = 64, 4096, 4096
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    p = torch.empty(4, M, N, device="cuda", dtype=torch.float32)
    c = torch.zeros(4096, device="cuda", dtype=torch.int32)
    for _ in range(3):
        two(x, w, p)
        total(p, y)
        fix(x, w, y, p, c)
    torch.cuda.synchronize()
    ref = torch.nn.functional.linear(x, w).float()
    print("rel err", float((y.float() - ref).norm() / ref.norm()), "counters", int(c.abs().sum()))


if __name__ == "__main__":
    main()
