"""Every conformance kernel on `cpu` against its numpy reference (small shapes, ragged where
the family has tails), every TileLang idiom of the list exercised, and the README's table in
step with the registry."""

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.cases import IDIOMS, load_all, np_dtype

CASES = load_all()
README = Path(__file__).with_name("README.md")


def run_cpu(case):
    rng = np.random.default_rng(0)
    raw = case.inputs(rng, case.cpu)
    args = [a.astype(np_dtype(dt)) if isinstance(a, np.ndarray) else a for a, dt in raw]
    outs = case.run(args, case.cpu)
    outs = outs if isinstance(outs, list | tuple) else [outs]
    rounded = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
    refs = case.reference(rounded, case.cpu)
    refs = refs if isinstance(refs, list | tuple) else [refs]
    assert len(outs) == len(refs)
    return [(np.asarray(o).astype(np.float64), np.asarray(r, np.float64))
            for o, r in zip(outs, refs, strict=True)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_on_cpu(name):
    case = CASES[name]
    for i, (out, ref) in enumerate(run_cpu(case)):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        assert np.isfinite(out).all(), f"output {i} has non-finite values"
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= case.tol, f"output {i}: relative error {err:.2e} > {case.tol:.0e}"


def test_every_idiom_is_exercised():
    used = {i for c in CASES.values() for i in c.idioms}
    assert used == set(IDIOMS), f"not exercised: {sorted(set(IDIOMS) - used)}"
    assert len(CASES) >= 20


def test_the_readme_table_lists_every_kernel():
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", README.read_text(), re.M)
    assert sorted(rows) == sorted(CASES), "tests/conformance/README.md's table is out of date"
