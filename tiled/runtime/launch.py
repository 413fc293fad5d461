"""A kernel launch as its manifest describes it, with no driver: grid and block from the call's
dims (checked against the CUDA limits, which HIP and Metal share here), the kernel parameter
buffer (`void**` kernelParams: tensors as device pointers, scalars by their bits, dims in
their declared width, TMA descriptors), and the checks and encoding request of a TMA
descriptor (TensorMapRequest; the CUDA runtime encodes it with the driver). Used by the
CUDA launcher (tiled.runtime.cuda) and, for geometry, by the ROCm and Metal ones.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime.args import BoundArgs, TensorView, scalar_bits
from tiled.runtime.manifest import (
    SM_COUNT_DIM,
    KernelArg,
    Manifest,
    Param,
    compile_expr,
    expr_names,
)

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024

_SCALAR_CTYPES = {
    "bool": ctypes.c_bool, "int8": ctypes.c_int8, "int16": ctypes.c_int16,
    "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
    "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
}
_DIM_CTYPES = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint32": ctypes.c_uint32,
               "uint64": ctypes.c_uint64}

TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap); the kernel parameter is 64-byte aligned
TENSOR_MAP_CACHE_SIZE = 64  # encoded descriptors kept per LaunchPlan (LRU)
# TMA copies bits: integer, bool and float8 types travel as the unsigned type of their width
# (as CUTLASS does); the signed / float names only matter for OOB NaN fill, which is not used.
TMA_DATA_TYPES = {
    "float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32", "float64": "FLOAT64",
    "int32": "INT32", "uint32": "UINT32", "int64": "INT64", "uint64": "UINT64",
    "int16": "UINT16", "uint16": "UINT16", "int8": "UINT8", "uint8": "UINT8", "bool": "UINT8",
    "float8_e4m3": "UINT8", "float8_e5m2": "UINT8",
}
TMA_SWIZZLE_NAMES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


class TensorMapStorage(ctypes.Structure):
    """A CUtensorMap by value: 128 opaque bytes. cuLaunchKernel copies the bytes its
    kernelParams pointer points at into the (64-byte aligned) parameter slot, so the host copy
    needs no alignment; LaunchPlan still puts it on a 64-byte boundary."""

    _fields_ = [("opaque", ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8))]


@dataclass(frozen=True)
class TensorMapRequest:
    """One cuTensorMapEncodeTiled call, every tuple innermost dim first. Interleave none,
    element strides of 1, L2 promotion 256B and zero out-of-bounds fill are implied."""

    dtype: str  # manifest dtype of the elements (see TMA_DATA_TYPES)
    address: int  # globalAddress, 16-byte aligned
    dims: tuple[int, ...]  # globalDim: elements per dim
    strides: tuple[int, ...]  # globalStrides: bytes between steps of dims 1.., multiples of 16
    box: tuple[int, ...]  # boxDim: elements per dim
    swizzle: int  # bytes: 0 | 32 | 64 | 128


TensorMapEncoder = Callable[[TensorMapRequest], bytes]


def tensor_map_encode_args(cu, request: TensorMapRequest) -> tuple:
    """The cuTensorMapEncodeTiled arguments for `request`, built with the driver module `cu`
    (cuda.bindings.driver). Pure: builds the enums and cuuint wrappers, calls nothing."""
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    return (
        getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{TMA_DATA_TYPES[request.dtype]}"),
        len(request.dims), request.address,
        [u64(d) for d in request.dims], [u64(s) for s in request.strides],
        [u32(b) for b in request.box], [u32(1)] * len(request.dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle,
                f"CU_TENSOR_MAP_SWIZZLE_{TMA_SWIZZLE_NAMES[request.swizzle]}"),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )


class LaunchPlan:
    """A manifest's launch, compiled once per kernel: grid / block functions of the dims and
    a kernel parameter buffer layout. `geometry` is pure; so is `pack`, except that a
    "tensor_map" argument calls `encode_tensor_map` (a TensorMapRequest -> 128 bytes; the CUDA
    runtime passes the driver's cuTensorMapEncodeTiled, tiled.runtime.cuda.driver_tensor_map;
    without one such an argument is a LaunchError).

    Thread-safe: each thread packs into its own buffer; encoded descriptors are shared through
    an LRU of TENSOR_MAP_CACHE_SIZE entries per plan, keyed by (argument, data pointer, shape,
    strides) and guarded by a lock. Two threads that miss on one key both encode it (same
    bytes). A buffer freed and reallocated at the same address with the same shape reuses the
    entry, which is right: the descriptor depends on nothing else."""

    def __init__(self, manifest: Manifest, encode_tensor_map: TensorMapEncoder | None = None):
        self.manifest = m = manifest
        self._encode = encode_tensor_map
        self._tensor_maps: OrderedDict[tuple, bytes] = OrderedDict()
        self._tensor_maps_lock = threading.Lock()
        self._grid = [compile_expr(e) for e in m.grid]
        self.uses_sm_count = any(SM_COUNT_DIM in expr_names(e) for e in m.grid)
        self._block = [compile_expr(e) for e in m.block]
        self._static_block = None
        if all(isinstance(e, int) for e in m.block):  # the usual case: check it once, here
            self._static_block = self._checked_block(tuple(m.block))  # type: ignore[arg-type]
        fields, self._sources = [], []
        for i, ka in enumerate(m.kernel_args):
            if ka.kind == "tensor":
                ctype, source = ctypes.c_uint64, ("tensor", ka.param, None, None)
            elif ka.kind == "tensor_map":
                ctype = TensorMapStorage
                source = ("tensor_map", ka.param, m.params[ka.param], ka)  # type: ignore[index]
            elif ka.kind == "scalar":
                p = m.params[ka.param]  # type: ignore[index]
                if p.dtype in ("float16", "bfloat16"):
                    ctype = ctypes.c_uint16
                elif p.dtype in _SCALAR_CTYPES:
                    ctype = _SCALAR_CTYPES[p.dtype]
                else:
                    raise LaunchError(f"{m.name}: {p.name}: {p.dtype} scalars cannot be passed "
                                      f"to a CUDA kernel")
                source = ("scalar", ka.param, p.dtype, None)
            else:
                ctype = _DIM_CTYPES[ka.dtype]  # type: ignore[index]
                bits = ctypes.sizeof(ctype) * 8
                lo, hi = (0, 2**bits - 1) if ka.dtype.startswith("u") else \
                    (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)  # type: ignore[union-attr]
                source = ("dim", ka.name, (lo, hi), i)
            fields.append((f"a{i}", ctype))
            self._sources.append((f"a{i}", *source))
        # Descriptors first: at multiples of 128 bytes from a 64-byte aligned base (the order of
        # the storage is free; kernelParams points at each field).
        fields.sort(key=lambda f: f[1] is not TensorMapStorage)
        self._buffer_type = type("KernelParams", (ctypes.Structure,), {"_fields_": fields})
        self._local = threading.local()

    def geometry(self, dims: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(grid, block) for the dims a call bound. A grid with a zero extent means "nothing to
        launch". Raises LaunchError for negative or over-limit extents."""
        m = self.manifest
        grid = (self._grid[0](dims), self._grid[1](dims), self._grid[2](dims))
        block = self._static_block or (self._block[0](dims), self._block[1](dims),
                                       self._block[2](dims))
        if not (0 <= grid[0] <= MAX_GRID[0] and 0 <= grid[1] <= MAX_GRID[1]
                and 0 <= grid[2] <= MAX_GRID[2]):
            axis = next(a for a in range(3) if not 0 <= grid[a] <= MAX_GRID[a])
            raise LaunchError(f"{m.name}: grid[{axis}] = {grid[axis]} outside "
                              f"[0, {MAX_GRID[axis]}] (dims {dims})")
        if self._static_block is None:
            block = self._checked_block(block)
        cluster = m.cluster
        if cluster != (1, 1, 1) and 0 not in grid:
            for axis in range(3):
                if grid[axis] % cluster[axis]:
                    raise LaunchError(f"{m.name}: grid[{axis}] = {grid[axis]} is not a multiple "
                                      f"of the cluster size {cluster[axis]}")
        return grid, block

    def _checked_block(self, block: tuple[int, int, int]) -> tuple[int, int, int]:
        for axis, (b, limit) in enumerate(zip(block, MAX_BLOCK, strict=True)):
            if not 1 <= b <= limit:
                raise LaunchError(f"{self.manifest.name}: block[{axis}] = {b} outside "
                                  f"[1, {limit}]")
        if block[0] * block[1] * block[2] > MAX_THREADS:
            raise LaunchError(f"{self.manifest.name}: block {block} has more than "
                              f"{MAX_THREADS} threads")
        return block

    def pack(self, bound: BoundArgs) -> ctypes.Array:
        """The `void**` kernelParams array, one slot per kernel_arg. Its storage is this
        thread's and is reused by the thread's next call: the driver copies the values during
        cuLaunchKernel, so it is free again once the launch call returns."""
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None:
            size = ctypes.sizeof(self._buffer_type)
            raw = (ctypes.c_char * (size + 63))()  # the view below keeps it alive
            buf = local.buf = self._buffer_type.from_buffer(raw, -ctypes.addressof(raw) % 64)
            base = ctypes.addressof(buf)
            n = len(self._sources)
            local.array = (ctypes.c_void_p * max(1, n))(
                *[base + getattr(self._buffer_type, f"a{i}").offset for i in range(n)])
        values = bound.values
        for i, (field, kind, key, extra, _) in enumerate(self._sources):
            if kind == "tensor":
                value = values[key].ptr  # type: ignore[union-attr]
            elif kind == "tensor_map":
                desc = self._tensor_map(i, extra, values[key])  # type: ignore[arg-type]
                ctypes.memmove(local.array[i], desc, TENSOR_MAP_BYTES)
                continue
            elif kind == "scalar":
                value = scalar_bits(values[key], extra)
            else:
                value = bound.dims[key]
                if not extra[0] <= value <= extra[1]:
                    raise LaunchError(f"{self.manifest.name}: dim {key}={value} does not fit "
                                      f"the kernel's {self.manifest.kernel_args[i].dtype} "
                                      f"parameter #{i}")
            setattr(buf, field, value)
        return local.array

    def _tensor_map(self, i: int, p: Param, view: TensorView) -> bytes:
        """The descriptor bytes of kernel_args[i] for `view`: cached, else checked and encoded."""
        key = (i, view.ptr, tuple(view.shape), view.strides)
        cache, lock = self._tensor_maps, self._tensor_maps_lock
        with lock:
            desc = cache.get(key)
            if desc is not None:
                cache.move_to_end(key)
                return desc
        request = self._tensor_map_request(i, p, view)
        what = f"{self.manifest.name}: {p.name} (kernel_args[{i}], tensor_map)"
        if self._encode is None:
            raise LaunchError(f"{what}: this launcher has no TMA descriptor encoder (a "
                              f"tensor_map argument needs the CUDA runtime's)")
        try:
            desc = bytes(self._encode(request))
        except LaunchError as e:
            raise LaunchError(f"{what}: encoding the TMA descriptor failed for {request}: "
                              f"{e}") from None
        if len(desc) != TENSOR_MAP_BYTES:
            raise LaunchError(f"{what}: the encoder returned {len(desc)} bytes, not "
                              f"{TENSOR_MAP_BYTES}")
        with lock:
            cache[key] = desc
            if len(cache) > TENSOR_MAP_CACHE_SIZE:
                cache.popitem(last=False)
        return desc

    def _tensor_map_request(self, i: int, p: Param, view: TensorView) -> TensorMapRequest:
        """Checks the TMA rules that depend on the tensor (the manifest checked the box)."""
        ka: KernelArg = self.manifest.kernel_args[i]
        what = f"{self.manifest.name}: {p.name} (kernel_args[{i}], tensor_map)"
        size = dtypes.nbytes(p.dtype)
        shape = tuple(view.shape)
        if not all(1 <= d <= 2**32 for d in shape):
            raise LaunchError(f"{what}: shape {shape}; TMA needs every dim in 1..2^32")
        strides = list(view.strides) if view.strides is not None else \
            [math.prod(shape[j + 1:]) for j in range(len(shape))]
        if strides[-1] != 1 and shape[-1] != 1:
            raise LaunchError(f"{what}: the last dim is not contiguous (strides "
                              f"{view.strides}); TMA needs unit stride along the last dim")
        # Outer dims, innermost first. A dim of size 1 is never stepped: any legal stride
        # describes it, so it takes the smallest that keeps the strides ordered.
        outer = []
        span = shape[-1]  # elements the dims inside the current one cover
        for j in range(len(shape) - 2, -1, -1):
            stride = strides[j]
            name = "row stride" if j == len(shape) - 2 else f"stride of dim {j}"
            if shape[j] == 1:
                stride = -(-span * size // 16) * 16 // size
            if stride < span:
                inner = "a row" if j == len(shape) - 2 else f"dims {j + 1}.."
                raise LaunchError(f"{what}: {name} {stride} is shorter than {inner} ({span} "
                                  f"elements); the tensor's elements must not overlap")
            nbytes = stride * size
            if nbytes % 16:
                if j == len(shape) - 2:
                    dim = p.shape[-1] if p.shape else None
                    rows_are = (f"{dim}={shape[-1]} {p.dtype} rows are" if isinstance(dim, str)
                                else f"{shape[-1]}-element {p.dtype} rows are")
                    if stride != shape[-1]:
                        rows_are = f"rows {stride} {p.dtype} elements apart are"
                    raise LaunchError(f"{what}: {rows_are} {nbytes} bytes; TMA needs row "
                                      f"strides that are multiples of 16 bytes: pad the row "
                                      f"length to a multiple of {max(1, 16 // size)}")
                raise LaunchError(f"{what}: {name} is {nbytes} bytes; TMA needs strides that "
                                  f"are multiples of 16 bytes")
            if nbytes >= 2**40:
                raise LaunchError(f"{what}: {name} {nbytes} bytes; TMA needs less than 2^40")
            outer.append(nbytes)
            span = stride * shape[j]
        if view.ptr % 16:
            raise LaunchError(f"{what}: data pointer {view.ptr:#x} is not 16-byte aligned; TMA "
                              f"needs a 16-byte aligned base (a view that starts mid-row or at "
                              f"an offset moves the pointer)")
        return TensorMapRequest(p.dtype, view.ptr, shape[::-1], tuple(outer),
                                tuple(ka.box), ka.swizzle)  # type: ignore[arg-type]


def launch_geometry(manifest: Manifest, dims: dict[str, int]
                    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) for `dims`; see LaunchPlan.geometry."""
    return LaunchPlan(manifest).geometry(dims)
