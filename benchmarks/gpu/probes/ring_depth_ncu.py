"""Driver for the ncu probe of results/ring_depth_ncu_h100.txt (run under ncu; the command is
there): why a deeper ring is slower. The seed's GEMM (bf16 4096^3, two consumer warpgroups
taking blocks in turn) from the alternate probe's bundle (probes/alternate_probe.py build
--out .gpu/alternate), with its ring at 4 stages (the default) and at 5 and 6
(alternate_probe_rings_h100.json: 0.889x, 0.755x, 0.799x cuBLAS), each launched twice."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main() -> None:
    import torch
    from bundle_cli import load_kernel

    b = Path(".gpu/alternate")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ref = torch.matmul(a, w).float()
    for form in ("alternate", "alternate_ring5", "alternate_ring6"):
        k = load_kernel(b, f"seed_bf16__{form}")
        c = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            k(a, w, c)
        torch.cuda.synchronize()
        print(form, "rel err", float((c.float() - ref).norm() / ref.norm()), flush=True)


if __name__ == "__main__":
    main()
