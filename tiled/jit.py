"""`tiled.jit`: TileLang's calling convention. A kernel whose output tensors it allocates:

    @tiled.jit(out_idx=[-1])
    def matmul(M, N, K, block_M=128, block_N=128, block_K=32):
        @T.prim_func
        def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                 C: T.Tensor((M, N), "float32")):
            ...
        return gemm

    kernel = matmul(1024, 1024, 1024)   # the factory's result, cached per argument tuple
    c = kernel(a, b)                   # C allocated like the inputs (torch or numpy), returned

`out_idx` lists the parameters (negative counts from the end) the kernel writes and the call
allocates: their shapes come from the kernel's signature, symbolic dims bound from the
inputs. The target follows the inputs (CUDA tensors: the local GPU; else `cpu`) unless given.
Compiles go through `tiled.compile`: the daemon when TILED_SERVER is set, else this process
with the kernel cache. Thin side: importing this module loads neither TVM nor torch.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

from tiled.errors import LaunchError
from tiled.pass_configs import check_pass_configs
from tiled.runtime.cpu_levels import is_cpu_target
from tiled.sequence import programs_of


class JitKernel:
    """A kernel called TileLang-style: `outputs = kernel(*inputs)`. Thread-safe; each target
    compiles once per JitKernel."""

    def __init__(self, kernel, out_idx: Sequence[int] | int | None = None,
                 target: str = "auto", pass_configs=None, **options):
        if not _is_kernel(kernel):
            raise TypeError(f"tiled.jit needs a @tiled.kernel / @T.prim_func, got "
                            f"{type(kernel).__name__}")
        check_pass_configs(pass_configs)  # TileLang's pass switches: checked, dropped
        self.kernel, self.target, self.options = kernel, target, options
        self.programs = programs_of(kernel)
        self.params = self.programs[0].proto.params  # every launch takes them all
        n = len(self.params)
        idx = [out_idx] if isinstance(out_idx, int) else list(out_idx or [])
        for i in idx:
            if not -n <= i < n:
                raise ValueError(f"out_idx {i} is out of range for {kernel.name}'s {n} "
                                 "parameters")
        self.out_idx = sorted({i % n for i in idx})
        for i in self.out_idx:
            if self.params[i].WhichOneof("kind") != "buffer":
                raise ValueError(f"out_idx {i}: parameter "
                                 f"{self.params[i].name} is a scalar, not a tensor")
        self._compiled: dict[str, object] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<tiled.jit {self.kernel.name} out_idx={self.out_idx}>"

    def compiled(self, target: str):
        """The CompiledKernel (or RemoteKernel) for `target`, compiled on first use."""
        with self._lock:
            k = self._compiled.get(target)
        if k is None:
            import tiled

            k = tiled.compile(self.kernel, target=target, **self.options)
            with self._lock:
                k = self._compiled.setdefault(target, k)
        return k

    def use(self, target: str, compiled) -> JitKernel:
        """Calls for `target` launch `compiled` (a kernel loaded by tiled.runtime.load from a
        bundle, say, on a host without the compiler); returns self."""
        got = [k.manifest.program_digest for k in getattr(compiled, "kernels", [compiled])]
        if got != [p.digest for p in self.programs]:
            raise LaunchError(f"{self.kernel.name}: the compiled kernel is of another program "
                              f"({compiled.manifest.name})")
        with self._lock:
            self._compiled[target] = compiled
        return self

    def get_kernel_source(self, target: str = "cpu") -> str | None:
        """The generated source (a compile in this process keeps it; a cache hit does not)."""
        return getattr(self.compiled(target), "source", None)

    def __call__(self, *inputs):
        params = self.params
        n_in = len(params) - len(self.out_idx)
        if len(inputs) != n_in:
            names = [p.name for i, p in enumerate(params) if i not in self.out_idx]
            raise LaunchError(f"{self.kernel.name}: expected {n_in} inputs ({', '.join(names)}; "
                              f"the outputs {[params[i].name for i in self.out_idx]} are "
                              f"allocated), got {len(inputs)}")
        target = self._target(inputs)
        k = self.compiled(target)
        manifest = k.manifest
        args: list[object] = []
        it = iter(inputs)
        for i in range(len(params)):
            args.append(None if i in self.out_idx else next(it))
        dims = _bind_dims(manifest, args)
        like = next((a for a in inputs if _is_tensor(a)), None)
        outputs = []
        for i in self.out_idx:
            p = manifest.params[i]
            shape = []
            for d in p.shape:
                if isinstance(d, str) and d not in dims:
                    raise LaunchError(f"{self.kernel.name}: output {p.name}'s dim {d} is not "
                                      "the dim of any input; pass the output as an input "
                                      "instead (leave it out of out_idx)")
                shape.append(dims[d] if isinstance(d, str) else d)
            out = _empty(tuple(shape), p.dtype, like, target)
            args[i] = out
            outputs.append(out)
        k(*args)
        return outputs[0] if len(outputs) == 1 else outputs

    def _target(self, inputs) -> str:
        if self.target != "auto":
            return self.target
        for a in inputs:
            if getattr(a, "is_cuda", False) or hasattr(a, "__cuda_array_interface__"):
                return _local_cuda_target(a)
            if getattr(getattr(a, "device", None), "type", None) == "mps":
                return _local_metal_target()
        return "cpu"


def _is_kernel(obj) -> bool:
    """Whether `obj` is a traced kernel (it has `.ir`), without reading `.ir`: that traces,
    and raises for a kernel of several launches."""
    return hasattr(type(obj), "ir") or "ir" in getattr(obj, "__dict__", {})


def _is_tensor(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype")


def _bind_dims(manifest, args) -> dict[str, int]:
    """Symbolic dim -> value from the inputs' shapes (the runtime checks them again)."""
    dims: dict[str, int] = {}
    for p, a in zip(manifest.params, args, strict=True):
        if a is None or p.kind != "tensor" or not _is_tensor(a):
            continue
        shape = tuple(int(s) for s in a.shape)
        if len(shape) != len(p.shape):
            raise LaunchError(f"{manifest.name}: {p.name} has {len(shape)} dims, the kernel "
                              f"takes {len(p.shape)} ({list(p.shape)})")
        for d, s in zip(p.shape, shape, strict=True):
            if isinstance(d, str):
                dims.setdefault(d, s)
    return dims


