"""`@T.prim_func` (TileLang's kernel decorator) and `@T.macro` (a helper traced inline).

A macro's body is rewritten like a kernel's (traced `if`s, the author's names, T.alloc_var
stores) and runs where it is called, recording its statements into the caller's trace. It
takes buffers, traced values and Python constants, may call other macros, and returns what
it returns. Parameters annotated T.SharedBuffer / T.FragmentBuffer / T.LocalBuffer check
that the tile passed lives in that memory.
"""

from __future__ import annotations

import functools
import inspect

from tiled.lang.annotations import TileBuffer
from tiled.lang.builder import active, definition_error
from tiled.lang.kernel import KernelFunction, annotations_of, kernel
from tiled.lang.rewrite import rewrite_function


def prim_func(fn=None, *, private: bool = False):
    """TileLang's name for `@tiled.kernel`; usable bare or with TileLang's `private=` flag,
    at module level or inside a factory that closes over the block sizes.

    >>> def matmul(M, N, K, block_M=128, block_N=128, block_K=32, dtype=T.float16):
    ...     @T.prim_func
    ...     def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
    ...              C: T.Tensor((M, N), dtype)):
    ...         with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M)) as (bx, by):
    ...             ...
    ...     return main
    """
    del private  # every tiled kernel is one entry point
    if fn is None:
        return kernel
    return kernel(fn)


class Macro:
    """What `@T.macro` returns: call it inside a kernel (or another macro) while it is
    traced.

    >>> rescale(acc_o, scores_scale)   # inside a kernel: its statements are traced here
    """

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError("@T.macro decorates a function")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self._signature = inspect.signature(fn)

    def __repr__(self):
        return f"<T.macro {self.name}>"

    def __call__(self, *args, **kwargs):
        if active() is None:
            raise definition_error(f"macro {self.name} can only be called inside a kernel "
                                   "(or another macro) while it is traced")
        self._check(args, kwargs)
        return rewrite_function(self.fn)(*args, **kwargs)

    def _check(self, args, kwargs) -> None:
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise definition_error(f"macro {self.name}: {e}") from None
        hints = annotations_of(self.fn)
        for param, value in bound.arguments.items():
            ann = hints.get(param)
            if isinstance(ann, TileBuffer):
                ann.check(param, self.name, value)


def macro(fn=None, *, hygienic: bool = True):
    """A helper traced inline where it is called, with the kernel's `if` rewrite and names.

    >>> @T.macro
    ... def rescale(acc: T.FragmentBuffer([64, 64], T.float32), scale):
    ...     for i, j in T.Parallel(64, 64):
    ...         acc[i, j] *= scale[i]
    """
    del hygienic  # a macro's names are its own (the rewrite names what it allocates)
    return Macro if fn is None else Macro(fn)


__all__ = ["KernelFunction", "Macro", "macro", "prim_func"]
