"""A conformance case run under a backend's CPU emulation (rocm, metal): compiled for the
target, launched by tiled.jit on numpy arrays through CompiledKernel.emulate, and paired with
its numpy reference."""

import numpy as np

from tests.conformance.cases import np_dtype
from tiled.compiler import compile_program


class Emulated:
    """A compiled kernel that tiled.jit launches on numpy arrays by emulating it."""

    def __init__(self, compiled):
        self.compiled, self.manifest = compiled, compiled.manifest
        self.kernels = getattr(compiled, "kernels", [compiled])  # a CompiledSequence's launches

    def __call__(self, *args):
        self.compiled.emulate(*args)


def run_emulated(case, shape: dict, target: str):
    """(the compiled kernel, [(output, reference) as float64 arrays]) of conformance `case` at
    `shape`, compiled for `target` and run under its emulation."""
    jk = case.factory(**shape)
    compiled = compile_program(jk.kernel, target)
    jk.use("cpu", Emulated(compiled))  # numpy inputs pick the "cpu" entry
    rng = np.random.default_rng(0)
    raw = case.inputs(rng, shape)
    args = [a.astype(np_dtype(dt)) if isinstance(a, np.ndarray) else a for a, dt in raw]
    outs = case.call(jk, args, shape) if case.call else jk(*args)
    outs = outs if isinstance(outs, list | tuple) else [outs]
    rounded = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
    refs = case.reference(rounded, shape)
    refs = refs if isinstance(refs, list | tuple) else [refs]
    return compiled, [(np.asarray(o).astype(np.float64), np.asarray(r, np.float64))
                      for o, r in zip(outs, refs, strict=True)]
