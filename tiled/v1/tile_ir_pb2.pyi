from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    BOOL: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    UINT16: _ClassVar[DType]
    UINT32: _ClassVar[DType]
    UINT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    FLOAT8_E4M3: _ClassVar[DType]
    FLOAT8_E5M2: _ClassVar[DType]

class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_UNSPECIFIED: _ClassVar[Scope]
    GLOBAL: _ClassVar[Scope]
    SHARED: _ClassVar[Scope]
    FRAGMENT: _ClassVar[Scope]
    LOCAL: _ClassVar[Scope]
    BARRIER: _ClassVar[Scope]

class BinaryOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BINARY_OP_UNSPECIFIED: _ClassVar[BinaryOp]
    ADD: _ClassVar[BinaryOp]
    SUB: _ClassVar[BinaryOp]
    MUL: _ClassVar[BinaryOp]
    DIV: _ClassVar[BinaryOp]
    FLOOR_DIV: _ClassVar[BinaryOp]
    FLOOR_MOD: _ClassVar[BinaryOp]
    MIN: _ClassVar[BinaryOp]
    MAX: _ClassVar[BinaryOp]
    EQ: _ClassVar[BinaryOp]
    NE: _ClassVar[BinaryOp]
    LT: _ClassVar[BinaryOp]
    LE: _ClassVar[BinaryOp]
    GT: _ClassVar[BinaryOp]
    GE: _ClassVar[BinaryOp]
    AND: _ClassVar[BinaryOp]
    OR: _ClassVar[BinaryOp]
    BIT_AND: _ClassVar[BinaryOp]
    BIT_OR: _ClassVar[BinaryOp]
    BIT_XOR: _ClassVar[BinaryOp]
    SHL: _ClassVar[BinaryOp]
    SHR: _ClassVar[BinaryOp]

