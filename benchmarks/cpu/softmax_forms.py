"""Where a three-pass row softmax's time goes on this machine: softmax_forms.c (AVX2 + FMA
intrinsics, no tiled code) times, over X [4096, 4096] float32 on 2 threads in interleaved
rounds, a plain and a non-temporal copy and eight softmax forms (where the exponentials are
kept, how the normalized row is stored, which exp2, blocks of 4 rows and their skewed
pipeline; the C file's comment says each; the blocked forms are checked equal to nt_ftz). This
script compiles it with the C compiler (`cc`, -O3 -mavx2 -mfma), runs it and writes the JSON.
An x86-64 host with AVX2.

    python benchmarks/cpu/softmax_forms.py [--out benchmarks/results/cpu_softmax_forms.json]

GB/s count the bytes a copy of X moves (read X, write Y: 128 MiB)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import run_c_program, start, write_result

HERE = Path(__file__).resolve().parent
BYTES = 2 * 4096 * 4096 * 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(HERE.parents[0] / "results" / "cpu_softmax_forms.json"))
    args = p.parse_args()
    head = start(sys.argv)
    rows = run_c_program(HERE / "softmax_forms.c", ["-mavx2", "-mfma"])
    for r in rows:
        r["best_GB/s"] = round(BYTES / (r["best_ms"] * 1e-3) / 1e9, 1)
        print(f"{r['variant']:12s} best {r['best_ms']:7.3f} ms {r['best_GB/s']:6.1f} GB/s   "
              f"median {r['median_ms']:7.3f} ms   of copy (median of rounds) "
              f"{r['of_copy_median_of_rounds']:.3f}")
    write_result(Path(args.out), head, {"threads": 2, "rows": 4096, "cols": 4096,
                                        "results": rows})


if __name__ == "__main__":
    main()
