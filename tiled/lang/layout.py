"""Layout and rasterization hints in TileLang's spelling: `T.annotate_layout`, `T.Layout`,
`T.Fragment`, `T.make_swizzled_layout`, `T.use_swizzle`.

tiled picks every layout itself (shared-memory swizzles, how a fragment spreads over threads)
and the order in which blocks run, from the ops that touch each buffer and the target. These
calls are therefore hints that never change results: tiled checks their arguments, so a typo
fails where it was written, and records nothing in the Tile IR. Layout functions are never
called. One consequence to know: a layout on a *global* tensor (TileLang's backward-pass
`dQ` idiom, which permutes how dQ sits in memory) is dropped too, so tiled keeps that tensor
in its declared row-major order; kernels that pass it between them agree, as they all drop it,
but the host sees row-major bytes where TileLang would leave permuted ones.
"""

from __future__ import annotations

import inspect

from tiled.lang.builder import current, definition_error
from tiled.lang.expr import BufferRef, Dim
from tiled.v1 import tile_ir_pb2 as pb

_ORDERS = ("row", "column", "mlx")  # TileLang's rasterization orders


def _shape(shape, what: str) -> tuple:
    if isinstance(shape, (int, Dim)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not shape:
        raise definition_error(f"{what}: the shape must be a non-empty list of dims, got "
                               f"{shape!r}")
    for d in shape:
        if not isinstance(d, Dim) and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise definition_error(f"{what}: dims must be positive ints or T.dyn dims, got "
                                   f"{shape!r}")
    return tuple(shape)


def _check_fn(fn, n_args: int, what: str) -> None:
    """`fn` must be callable with `n_args` positional arguments (when Python can tell)."""
    if not callable(fn):
        raise definition_error(f"{what} must be a function of the indices, got {fn!r}")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= n_args <= len(positional):
        raise definition_error(f"{what} takes {len(positional)} index argument(s), but the "
                               f"layout has {n_args} (one per dim)")


class Layout:
    """A layout hint: how a tile's indices map to storage, as `forward_fn(*indices) ->
    [storage indices]` (TileLang's T.Layout). Only for T.annotate_layout, which checks it
    against the buffer and drops it (module docstring).

    >>> T.annotate_layout({A_shared: T.Layout((64, 32), lambda i, j: [i, j ^ (i % 8)])})
    """

    buffer: BufferRef | None = None  # the tile a T.make_swizzled_layout was made for

    def __init__(self, shape, forward_fn):
        self.shape = _shape(shape, "T.Layout")
        if forward_fn is not None:  # None only from tiled's own constructors
            _check_fn(forward_fn, len(self.shape), "T.Layout's forward_fn")
        self.forward_fn = forward_fn

    def __repr__(self):
        return f"T.Layout({self.shape})"


class Fragment(Layout):
    """A fragment-layout hint: which thread holds each element of a fragment, and where
    (TileLang's T.Fragment): `forward_fn(*indices[, rep]) -> (thread, index)`, or
    `forward_thread_fn` plus `forward_index_fn`. `replicate` copies per element (a
    replicated fragment; forward_fn / forward_thread_fn then take one more argument).

    >>> frag = T.Fragment((16, 16), forward_thread_fn=lambda i, j: (i % 8) * 4 + j // 4,
    ...                   forward_index_fn=lambda i, j: (i // 8) * 4 + j % 4)
    """

    def __init__(self, shape, forward_fn=None, forward_thread_fn=None, replicate: int = 1,
                 forward_index_fn=None):
        self.shape = _shape(shape, "T.Fragment")
        if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 1:
            raise definition_error(f"T.Fragment: replicate must be a positive int, got "
                                   f"{replicate!r}")
        n, rep = len(self.shape), int(replicate > 1)
        if forward_fn is not None:
            if forward_thread_fn is not None or forward_index_fn is not None:
                raise definition_error("T.Fragment takes forward_fn, or forward_thread_fn with "
                                       "forward_index_fn, not both")
            _check_fn(forward_fn, n + rep, "T.Fragment's forward_fn")
        elif forward_thread_fn is not None:
            _check_fn(forward_thread_fn, n + rep, "T.Fragment's forward_thread_fn")
            if forward_index_fn is not None:
                _check_fn(forward_index_fn, n, "T.Fragment's forward_index_fn")
        else:
            raise definition_error("T.Fragment needs forward_fn, or forward_thread_fn (which "
                                   "thread holds each element)")
        self.forward_fn, self.replicate = forward_fn, replicate

    def __repr__(self):
        return f"T.Fragment({self.shape}, replicate={self.replicate})"


def make_swizzled_layout(buffer, k_major: bool = True, allow_pad: bool = True) -> Layout:
    """A swizzled (bank-conflict-free) layout hint for a shared tile (TileLang's
    `tilelang.layout.make_swizzled_layout`); tiled already swizzles shared tiles where its
    lowering profits, so this only states what tiled does anyway.

    >>> T.annotate_layout({B_shared: T.make_swizzled_layout(B_shared)})
    """
    if not isinstance(buffer, BufferRef) or buffer.scope != pb.SHARED:
        raise definition_error("T.make_swizzled_layout takes a shared tile "
                               f"(T.alloc_shared), got {buffer!r}")
    for name, flag in (("k_major", k_major), ("allow_pad", allow_pad)):
        if not isinstance(flag, bool):
            raise definition_error(f"T.make_swizzled_layout: {name} must be True or False, got "
                                   f"{flag!r}")
    out = Layout(buffer.shape, None)
    out.buffer = buffer
    return out


def _same_shape(a: tuple, b: tuple) -> bool:
    def key(d):
        return ("dim", d.name) if isinstance(d, Dim) else d
    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b, strict=True))


