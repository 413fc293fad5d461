"""The CI suite's wall time on the cpu backend, before and after: the test files that compile
and run CPU kernels, as they stood at a base commit, run with the base's own code and with this
checkout's code (`PYTHONPATH` picks which `tiled` they import; the tests, their conftest and
their kernels are the base's in both), each a fresh pytest process with fresh cache
directories (the suite's conftest gives every test one, as in CI), the two alternating round
after round. Issue 19 asks that the CPU backend's speed work (host levels, vectorization,
clang passes, the GEMM microkernel) not make the CI suite slower: its compiles got longer,
its kernels faster.

    python benchmarks/cpu/suite_time.py [--base 7a3668d^] [--rounds 2]
        [--out benchmarks/results/cpu_suite_time.json]

The default base is the parent of the commit that brought the CPU backend's speed work in
(7a3668d, "the CPU backend at speed"): its cpu backend built for a generic x86-64 with
scalar T.gemm loops. Needs git and this checkout's .venv (tiled's compiler installed).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import header  # benchmarks/common.py

ROOT = Path(__file__).resolve().parents[2]
# The test files of the base that compile CPU kernels (the ones that exist there are taken).
SUITE = ("tests/conformance/test_conformance.py", "tests/ops", "tests/compiler/test_cpu*.py",
         "tests/test_jit.py")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|deselected)")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _files(tree: Path) -> list[str]:
    out = []
    for pattern in SUITE:
        out += sorted(str(p.relative_to(tree)) for p in tree.glob(pattern))
    return out


def run_suite(tree: Path, code: Path, files: list[str]) -> dict:
    """One pytest process over `files` of `tree`, importing tiled from `code`."""
    env = {"PYTHONPATH": str(code), "PATH": "/usr/local/bin:/usr/bin:/bin",
           "HOME": str(Path.home())}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not gpu", *files], cwd=tree, env=env, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in _SUMMARY.findall(tail)}
    return {"wall_s": round(wall, 1), "rc": proc.returncode, "counts": counts,
            "summary": tail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="7a3668d^")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_suite_time.json")
    args = ap.parse_args()
    base = _git("rev-parse", args.base)
    head = _git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix="tiled-suite-base-") as tmp:
        tree = Path(tmp) / "base"
        _git("worktree", "add", "--detach", str(tree), base)
        try:
            files = _files(tree)
            runs = {"base": [], "head": []}
            for r in range(args.rounds):
                order = ("base", "head") if r % 2 == 0 else ("head", "base")
                for which in order:
                    res = run_suite(tree, tree if which == "base" else ROOT, files)
                    runs[which].append(res)
                    print(f"round {r} {which}: {res['wall_s']} s, {res['summary']}",
                          flush=True)
        finally:
            _git("worktree", "remove", "--force", str(tree))
    walls = {k: [x["wall_s"] for x in v] for k, v in runs.items()}
    result = {
        **header(sys.argv),
        "base": base, "head": head, "files": files, "runs": runs,
        "best_s": {k: min(v) for k, v in walls.items()},
        "head_over_base_best": round(min(walls["head"]) / min(walls["base"]), 3),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"base {min(walls['base'])} s, head {min(walls['head'])} s (best of "
          f"{args.rounds}): head / base {result['head_over_base_best']}; {args.out}")


if __name__ == "__main__":
    main()
