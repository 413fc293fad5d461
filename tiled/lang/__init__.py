"""The tile DSL, used as `import tiled.lang as T`. Free of TVM."""

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
from tiled.lang.kernel import KernelFunction, Scalar, Tensor, dyn, kernel
from tiled.lang.loops import Else, If, Kernel, Parallel, Pipelined, serial, unroll
from tiled.lang.math import (
    abs,
    all_of,
    any_of,
    ceil,
    ceildiv,
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
    min,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
)
from tiled.lang.tileops import (
    alloc_fragment,
    alloc_local,
    alloc_shared,
    atomic_add,
    clear,
    copy,
    fill,
    gemm,
    reduce_max,
    reduce_min,
    reduce_sum,
)

bool_ = Scalar("bool")
int8 = Scalar("int8")
int32 = Scalar("int32")
int64 = Scalar("int64")
float16 = Scalar("float16")
bfloat16 = Scalar("bfloat16")
float32 = Scalar("float32")
float64 = Scalar("float64")

__all__ = [
    "Else", "If", "Kernel", "KernelFunction", "Parallel", "Pipelined", "Scalar", "Tensor", "abs",
    "all_of", "alloc_barrier", "alloc_fragment", "alloc_local", "alloc_shared", "any_of",
    "atomic_add", "bfloat16", "bool_", "cast", "ceil", "ceildiv", "clear", "copy", "cos", "dyn",
    "erf", "exp", "exp2", "fence_proxy_async", "fill", "float16", "float32", "float64", "floor",
    "gemm", "if_then_else", "infinity", "int8", "int32", "int64", "kernel", "log", "log2", "max",
    "mbarrier_arrive", "mbarrier_expect_tx", "mbarrier_wait_parity", "min", "reduce_max",
    "reduce_min", "reduce_sum", "rsqrt", "serial", "sigmoid", "sin", "sqrt", "tanh", "tma_copy",
    "unroll", "ws",
]
