"""The CI suite's wall time on the cpu backend, before and after: the test files that compile
and run CPU kernels, as they stood at a base commit, run with the base's own code and with this
checkout's code (`PYTHONPATH` picks which `tiled` they import; the tests, their conftest and
their kernels are the base's in both), each a fresh pytest process with fresh cache
directories (the suite's conftest gives every test one, as in CI), the two alternating round
after round. Issue 19 asks that the CPU backend's speed work (host levels, vectorization,
clang passes, the GEMM microkernel) not make the CI suite slower: its compiles got longer,
its kernels faster.

Both runs take the base's test files from a worktree of the base; the head run's worktree has
its `tiled/` replaced by a link to this checkout's and its tests/conftest.py by this
checkout's (the conftest is the suite's infrastructure: since the CPU shim grew a GEMM
microkernel it shares the shim's objects across a session's tests). A run records which
`tiled` it imported and stops if that is not the one it asked for: `python -m pytest` puts
the working directory first on sys.path, so a PYTHONPATH alone does not pick the code (the
first version of this script relied on it and timed the base's code twice).

    python benchmarks/cpu/suite_time.py [--base 7a3668d^] [--rounds 2] [--conftest head|base]
        [--out benchmarks/results/cpu_suite_time.json]

The default base is the parent of the commit that brought the CPU backend's speed work in
(7a3668d, "the CPU backend at speed"): its cpu backend built for a generic x86-64 with
scalar T.gemm loops. Needs git and this checkout's .venv (tiled's compiler installed).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
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


def _head_tree(base_tree: Path, where: Path, conftest: str) -> Path:
    """A second worktree of the base whose `tiled` is this checkout's (a link) and whose
    tests/conftest.py is this checkout's (a copy) when `conftest` is "head"."""
    tree = where / "head"
    _git("worktree", "add", "--detach", str(tree), _git("-C", str(base_tree), "rev-parse",
                                                         "HEAD"))
    shutil.rmtree(tree / "tiled")
    (tree / "tiled").symlink_to(ROOT / "tiled", target_is_directory=True)
    if conftest == "head":
        shutil.copy(ROOT / "tests" / "conftest.py", tree / "tests" / "conftest.py")
    return tree


def run_suite(tree: Path, code: Path, files: list[str]) -> dict:
    """One pytest process over `files` of `tree`, which must import tiled from `code`."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home())}
    imported = subprocess.run([sys.executable, "-c", "import tiled; print(tiled.__file__)"],
                              cwd=tree, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    if Path(imported).resolve().parent != (code / "tiled").resolve():
        raise SystemExit(f"{tree} imports tiled from {imported}, not from {code}")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not gpu", *files], cwd=tree, env=env, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in _SUMMARY.findall(tail)}
    return {"wall_s": round(wall, 1), "rc": proc.returncode, "counts": counts,
            "summary": tail, "tiled": imported,
            "failed": [ln.split()[1] for ln in proc.stdout.splitlines()
                       if ln.startswith("FAILED ")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="7a3668d^")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conftest", choices=("head", "base"), default="head",
                    help="which tests/conftest.py the head run takes (base: the shim's "
                         "objects are compiled again in every test's fresh cache)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu_suite_time.json")
    args = ap.parse_args()
    base = _git("rev-parse", args.base)
    head = _git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix="tiled-suite-base-") as tmp:
        tree = Path(tmp) / "base"
        _git("worktree", "add", "--detach", str(tree), base)
        trees = {"base": tree}
        try:
            trees["head"] = _head_tree(tree, Path(tmp), args.conftest)
            files = _files(tree)
            runs = {"base": [], "head": []}
            for r in range(args.rounds):
                order = ("base", "head") if r % 2 == 0 else ("head", "base")
                for which in order:
                    res = run_suite(trees[which], tree if which == "base" else ROOT, files)
                    runs[which].append(res)
                    print(f"round {r} {which}: {res['wall_s']} s, {res['summary']}",
                          flush=True)
        finally:
            for t in trees.values():
                _git("worktree", "remove", "--force", str(t))
    walls = {k: [x["wall_s"] for x in v] for k, v in runs.items()}
    result = {
        **header(sys.argv),
        "base": base, "head": head, "head_conftest": args.conftest, "files": files,
        "runs": runs,
        "best_s": {k: min(v) for k, v in walls.items()},
        "head_over_base_best": round(min(walls["head"]) / min(walls["base"]), 3),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"base {min(walls['base'])} s, head {min(walls['head'])} s (best of "
          f"{args.rounds}): head / base {result['head_over_base_best']}; {args.out}")


if __name__ == "__main__":
    main()