class Intrinsic(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTRINSIC_UNSPECIFIED: _ClassVar[Intrinsic]
    NEG: _ClassVar[Intrinsic]
    NOT: _ClassVar[Intrinsic]
    EXP: _ClassVar[Intrinsic]
    EXP2: _ClassVar[Intrinsic]
    LOG: _ClassVar[Intrinsic]
    LOG2: _ClassVar[Intrinsic]
    SQRT: _ClassVar[Intrinsic]
    RSQRT: _ClassVar[Intrinsic]
    TANH: _ClassVar[Intrinsic]
    ABS: _ClassVar[Intrinsic]
    SIGMOID: _ClassVar[Intrinsic]
    FLOOR: _ClassVar[Intrinsic]
    CEIL: _ClassVar[Intrinsic]
    POW: _ClassVar[Intrinsic]
    ERF: _ClassVar[Intrinsic]
    SIN: _ClassVar[Intrinsic]
    COS: _ClassVar[Intrinsic]
    REINTERPRET: _ClassVar[Intrinsic]

class LoopKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOP_KIND_UNSPECIFIED: _ClassVar[LoopKind]
    SERIAL: _ClassVar[LoopKind]
    PARALLEL: _ClassVar[LoopKind]
    PIPELINED: _ClassVar[LoopKind]
    UNROLL: _ClassVar[LoopKind]
    VECTORIZED: _ClassVar[LoopKind]

class ReduceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REDUCE_KIND_UNSPECIFIED: _ClassVar[ReduceKind]
    REDUCE_SUM: _ClassVar[ReduceKind]
    REDUCE_MAX: _ClassVar[ReduceKind]
    REDUCE_MIN: _ClassVar[ReduceKind]
    REDUCE_ABSMAX: _ClassVar[ReduceKind]

class GemmWarpPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_SQUARE: _ClassVar[GemmWarpPolicy]
    POLICY_FULL_ROW: _ClassVar[GemmWarpPolicy]
    POLICY_FULL_COL: _ClassVar[GemmWarpPolicy]

class AtomicOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATOMIC_ADD: _ClassVar[AtomicOp]
    ATOMIC_MAX: _ClassVar[AtomicOp]
    ATOMIC_MIN: _ClassVar[AtomicOp]

class MemoryOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ORDER_RELAXED: _ClassVar[MemoryOrder]
    ORDER_ACQUIRE: _ClassVar[MemoryOrder]
    ORDER_RELEASE: _ClassVar[MemoryOrder]
    ORDER_ACQ_REL: _ClassVar[MemoryOrder]
    ORDER_SEQ_CST: _ClassVar[MemoryOrder]

class MBarrierKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MBARRIER_KIND_UNSPECIFIED: _ClassVar[MBarrierKind]
    MBARRIER_ARRIVE: _ClassVar[MBarrierKind]
    MBARRIER_WAIT_PARITY: _ClassVar[MBarrierKind]
    MBARRIER_EXPECT_TX: _ClassVar[MBarrierKind]
DTYPE_UNSPECIFIED: DType
BOOL: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
UINT8: DType
UINT16: DType
UINT32: DType
UINT64: DType
FLOAT16: DType
BFLOAT16: DType
FLOAT32: DType
FLOAT64: DType
FLOAT8_E4M3: DType
FLOAT8_E5M2: DType
SCOPE_UNSPECIFIED: Scope
GLOBAL: Scope
SHARED: Scope
FRAGMENT: Scope
LOCAL: Scope
BARRIER: Scope
BINARY_OP_UNSPECIFIED: BinaryOp
ADD: BinaryOp
SUB: BinaryOp
MUL: BinaryOp
DIV: BinaryOp
FLOOR_DIV: BinaryOp
FLOOR_MOD: BinaryOp
MIN: BinaryOp
MAX: BinaryOp
EQ: BinaryOp
NE: BinaryOp
LT: BinaryOp
LE: BinaryOp
GT: BinaryOp
GE: BinaryOp
AND: BinaryOp
OR: BinaryOp
BIT_AND: BinaryOp
BIT_OR: BinaryOp
BIT_XOR: BinaryOp
SHL: BinaryOp
SHR: BinaryOp
INTRINSIC_UNSPECIFIED: Intrinsic
NEG: Intrinsic
NOT: Intrinsic
EXP: Intrinsic
EXP2: Intrinsic
LOG: Intrinsic
LOG2: Intrinsic
SQRT: Intrinsic
RSQRT: Intrinsic
TANH: Intrinsic
ABS: Intrinsic
SIGMOID: Intrinsic
FLOOR: Intrinsic
CEIL: Intrinsic
POW: Intrinsic
ERF: Intrinsic
SIN: Intrinsic
COS: Intrinsic
REINTERPRET: Intrinsic
LOOP_KIND_UNSPECIFIED: LoopKind
SERIAL: LoopKind
PARALLEL: LoopKind
PIPELINED: LoopKind
UNROLL: LoopKind
VECTORIZED: LoopKind
REDUCE_KIND_UNSPECIFIED: ReduceKind
REDUCE_SUM: ReduceKind
REDUCE_MAX: ReduceKind
REDUCE_MIN: ReduceKind
REDUCE_ABSMAX: ReduceKind
POLICY_SQUARE: GemmWarpPolicy
POLICY_FULL_ROW: GemmWarpPolicy
POLICY_FULL_COL: GemmWarpPolicy
ATOMIC_ADD: AtomicOp
ATOMIC_MAX: AtomicOp
ATOMIC_MIN: AtomicOp
ORDER_RELAXED: MemoryOrder
ORDER_ACQUIRE: MemoryOrder
ORDER_RELEASE: MemoryOrder
ORDER_ACQ_REL: MemoryOrder
ORDER_SEQ_CST: MemoryOrder
MBARRIER_KIND_UNSPECIFIED: MBarrierKind
MBARRIER_ARRIVE: MBarrierKind
MBARRIER_WAIT_PARITY: MBarrierKind
MBARRIER_EXPECT_TX: MBarrierKind

class Location(_message.Message):
    __slots__ = ("file", "line", "column")
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    file: str
    line: int
    column: int
    def __init__(self, file: _Optional[str] = ..., line: _Optional[int] = ..., column: _Optional[int] = ...) -> None: ...

class Var(_message.Message):
    __slots__ = ("id", "name", "dtype")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    dtype: DType
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class Dim(_message.Message):
    __slots__ = ("size", "var")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    size: int
    var: int
    def __init__(self, size: _Optional[int] = ..., var: _Optional[int] = ...) -> None: ...

class Buffer(_message.Message):
    __slots__ = ("id", "name", "dtype", "shape", "scope", "arrive_count", "loc")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ARRIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    LOC_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    dtype: DType
    shape: _containers.RepeatedCompositeFieldContainer[Dim]
    scope: Scope
    arrive_count: int
    loc: Location
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[_Union[Dim, _Mapping]]] = ..., scope: _Optional[_Union[Scope, str]] = ..., arrive_count: _Optional[int] = ..., loc: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class Param(_message.Message):
    __slots__ = ("name", "buffer", "scalar")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    SCALAR_FIELD_NUMBER: _ClassVar[int]
    name: str
    buffer: int
    scalar: int
    def __init__(self, name: _Optional[str] = ..., buffer: _Optional[int] = ..., scalar: _Optional[int] = ...) -> None: ...

