"""The tile DSL, used as `import tiled.lang as T`. Free of TVM."""

from tiled.lang.annotations import (
    Buffer,
    FragmentBuffer,
    LocalBuffer,
    SharedBuffer,
    bfloat16,
    bool_,
    dtype,
    dynamic,
    float8_e4m3,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    symbolic,
    uint8,
    uint16,
    uint32,
    uint64,
)
from tiled.lang.expr import cast
from tiled.lang.hopper import (
    alloc_barrier,
    fence_proxy_async,
    mbarrier_arrive,
    mbarrier_expect_tx,
    mbarrier_wait_parity,
    tma_copy,
    ws,
)
from tiled.lang.im2col import c2d_im2col, im2col
from tiled.lang.kernel import KernelFunction, Scalar, Tensor, dyn, kernel
from tiled.lang.layout import Fragment, Layout, annotate_layout, make_swizzled_layout, use_swizzle
from tiled.lang.localvar import alloc_var
from tiled.lang.loops import (
    Else,
    If,
    Kernel,
    Parallel,
    Pipelined,
    Vectorized,
    serial,
    unroll,
    vectorized,
)
from tiled.lang.macro import Macro, macro, prim_func
from tiled.lang.math import (
    abs,
    all_of,
    any_of,
    ceil,
    ceildiv,
    clamp,
    cos,
    erf,
    exp,
    exp2,
    floor,
    if_then_else,
    infinity,
    log,
    log2,
    max,
    max_value,
    min,
    min_value,
    reinterpret,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
)
from tiled.lang.pdl import pdl_sync, pdl_trigger
from tiled.lang.tileops import (
    GemmWarpPolicy,
    alloc_fragment,
    alloc_local,
    alloc_shared,
    atomic_add,
    atomic_max,
    atomic_min,
    clear,
    copy,
    cumsum,
    fill,
    gemm,
    reduce_absmax,
    reduce_max,
    reduce_min,
    reduce_sum,
)

__all__ = [
    "Else", "If", "Kernel", "KernelFunction", "Parallel", "Pipelined", "Scalar", "Tensor", "abs",
    "all_of", "alloc_barrier", "alloc_fragment", "alloc_local", "alloc_shared", "any_of",
    "atomic_add", "bfloat16", "bool_", "cast", "ceil", "ceildiv", "clear", "copy", "cos", "dyn",
    "erf", "exp", "exp2", "fence_proxy_async", "fill", "float16", "float32", "float64", "floor",
    "gemm", "if_then_else", "infinity", "int8", "int32", "int64", "kernel", "log", "log2", "max",
    "mbarrier_arrive", "mbarrier_expect_tx", "mbarrier_wait_parity", "min", "reduce_max",
    "reduce_min", "reduce_sum", "rsqrt", "serial", "sigmoid", "sin", "sqrt", "tanh", "tma_copy",
    "unroll", "ws",
    # layout hints, vectorized loops, absmax / cumsum / atomic max-min, dtype extremes
    "Fragment", "GemmWarpPolicy", "Layout", "Vectorized", "annotate_layout", "atomic_max",
    "atomic_min", "clamp", "cumsum", "make_swizzled_layout", "max_value", "min_value",
    "reduce_absmax", "reinterpret", "use_swizzle", "vectorized",
    # TileLang's surface: macros, tile annotations, variables, more dtypes
    "Buffer", "FragmentBuffer", "LocalBuffer", "Macro", "SharedBuffer", "alloc_var", "dtype",
    "dynamic", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "int16", "macro", "prim_func",
    "symbolic", "uint8", "uint16", "uint32", "uint64",
    # programmatic dependent launch
    "pdl_sync", "pdl_trigger",
    # a convolution's implicit-GEMM operand tile
    "c2d_im2col", "im2col",
]


def __getattr__(name: str):
    """TileLang names tiled lacks: an alias, a located "not supported" error where the
    feature is used, or an AttributeError naming the nearest known names."""
    import sys

    from tiled.lang.unsupported import module_getattr

    return module_getattr(sys.modules[__name__], name)
