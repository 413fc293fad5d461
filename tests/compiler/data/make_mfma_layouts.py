"""Regenerates mfma_layouts.json from AMD's matrix instruction calculator (not run by the tests;
the JSON is the recorded data). Usage, with a checkout of
https://github.com/ROCm/amd_matrix_instruction_calculator and `pip install tabulate`:

    python tests/compiler/data/make_mfma_layouts.py CALCULATOR_DIR [COMMIT] \
        > tests/compiler/data/mfma_layouts.json

(COMMIT: the calculator's commit, when CALCULATOR_DIR is an export without git metadata.)

For every MFMA instruction the ROCm backend issues it runs
`matrix_calculator.py -a ARCH -i INSTR --matrix-layout -A|-B|-D --csv` and records, per lane and
per register slot (in the order the calculator prints the register columns, lowest bits
first), the [row, column] of the matrix element held there."""

import json
import re
import subprocess
import sys
from pathlib import Path

INSTRUCTIONS = {
    "cdna2": ["v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k", "v_mfma_f32_16x16x4f32",
              "v_mfma_i32_16x16x16i8"],
    "cdna3": ["v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x4_f32",
              "v_mfma_i32_16x16x32_i8", "v_mfma_f32_16x16x32_fp8_fp8",
              "v_mfma_f32_16x16x32_bf8_bf8"],
}
ENTRY = re.compile(r"([ABD])\[(\d+)\]\[(\d+)\]")


def layout(calc: Path, arch: str, instr: str, matrix: str) -> list:
    out = subprocess.run([sys.executable, str(calc / "matrix_calculator.py"), "-a", arch, "-i",
                          instr, "--matrix-layout", f"-{matrix}", "--csv"],
                         capture_output=True, text=True, check=True).stdout
    lanes = {}
    for line in out.splitlines():
        cells = line.split(",")
        if not cells[0].isdigit():
            continue
        lanes[int(cells[0])] = [[int(m.group(2)), int(m.group(3))]
                                for m in map(ENTRY.fullmatch, cells[1:])]
    assert sorted(lanes) == list(range(64)), (arch, instr, matrix)
    return [lanes[i] for i in range(64)]


def main(calc: str, commit: str = "") -> None:
    calc_dir = Path(calc)
    commit = commit or subprocess.run(["git", "-C", calc, "rev-parse", "HEAD"],
                                      capture_output=True, text=True).stdout.strip()
    data = {"source": "AMD matrix instruction calculator "
                      "(github.com/ROCm/amd_matrix_instruction_calculator) " + commit,
            "format": "instructions[arch:instr][A|B|D][lane][slot] = [row, col]",
            "instructions": {}}
    for arch, names in INSTRUCTIONS.items():
        for instr in names:
            data["instructions"][f"{arch}:{instr}"] = {
                m: layout(calc_dir, arch, instr, m) for m in "ABD"}
    json.dump(data, sys.stdout, separators=(",", ":"))
    print()


if __name__ == "__main__":
    main(*sys.argv[1:3])
