"""Why a two-pass row op reads well under a copy's bandwidth on this machine: store_kinds.c
(AVX-512 intrinsics, no tiled code) times, over X [4096, 4096] float32 on 2 threads in
interleaved rounds, a copy and RMSNorm with plain and with non-temporal (streaming) stores,
beside reading X alone and writing Y alone; this script compiles it with the C compiler
(`cc`, -O3 -march=x86-64-v4), runs it and writes the JSON. An x86-64 host with AVX-512.

    python benchmarks/cpu/store_kinds.py [--out benchmarks/results/cpu_store_kinds.json]

GB/s count the bytes a copy of X moves (read X, write Y: 128 MiB) for every variant except
read_only and write_only_nt (64 MiB each)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import run_c_program, start, write_result

HERE = Path(__file__).resolve().parent
BYTES = 4096 * 4096 * 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(HERE.parents[0] / "results" / "cpu_store_kinds.json"))
    args = p.parse_args()
    head = start(sys.argv)
    rows = run_c_program(HERE / "store_kinds.c", ["-march=x86-64-v4"])
    for r in rows:
        nbytes = BYTES if r["variant"] in ("read_only", "write_only_nt") else 2 * BYTES
        r["best_GB/s"] = round(nbytes / (r["best_ms"] * 1e-3) / 1e9, 1)
        r["median_GB/s"] = round(nbytes / (r["median_ms"] * 1e-3) / 1e9, 1)
        print(f"{r['variant']:24s} best {r['best_ms']:7.3f} ms {r['best_GB/s']:6.1f} GB/s   "
              f"median {r['median_ms']:7.3f} ms {r['median_GB/s']:6.1f} GB/s")
    write_result(Path(args.out), head, {"threads": 2, "rows": 4096, "cols": 4096,
                                        "results": rows})


if __name__ == "__main__":
    main()
