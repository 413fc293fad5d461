"""The conformance suite's registry: kernels written the way TileLang's examples write them
(`tiled.jit(out_idx=...)` over a factory of a `@T.prim_func`, slices, fragments, macros),
each with its inputs, a numpy reference, small `cpu` shapes for CI and H200 shapes for
benchmarks/gpu/conformance.py, and the TileLang idioms it exercises (IDIOMS: the list of
issue 11; tests/conformance/test_conformance.py checks every one is used)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

IDIOMS = {
    "slice": "slices with a constant extent the arithmetic proves (`x * b:(x + 1) * b`)",
    "full_slice": "full-dimension `:` slices",
    "prim_func": "`@T.prim_func` inside a factory",
    "macro": "`@T.macro` helpers traced inline",
    "annotations": "T.Tensor / T.Buffer / T.SharedBuffer / T.FragmentBuffer, list shapes",
    "fp8": "T.float8_e4m3 / T.float8_e5m2 dtypes",
    "jit": "`tiled.jit(out_idx=[...])`: outputs allocated and returned",
    "copy_g2s": "T.copy global -> shared",
    "copy_g2f": "T.copy global -> fragment",
    "copy_s2f": "T.copy shared <-> fragment",
    "copy_f2g": "T.copy fragment -> global",
    "copy_s2g": "T.copy shared -> global",
    "copy_f2f_cast": "T.copy fragment -> fragment with a dtype cast",
    "gemm_ss": "T.gemm with A and B in shared memory",
    "gemm_rs": "T.gemm with A in a fragment (registers)",
    "gemm_policy": "T.gemm(policy=T.GemmWarpPolicy.*)",
    "clear_accum": "T.gemm(clear_accum=True)",
    "k_pack": "T.gemm(k_pack=...) accepted",
    "transpose": "T.gemm(transpose_B=True)",
    "use_swizzle": "T.use_swizzle(panel_size)",
    "annotate_layout": "T.annotate_layout({...}) with T.Layout / T.Fragment",
    "reduce": "T.reduce_max / reduce_sum",
    "reduce_absmax": "T.reduce_absmax",
    "cumsum": "T.cumsum",
    "atomic_add": "T.atomic_add",
    "atomic_max_min": "T.atomic_max / T.atomic_min",
    "alloc_var": "T.alloc_var",
    "vectorized": "T.vectorized",
    "coalesced_width": "T.Parallel(..., coalesced_width=)",
    "inplace": "in-place += -= *= /= on buffer elements",
    "infinity": "T.infinity",
    "max_min_value": "T.max_value / T.min_value",
    "pipelined": "T.Pipelined(n, num_stages=)",
    "parallel": "T.Parallel nests",
    "if": "a Python `if` on traced values",
    "symbolic": "T.dyn symbolic dims",
    "launches": "several `with T.Kernel` blocks in one `@T.prim_func`, launched in order",
    "im2col": "T.c2d_im2col / T.im2col: a convolution's operand tile from an NHWC image",
}


@dataclass(frozen=True)
class Case:
    """One conformance kernel. `factory(**shape)` returns a tiled.jit kernel (JitKernel);
    `run(inputs, shape)` calls it; `inputs(rng,
    shape)` gives [(float32 / int array, the dtype it is passed as)]; `reference(inputs,
    shape)` computes the outputs in float64 from the inputs as rounded to their dtypes;
    `tol`: the largest relative (Frobenius) error per output. `work(shape)`: ("flop", n) or
    ("bytes", n) for the speed column; `torch_op(torch, inputs, shape)`: the zero-argument call
    of the torch op a user would otherwise write (timed beside the kernel)."""

    name: str
    family: str
    idioms: tuple[str, ...]
    factory: Callable[..., object]
    inputs: Callable[[np.random.Generator, dict], list[tuple[np.ndarray, str]]]
    reference: Callable[[list[np.ndarray], dict], object]
    cpu: dict
    gpu: dict
    tol: float = 1e-5
    work: Callable[[dict], tuple[str, float]] | None = None
    torch_op: Callable | None = None
    # How the kernel is called: (jit kernel, inputs, shape) -> outputs; default kernel(*inputs).
    # (Split-K accumulates into a zeroed output, which out_idx does not allocate.)
    call: Callable | None = None
    notes: str = field(default="", compare=False)

    def run(self, inputs: list, shape: dict):
        """The outputs of the kernel on `inputs` (numpy or torch)."""
        kernel = self.factory(**shape)
        return self.call(kernel, inputs, shape) if self.call else kernel(*inputs)


CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    if case.name in CASES:
        raise ValueError(f"conformance case {case.name} is registered twice")
    unknown = set(case.idioms) - set(IDIOMS)
    if unknown:
        raise ValueError(f"{case.name}: unknown idioms {sorted(unknown)}")
    CASES[case.name] = case
    return case


def np_dtype(name: str):
    """The numpy dtype a kernel's `name` dtype is passed as (ml_dtypes for bf16 / fp8)."""
    if name == "bfloat16" or name.startswith("float8"):
        import ml_dtypes

        return getattr(ml_dtypes, {"float8_e4m3": "float8_e4m3fn"}.get(name, name))
    return np.dtype(name)


def load_all() -> dict[str, Case]:
    """Imports every family module (each registers its cases); returns CASES."""
    import importlib
    import pkgutil

    import tests.conformance as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.startswith("k_"):
            importlib.import_module(f"tests.conformance.{m.name}")
    return CASES


def zeros_like_inputs(inputs: list, shape: tuple, dtype: str):
    """A zeroed output on the inputs' side: torch (their device) or numpy."""
    first = inputs[0]
    if type(first).__module__.startswith("torch"):
        import torch

        return torch.zeros(shape, dtype=getattr(torch, dtype), device=first.device)
    return np.zeros(shape, np_dtype(dtype))