def annotate_layout(layout_map: dict) -> None:
    """Layout hints, {buffer: T.Layout | T.Fragment | function of the indices}, checked and
    dropped (module docstring): a fragment takes a T.Fragment, a T.alloc_local buffer either,
    any other buffer a T.Layout, each of the buffer's shape.

    >>> T.annotate_layout({A_shared: T.make_swizzled_layout(A_shared)})
    """
    b = current()
    if not b.kernel_open:
        raise definition_error("T.annotate_layout goes inside `with T.Kernel(...)`")
    if not isinstance(layout_map, dict):
        raise definition_error(f"T.annotate_layout takes a dict {{buffer: layout}}, got "
                               f"{type(layout_map).__name__}")
    for buf, layout in layout_map.items():
        if not isinstance(buf, BufferRef):
            raise definition_error(f"T.annotate_layout: keys must be whole buffers (a tensor "
                                   f"parameter or an allocation), got {buf!r}")
        if callable(layout) and not isinstance(layout, Layout):
            layout = Layout(buf.shape, layout)
        if not isinstance(layout, Layout):
            raise definition_error(f"T.annotate_layout: the layout of {buf.name} must be a "
                                   f"T.Layout, a T.Fragment or a function, got {layout!r}")
        if buf.scope == pb.FRAGMENT and not isinstance(layout, Fragment):
            raise definition_error(f"T.annotate_layout: {buf.name} is a fragment; its layout "
                                   "must be a T.Fragment (which thread holds each element)")
        if buf.scope not in (pb.FRAGMENT, pb.LOCAL) and isinstance(layout, Fragment):
            # (TileLang's examples give per-thread T.alloc_local buffers a T.Fragment too)
            raise definition_error(f"T.annotate_layout: {buf.name} is not a fragment; a "
                                   "T.Fragment spreads a fragment over threads, use T.Layout")
        source = getattr(layout, "buffer", None)
        if source is not None and source.bid != buf.bid:
            raise definition_error(f"T.annotate_layout: the layout of {buf.name} was made for "
                                   f"{source.name}")
        if not _same_shape(layout.shape, tuple(buf.shape)):
            raise definition_error(f"T.annotate_layout: the layout of {buf.name} has shape "
                                   f"{layout.shape}, but {buf.name} is {tuple(buf.shape)}")


def use_swizzle(panel_size: int, order: str = "row", enable: bool = True) -> None:
    """A block-rasterization hint (TileLang's T.use_swizzle): run blocks in panels of
    `panel_size` rows ("row") or columns ("column", "mlx") for L2 reuse. Checked and dropped:
    tiled picks its own block order, which never changes results.

    >>> with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 128), threads=128) as (bx, by):
    ...     T.use_swizzle(panel_size=10)
    """
    b = current()
    if not b.kernel_open:
        raise definition_error("T.use_swizzle goes inside `with T.Kernel(...)`")
    if isinstance(panel_size, bool) or not isinstance(panel_size, int) or panel_size < 1:
        raise definition_error(f"T.use_swizzle: panel_size must be a positive int, got "
                               f"{panel_size!r}")
    if order not in _ORDERS:
        raise definition_error(f"T.use_swizzle: order must be one of {', '.join(_ORDERS)}, got "
                               f"{order!r}")
    if not isinstance(enable, bool):
        raise definition_error(f"T.use_swizzle: enable must be True or False, got {enable!r}")