class Expr(_message.Message):
    __slots__ = ("dtype", "int_value", "float_value", "var", "binary", "call", "cast", "select", "load")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    CAST_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    int_value: int
    float_value: float
    var: int
    binary: Binary
    call: Call
    cast: Cast
    select: Select
    load: Load
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., var: _Optional[int] = ..., binary: _Optional[_Union[Binary, _Mapping]] = ..., call: _Optional[_Union[Call, _Mapping]] = ..., cast: _Optional[_Union[Cast, _Mapping]] = ..., select: _Optional[_Union[Select, _Mapping]] = ..., load: _Optional[_Union[Load, _Mapping]] = ...) -> None: ...

class Binary(_message.Message):
    __slots__ = ("op", "a", "b")
    OP_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    op: BinaryOp
    a: Expr
    b: Expr
    def __init__(self, op: _Optional[_Union[BinaryOp, str]] = ..., a: _Optional[_Union[Expr, _Mapping]] = ..., b: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("op", "args")
    OP_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    op: Intrinsic
    args: _containers.RepeatedCompositeFieldContainer[Expr]
    def __init__(self, op: _Optional[_Union[Intrinsic, str]] = ..., args: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ...) -> None: ...

class Cast(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: Expr
    def __init__(self, value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Select(_message.Message):
    __slots__ = ("cond", "true_value", "false_value")
    COND_FIELD_NUMBER: _ClassVar[int]
    TRUE_VALUE_FIELD_NUMBER: _ClassVar[int]
    FALSE_VALUE_FIELD_NUMBER: _ClassVar[int]
    cond: Expr
    true_value: Expr
    false_value: Expr
    def __init__(self, cond: _Optional[_Union[Expr, _Mapping]] = ..., true_value: _Optional[_Union[Expr, _Mapping]] = ..., false_value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("buffer", "indices")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    buffer: int
    indices: _containers.RepeatedCompositeFieldContainer[Expr]
    def __init__(self, buffer: _Optional[int] = ..., indices: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ("buffer", "offsets", "extents")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    buffer: int
    offsets: _containers.RepeatedCompositeFieldContainer[Expr]
    extents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, buffer: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., extents: _Optional[_Iterable[int]] = ...) -> None: ...

class Seq(_message.Message):
    __slots__ = ("stmts",)
    STMTS_FIELD_NUMBER: _ClassVar[int]
    stmts: _containers.RepeatedCompositeFieldContainer[Stmt]
    def __init__(self, stmts: _Optional[_Iterable[_Union[Stmt, _Mapping]]] = ...) -> None: ...

class For(_message.Message):
    __slots__ = ("var", "extent", "kind", "num_stages", "body")
    VAR_FIELD_NUMBER: _ClassVar[int]
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    var: int
    extent: Expr
    kind: LoopKind
    num_stages: int
    body: Stmt
    def __init__(self, var: _Optional[int] = ..., extent: _Optional[_Union[Expr, _Mapping]] = ..., kind: _Optional[_Union[LoopKind, str]] = ..., num_stages: _Optional[int] = ..., body: _Optional[_Union[Stmt, _Mapping]] = ...) -> None: ...

class IfThenElse(_message.Message):
    __slots__ = ("cond", "then_body", "else_body")
    COND_FIELD_NUMBER: _ClassVar[int]
    THEN_BODY_FIELD_NUMBER: _ClassVar[int]
    ELSE_BODY_FIELD_NUMBER: _ClassVar[int]
    cond: Expr
    then_body: Stmt
    else_body: Stmt
    def __init__(self, cond: _Optional[_Union[Expr, _Mapping]] = ..., then_body: _Optional[_Union[Stmt, _Mapping]] = ..., else_body: _Optional[_Union[Stmt, _Mapping]] = ...) -> None: ...

class Store(_message.Message):
    __slots__ = ("buffer", "indices", "value")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    buffer: int
    indices: _containers.RepeatedCompositeFieldContainer[Expr]
    value: Expr
    def __init__(self, buffer: _Optional[int] = ..., indices: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Copy(_message.Message):
    __slots__ = ("src", "dst", "tma")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TMA_FIELD_NUMBER: _ClassVar[int]
    src: Region
    dst: Region
    tma: BarrierRef
    def __init__(self, src: _Optional[_Union[Region, _Mapping]] = ..., dst: _Optional[_Union[Region, _Mapping]] = ..., tma: _Optional[_Union[BarrierRef, _Mapping]] = ...) -> None: ...

class BarrierRef(_message.Message):
    __slots__ = ("barrier", "index")
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    barrier: int
    index: Expr
    def __init__(self, barrier: _Optional[int] = ..., index: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Gemm(_message.Message):
    __slots__ = ("a", "b", "c", "transpose_a", "transpose_b", "clear_accum", "a_index", "b_index", "policy")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    C_FIELD_NUMBER: _ClassVar[int]
    TRANSPOSE_A_FIELD_NUMBER: _ClassVar[int]
    TRANSPOSE_B_FIELD_NUMBER: _ClassVar[int]
    CLEAR_ACCUM_FIELD_NUMBER: _ClassVar[int]
    A_INDEX_FIELD_NUMBER: _ClassVar[int]
    B_INDEX_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    a: int
    b: int
    c: int
    transpose_a: bool
    transpose_b: bool
    clear_accum: bool
    a_index: _containers.RepeatedCompositeFieldContainer[Expr]
    b_index: _containers.RepeatedCompositeFieldContainer[Expr]
    policy: GemmWarpPolicy
    def __init__(self, a: _Optional[int] = ..., b: _Optional[int] = ..., c: _Optional[int] = ..., transpose_a: bool = ..., transpose_b: bool = ..., clear_accum: bool = ..., a_index: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., b_index: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., policy: _Optional[_Union[GemmWarpPolicy, str]] = ...) -> None: ...

class Fill(_message.Message):
    __slots__ = ("dst", "value")
    DST_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    dst: Region
    value: Expr
    def __init__(self, dst: _Optional[_Union[Region, _Mapping]] = ..., value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class Reduce(_message.Message):
    __slots__ = ("kind", "src", "dst", "dim", "clear")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    kind: ReduceKind
    src: int
    dst: int
    dim: int
    clear: bool
    def __init__(self, kind: _Optional[_Union[ReduceKind, str]] = ..., src: _Optional[int] = ..., dst: _Optional[int] = ..., dim: _Optional[int] = ..., clear: bool = ...) -> None: ...

class AtomicAdd(_message.Message):
    __slots__ = ("buffer", "indices", "value", "op", "order", "has_prev", "prev")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    HAS_PREV_FIELD_NUMBER: _ClassVar[int]
    PREV_FIELD_NUMBER: _ClassVar[int]
    buffer: int
    indices: _containers.RepeatedCompositeFieldContainer[Expr]
    value: Expr
    op: AtomicOp
    order: MemoryOrder
    has_prev: bool
    prev: int
    def __init__(self, buffer: _Optional[int] = ..., indices: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., value: _Optional[_Union[Expr, _Mapping]] = ..., op: _Optional[_Union[AtomicOp, str]] = ..., order: _Optional[_Union[MemoryOrder, str]] = ..., has_prev: bool = ..., prev: _Optional[int] = ...) -> None: ...

class Scan(_message.Message):
    __slots__ = ("src", "dst", "dim", "reverse")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    REVERSE_FIELD_NUMBER: _ClassVar[int]
    src: int
    dst: int
    dim: int
    reverse: bool
    def __init__(self, src: _Optional[int] = ..., dst: _Optional[int] = ..., dim: _Optional[int] = ..., reverse: bool = ...) -> None: ...

class MBarrierOp(_message.Message):
    __slots__ = ("kind", "barrier", "value")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: MBarrierKind
    barrier: BarrierRef
    value: Expr
    def __init__(self, kind: _Optional[_Union[MBarrierKind, str]] = ..., barrier: _Optional[_Union[BarrierRef, _Mapping]] = ..., value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class FenceProxyAsync(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GridDependency(_message.Message):
    __slots__ = ("trigger",)
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    trigger: bool
    def __init__(self, trigger: bool = ...) -> None: ...

class WarpGroup(_message.Message):
    __slots__ = ("group", "regs", "body")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REGS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    group: int
    regs: int
    body: Stmt
    def __init__(self, group: _Optional[int] = ..., regs: _Optional[int] = ..., body: _Optional[_Union[Stmt, _Mapping]] = ...) -> None: ...

class Stmt(_message.Message):
    __slots__ = ("loc", "seq", "for_", "if_then_else", "store", "copy", "gemm", "fill", "reduce", "atomic_add", "warp_group", "mbarrier", "fence_proxy_async", "scan", "grid_dependency")
    LOC_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FOR__FIELD_NUMBER: _ClassVar[int]
    IF_THEN_ELSE_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    GEMM_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    REDUCE_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_ADD_FIELD_NUMBER: _ClassVar[int]
    WARP_GROUP_FIELD_NUMBER: _ClassVar[int]
    MBARRIER_FIELD_NUMBER: _ClassVar[int]
    FENCE_PROXY_ASYNC_FIELD_NUMBER: _ClassVar[int]
    SCAN_FIELD_NUMBER: _ClassVar[int]
    GRID_DEPENDENCY_FIELD_NUMBER: _ClassVar[int]
    loc: Location
    seq: Seq
    for_: For
    if_then_else: IfThenElse
    store: Store
    copy: Copy
    gemm: Gemm
    fill: Fill
    reduce: Reduce
    atomic_add: AtomicAdd
    warp_group: WarpGroup
    mbarrier: MBarrierOp
    fence_proxy_async: FenceProxyAsync
    scan: Scan
    grid_dependency: GridDependency
    def __init__(self, loc: _Optional[_Union[Location, _Mapping]] = ..., seq: _Optional[_Union[Seq, _Mapping]] = ..., for_: _Optional[_Union[For, _Mapping]] = ..., if_then_else: _Optional[_Union[IfThenElse, _Mapping]] = ..., store: _Optional[_Union[Store, _Mapping]] = ..., copy: _Optional[_Union[Copy, _Mapping]] = ..., gemm: _Optional[_Union[Gemm, _Mapping]] = ..., fill: _Optional[_Union[Fill, _Mapping]] = ..., reduce: _Optional[_Union[Reduce, _Mapping]] = ..., atomic_add: _Optional[_Union[AtomicAdd, _Mapping]] = ..., warp_group: _Optional[_Union[WarpGroup, _Mapping]] = ..., mbarrier: _Optional[_Union[MBarrierOp, _Mapping]] = ..., fence_proxy_async: _Optional[_Union[FenceProxyAsync, _Mapping]] = ..., scan: _Optional[_Union[Scan, _Mapping]] = ..., grid_dependency: _Optional[_Union[GridDependency, _Mapping]] = ...) -> None: ...

class Kernel(_message.Message):
    __slots__ = ("grid", "block_vars", "threads", "body", "loc")
    GRID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_VARS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    LOC_FIELD_NUMBER: _ClassVar[int]
    grid: _containers.RepeatedCompositeFieldContainer[Expr]
    block_vars: _containers.RepeatedScalarFieldContainer[int]
    threads: int
    body: Stmt
    loc: Location
    def __init__(self, grid: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ..., block_vars: _Optional[_Iterable[int]] = ..., threads: _Optional[int] = ..., body: _Optional[_Union[Stmt, _Mapping]] = ..., loc: _Optional[_Union[Location, _Mapping]] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("schema_version", "name", "vars", "buffers", "params", "kernel")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    name: str
    vars: _containers.RepeatedCompositeFieldContainer[Var]
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    params: _containers.RepeatedCompositeFieldContainer[Param]
    kernel: Kernel
    def __init__(self, schema_version: _Optional[int] = ..., name: _Optional[str] = ..., vars: _Optional[_Iterable[_Union[Var, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ..., params: _Optional[_Iterable[_Union[Param, _Mapping]]] = ..., kernel: _Optional[_Union[Kernel, _Mapping]] = ...) -> None: ...
