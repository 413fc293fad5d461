"""Types a kernel or macro signature is annotated with, and the dtype objects.

- `T.Tensor(shape, dtype)` (alias `T.Buffer`): a global tensor parameter; dims are ints or
  symbolic (`T.dyn("M")`), the shape a tuple or a list, as TileLang writes it.
- `T.SharedBuffer` / `T.FragmentBuffer` / `T.LocalBuffer`: a tile a @T.macro takes; the
  macro checks that what it is given lives in that memory.
- `T.float16`, `T.float32`, ... (`Scalar`): a scalar parameter type, and a dtype usable
  wherever a dtype name is (`T.alloc_shared(shape, T.float16)`, `T.cast(x, T.float32)`);
  calling one casts, `T.float32(0)`.
"""

from __future__ import annotations

from tiled.ir import dtypes
from tiled.lang.builder import definition_error
from tiled.lang.expr import SCOPE_NAMES, BufferRef, Dim, RegionRef, cast
from tiled.v1 import tile_ir_pb2 as pb


def _dtype_name(dtype) -> str:
    try:
        return dtypes.canonical_name(dtype)
    except ValueError as e:
        raise definition_error(str(e)) from None


def _shape(shape, what: str, symbolic: bool) -> tuple:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    for d in shape:
        if isinstance(d, Dim) and symbolic:
            continue
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            allowed = "positive ints or T.dyn(...)" if symbolic else "positive ints"
            raise definition_error(f"{what} dims must be {allowed}, got {d!r}")
    return shape


class Scalar:
    """A dtype: a scalar parameter type (`n: T.int32`), and a dtype wherever one is named.

    >>> T.alloc_fragment((64,), T.float32)
    >>> x = T.float16(acc[i])     # a cast; T.float32(0) is a constant
    """

    def __init__(self, dtype):
        self.name = _dtype_name(dtype)

    @property
    def dtype(self) -> str:
        return self.name

    def __call__(self, value):
        return cast(value, self.name)

    def __eq__(self, other):
        if isinstance(other, Scalar):
            return self.name == other.name
        try:
            return isinstance(other, str) and dtypes.canonical_name(other) == self.name
        except ValueError:
            return False

    def __hash__(self):
        return hash(self.name)

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"T.{self.name}"


class Tensor:
    """A tensor parameter: `A: T.Tensor((M, 1024), "float16")`, dims ints or `T.dyn` names.

    >>> def k(A: T.Tensor([M, 1024], T.float16)): ...
    """

    def __init__(self, shape, dtype="float32", *view, **options):
        if view or options:
            raise definition_error(
                "TileLang feature T.Tensor(shape, dtype, data, ...) (a view over another "
                "tensor's data, strides, offsets) is not supported by tiled: tensors are "
                "parameters with their own contiguous storage; pass the view as a parameter")
        self.shape = _shape(shape, "T.Tensor", symbolic=True)
        self.dtype = _dtype_name(dtype)

    def __repr__(self):
        return f"T.Tensor({self.shape}, {self.dtype!r})"


Buffer = Tensor


class TileBuffer:
    """A tile parameter of a @T.macro in `scope` memory; checked against what the call
    passes. Subclasses name the scope: T.SharedBuffer, T.FragmentBuffer, T.LocalBuffer."""

    scope = pb.SHARED

    def __init__(self, shape, dtype="float32"):
        what = f"T.{type(self).__name__}"
        self.shape = _shape(shape, what, symbolic=False)
        self.dtype = _dtype_name(dtype)

    def __repr__(self):
        return f"T.{type(self).__name__}({self.shape}, {self.dtype!r})"

    def check(self, param: str, macro: str, value) -> None:
        """Raises a located error when `value` is a tile of another memory than this one."""
        buf = value.buffer if isinstance(value, RegionRef) else value
        if isinstance(buf, BufferRef) and buf.scope != self.scope:
            want, got = SCOPE_NAMES[self.scope], SCOPE_NAMES[buf.scope]
            raise definition_error(
                f"macro {macro}: parameter {param} is annotated T.{type(self).__name__} "
                f"({want} memory), but {buf.name} is a {got} buffer")


class SharedBuffer(TileBuffer):
    """A shared-memory tile a macro takes. `def mma(A_s: T.SharedBuffer([64, 32], T.float16))`"""

    scope = pb.SHARED


class FragmentBuffer(TileBuffer):
    """A register tile a macro takes. `def rescale(acc: T.FragmentBuffer([64, 64], T.float32))`"""

    scope = pb.FRAGMENT


class LocalBuffer(TileBuffer):
    """A per-thread buffer a macro takes. `def step(x: T.LocalBuffer([1], T.int32))`"""

    scope = pb.LOCAL


def dyn(name: str) -> Dim:
    """A symbolic dimension, bound at launch from the tensor that has it.

    >>> M = T.dyn("M")
    >>> def k(A: T.Tensor((M, 64), "float32")): ...
    """
    return Dim(name)


def dynamic(name: str, dtype="int32") -> Dim:
    """TileLang's spelling of `T.dyn` (also `T.symbolic`): `M = T.dynamic("M")`. Symbolic
    dims are int32."""
    if _dtype_name(dtype) != "int32":
        raise definition_error(f"symbolic dim {name}: only int32 dims are supported, got {dtype}")
    return Dim(name)


symbolic = dynamic

dtype = Scalar
bool_ = Scalar("bool")
int8 = Scalar("int8")
int32 = Scalar("int32")
int64 = Scalar("int64")
float16 = Scalar("float16")
bfloat16 = Scalar("bfloat16")
float32 = Scalar("float32")
float64 = Scalar("float64")
uint8 = Scalar("uint8")
uint16 = Scalar("uint16")
uint32 = Scalar("uint32")
uint64 = Scalar("uint64")
int16 = Scalar("int16")
float8_e4m3 = Scalar("float8_e4m3")
float8_e5m2 = Scalar("float8_e5m2")
float8_e4m3fn = float8_e4m3  # TileLang's (and torch's) name of the same format