def _empty(shape, dtype: str, like, target: str):
    """An uninitialized tensor: torch on `like`'s device when the inputs are torch, else
    numpy (cpu)."""
    if like is not None and type(like).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=_torch_dtype(torch, dtype), device=like.device)
    if not is_cpu_target(target):
        raise LaunchError(f"allocating an output for {target} needs torch tensors as inputs")
    import numpy as np

    return np.empty(shape, dtype=_numpy_dtype(np, dtype))


def _torch_dtype(torch, name: str):
    special = {"float8_e4m3": "float8_e4m3fn", "bool": "bool"}
    return getattr(torch, special.get(name, name))


def _numpy_dtype(np, name: str):
    if name == "bfloat16" or name.startswith("float8"):
        import ml_dtypes

        return getattr(ml_dtypes, {"float8_e4m3": "float8_e4m3fn"}.get(name, name))
    return np.dtype(name)


def _local_metal_target() -> str:
    """metal:appleN of this Mac's GPU (torch MPS tensors); `local` when a daemon compiles."""
    from tiled import config

    if config.get("server"):
        return "local"
    from tiled.runtime.metal import local_arch

    arch = local_arch()
    return f"metal:{arch}" if arch is not None else "metal"


def _local_cuda_target(tensor) -> str:
    """cuda:sm_XY(a) of the tensor's device (rocm:gfxNNN under ROCm torch, whose "cuda"
    devices are AMD GPUs); `local` when a daemon compiles (its GPU)."""
    from tiled import config

    if config.get("server"):
        return "local"
    import torch

    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(tensor.device).gcnArchName
        return f"rocm:{arch.split(':')[0]}"
    major, minor = torch.cuda.get_device_capability(tensor.device)
    return f"cuda:sm_{major}{minor}{'a' if major == 9 else ''}"


def jit(fn=None, *, out_idx: Sequence[int] | int | None = None, target: str = "auto",
        pass_configs=None, **options):
    """Wraps a kernel (or a factory returning one) for TileLang-style calls that allocate and
    return the outputs named by `out_idx`. `options` are compile options; TileLang's
    `pass_configs` are checked and dropped (tiled.pass_configs).

    >>> @tiled.jit(out_idx=[-1])
    ... def add(n):
    ...     @T.prim_func
    ...     def vadd(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"),
    ...              C: T.Tensor((n,), "float32")):
    ...         with T.Kernel(T.ceildiv(n, 256), threads=256) as bx:
    ...             for i in T.Parallel(256):
    ...                 C[bx * 256 + i] = A[bx * 256 + i] + B[bx * 256 + i]
    ...     return vadd
    >>> c = add(1000)(a, b)
    """
    def wrap(f):
        if _is_kernel(f):
            return JitKernel(f, out_idx, target, pass_configs, **options)
        if not callable(f):
            raise TypeError("tiled.jit decorates a kernel or a function returning one")

        @functools.cache
        def build(*args, **kwargs):
            return JitKernel(f(*args, **kwargs), out_idx, target, pass_configs, **options)

        @functools.wraps(f)
        def factory(*args, **kwargs):
            try:
                return build(*args, **kwargs)
            except TypeError as e:  # unhashable arguments: not cached
                if "unhashable" not in str(e):
                    raise
                return JitKernel(f(*args, **kwargs), out_idx, target, pass_configs, **options)
        return factory

    return wrap(fn) if fn is not None else wrap
