"""CUDA backend: a cubin loaded and launched through the driver API (`cuda-bindings`, imported
on first launch). The pure parts (launch geometry, kernel parameter packing) are plain
functions; the driver calls live in `_Driver` and `CUDAKernel`.

Contexts: a kernel runs in the primary context of its tensors' device (the one torch and cupy
use). When another context is current on the calling thread, the right one is pushed for the
call and popped after, so the caller's current device never changes.

Thread-safety: calls may run concurrently; module loading is serialised per kernel.

TMA descriptors (kernel_args of kind "tensor_map") are encoded on the host at launch by
cuTensorMapEncodeTiled, once per (argument, pointer, shape, strides): see LaunchPlan.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime import Kernel
from tiled.runtime.args import BoundArgs, FastBinder, TensorView, bind_fast, scalar_bits
from tiled.runtime.manifest import (
    SM_COUNT_DIM,
    KernelArg,
    Manifest,
    Param,
    compile_expr,
    expr_names,
)

DEFAULT_SMEM_LIMIT = 48 * 1024  # beyond this a kernel must opt in (cuFuncSetAttribute)
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


def encode_tensor_map(request: TensorMapRequest) -> bytes:
    """The 128 descriptor bytes for `request`, from the driver (loaded on first use). The
    default encoder of a LaunchPlan. Raises LaunchError when the driver refuses."""
    return (_driver or driver()).encode_tensor_map(request)


class LaunchPlan:
    """A manifest's launch, compiled once per kernel: grid / block functions of the dims and
    a kernel parameter buffer layout. `geometry` is pure; so is `pack`, except that a
    "tensor_map" argument calls `encode_tensor_map` (a TensorMapRequest -> 128 bytes; default:
    the driver's cuTensorMapEncodeTiled, reached only when such an argument exists).

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
        encode = self._encode or encode_tensor_map
        try:
            desc = bytes(encode(request))
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


def pack_kernel_params(manifest: Manifest, bound: BoundArgs,
                       encode_tensor_map: TensorMapEncoder | None = None) -> ctypes.Array:
    """A `void**` kernelParams array for `bound` that owns its storage; see LaunchPlan.pack."""
    plan = LaunchPlan(manifest, encode_tensor_map)
    array = plan.pack(bound)
    array._owner = plan  # the values live in the plan's buffer
    return array


def stream_handle(stream: object) -> int:
    """A CUstream address from an int, a torch.cuda.Stream (`.cuda_stream`), a cupy stream
    (`.ptr`) or an object with `__cuda_stream__` (cuda.core)."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise LaunchError(f"stream: cannot get a CUDA stream handle from {type(stream).__name__}")


def _torch_stream(device: int) -> int:
    torch = sys.modules["torch"]
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is not None:  # what Triton and Inductor use: an int, no Stream object
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def current_stream(bound: BoundArgs, device: int) -> int:
    """The stream a call without an explicit stream runs on: torch's current stream when a
    torch tensor is involved, else cupy's current stream, else the legacy default stream."""
    if bound.uses_torch:
        return _torch_stream(device)
    if any(isinstance(v, TensorView) and v.framework == "cuda_array_interface"
           and type(v.obj).__module__.startswith("cupy") for v in bound.values):
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return 0


# --- driver ----------------------------------------------------------------------------------


class _Driver:
    """The few driver calls the launcher makes; each checks its CUresult."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            try:
                from cuda import cuda as cu  # cuda-python 11.x / early 12.x layout
            except ImportError:
                raise LaunchError("the CUDA runtime needs the cuda-bindings package "
                                  "(pip install cuda-bindings)") from None
        self.cu = cu
        try:
            self.call("cuInit", 0)
        except RuntimeError as e:  # cuda-bindings 13 loads libcuda here and raises if it is absent
            raise LaunchError(f"cuInit failed: no usable CUDA driver ({e})") from None

    def call(self, name: str, *args):
        result = getattr(self.cu, name)(*args)
        err, rest = result[0], result[1:]
        if int(err) != 0:
            raise LaunchError(f"{name} failed: {self.error_name(err)}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def error_name(self, err) -> str:
        """"CUDA_ERROR_X (description)" for a CUresult."""
        try:
            _, name = self.cu.cuGetErrorName(err)
            ok, desc = self.cu.cuGetErrorString(err)
        except (AttributeError, TypeError, ValueError):  # naming must not hide the error
            return f"CUresult {int(err)}"
        name = name.decode() if isinstance(name, bytes) else str(name)
        desc = desc.decode() if isinstance(desc, bytes) else str(desc)
        return f"{name} ({desc})" if int(ok) == 0 else name

    def make_current(self, ctx) -> bool:
        """Makes `ctx` current on this thread; True when it had to be pushed (then pop())."""
        err, current = self.cu.cuCtxGetCurrent()
        if int(err) == 0 and int(current) == int(ctx):
            return False
        self.call("cuCtxPushCurrent", ctx)
        return True

    def pop(self) -> None:
        self.call("cuCtxPopCurrent")

    @contextlib.contextmanager
    def context(self, ctx) -> Iterator[None]:
        """Makes `ctx` current for the block when it is not already."""
        pushed = self.make_current(ctx)
        try:
            yield
        finally:
            if pushed:
                self.pop()

    def device_of_pointer(self, ptr: int) -> int:
        attr = self.cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(self.call("cuPointerGetAttribute", attr, ptr))

    def encode_tensor_map(self, request: TensorMapRequest) -> bytes:
        """The CUtensorMap for `request` as its 128 bytes (cuda-bindings' CUtensorMap is
        64-byte aligned storage; getPtr() is its address)."""
        tensor_map = self.call("cuTensorMapEncodeTiled",
                               *tensor_map_encode_args(self.cu, request))
        return ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)


_driver: _Driver | None = None
_driver_lock = threading.Lock()


def driver() -> _Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


@dataclass
class _Loaded:
    """The kernel as loaded on one device."""

    ctx: object
    module: object
    function: object
    compiled_cluster: tuple[int, int, int] | None  # cluster dims fixed in the cubin, if any


_SM_COUNTS: dict[int, int] = {}  # device ordinal -> multiprocessors
_EMPTY_PTRS: dict[int, int] = {}  # device ordinal -> 256 zeroed bytes that empty tensors point at
_EMPTY_BYTES = 256


def _empty_tensor_ptr(drv: _Driver, device: int) -> int:
    """A device pointer to _EMPTY_BYTES zeros, allocated once per device (in its current
    context), where an empty tensor argument points."""
    ptr = _EMPTY_PTRS.get(device)
    if ptr is None:
        ptr = int(drv.call("cuMemAlloc", _EMPTY_BYTES))
        drv.call("cuMemsetD8", ptr, 0, _EMPTY_BYTES)
        _EMPTY_PTRS[device] = ptr
    return ptr


class CUDAKernel(Kernel):
    """A CUDA kernel from cubin bytes. Nothing touches the driver until the first call; the
    module is then loaded once per device. Raises LaunchError for bad arguments, a missing
    symbol or any failing driver call (named, e.g. CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, artifact: bytes, manifest: Manifest):
        self.manifest = manifest
        self._cubin = artifact
        self._binder = FastBinder(manifest.params, "cuda")
        self._plan = LaunchPlan(manifest)
        self._loaded: dict[int, _Loaded] = {}
        self._lock = threading.Lock()
        # Launch preconditions, and the variant (same cubin) for calls that fail one.
        self._requires = [compile_expr(e) for e in manifest.requires]
        # Tensors that may be empty (a symbolic dim may be 0): their pointer may be NULL.
        self._may_be_empty = [i for i, p in enumerate(manifest.params) if p.kind == "tensor"
                              and any(isinstance(d, str) for d in p.shape or ())]
        self._fallback = CUDAKernel(artifact, manifest.fallback_manifest()) \
            if manifest.fallback is not None else None

    def __call__(self, *args, stream: object = None) -> None:
        bound = bind_fast(self._binder, args)
        if self._requires and any(f(bound.dims) for f in self._requires):
            if self._fallback is None:
                failed = [e for e, f in zip(self.manifest.requires, self._requires,
                                            strict=True) if f(bound.dims)]
                raise LaunchError(f"{self.manifest.name}: dims {bound.dims} fail the kernel's "
                                  f"launch precondition(s) {failed} (each must be 0): its TMA "
                                  f"descriptors need rows a multiple of 16 bytes apart")
            return self._fallback(*args, stream=stream)
        located = None
        dims = bound.dims
        if self._plan.uses_sm_count:  # a persistent kernel: its grid depends on the device
            located = drv, device = self._locate(bound)
            dims = {**dims, SM_COUNT_DIM: self._sm_count(drv, device)}
        grid, block = self._plan.geometry(dims)
        if 0 in grid:
            return
        drv, device = located or self._locate(bound)
        loaded = self._loaded.get(device) or self._load(drv, device)
        if stream is not None:
            handle = stream_handle(stream)
        elif bound.uses_torch:
            handle = _torch_stream(device)
        else:
            handle = current_stream(bound, device)
        pushed = drv.make_current(loaded.ctx)
        try:
            for i in self._may_be_empty:
                view = bound.values[i]
                if 0 in view.shape:  # type: ignore[union-attr]
                    # A guarded load of an empty tensor still forms its (clamped) address:
                    # it must point at readable memory, never at NULL.
                    view.ptr = _empty_tensor_ptr(drv, device)  # type: ignore[union-attr]
            # packed in the kernel's context: encoding a tensor_map is a driver call
            params = self._plan.pack(bound)
            self._launch(drv, loaded, grid, block, handle, ctypes.addressof(params))
        finally:
            if pushed:
                drv.pop()

    def _locate(self, bound: BoundArgs) -> tuple[_Driver, int]:
        """The driver and the device the call's tensors live on."""
        drv = _driver or driver()
        device = bound.device_index if bound.device_index is not None else \
            self._device(drv, bound)
        return drv, device

    def _sm_count(self, drv: _Driver, device: int) -> int:
        count = _SM_COUNTS.get(device)
        if count is None:
            dev = drv.call("cuDeviceGet", device)
            attr = drv.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            count = _SM_COUNTS[device] = int(drv.call("cuDeviceGetAttribute", attr, dev))
        return count

    def _device(self, drv: _Driver, bound: BoundArgs) -> int:
        for v in bound.values:
            if isinstance(v, TensorView) and v.ptr:
                return drv.device_of_pointer(v.ptr)
        ctx = drv.call("cuCtxGetCurrent")
        return int(drv.call("cuCtxGetDevice")) if ctx is not None and int(ctx) else 0

    def _load(self, drv: _Driver, device: int) -> _Loaded:
        with self._lock:
            if device in self._loaded:
                return self._loaded[device]
            cu, m = drv.cu, self.manifest
            ctx = drv.call("cuDevicePrimaryCtxRetain", drv.call("cuDeviceGet", device))
            with drv.context(ctx):
                module = drv.call("cuModuleLoadData", self._cubin)
                try:
                    function = drv.call("cuModuleGetFunction", module, m.symbol.encode())
                except LaunchError as e:
                    raise LaunchError(f"{m.name}: cubin has no kernel {m.symbol!r}: {e}") from None
                attr = cu.CUfunction_attribute
                if m.dynamic_smem_bytes > DEFAULT_SMEM_LIMIT:
                    drv.call("cuFuncSetAttribute", function,
                             attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             m.dynamic_smem_bytes)
                compiled = None
                if hasattr(attr, "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH"):
                    dims = [int(drv.call("cuFuncGetAttribute",
                                         getattr(attr, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{a}"),
                                         function)) for a in ("WIDTH", "HEIGHT", "DEPTH")]
                    compiled = tuple(max(1, d) for d in dims) if dims[0] else None
                if compiled is not None and compiled != tuple(m.cluster):
                    raise LaunchError(f"{m.name}: the cubin fixes cluster dims {compiled} but "
                                      f"the manifest says {tuple(m.cluster)}")
            loaded = _Loaded(ctx, module, function, compiled)
            self._loaded[device] = loaded
            return loaded

    def _launch(self, drv: _Driver, loaded: _Loaded, grid, block, stream: int,
                params_addr: int) -> None:
        m, cu = self.manifest, drv.cu
        if m.cluster == (1, 1, 1) or loaded.compiled_cluster is not None:
            drv.call("cuLaunchKernel", loaded.function, *grid, *block, m.dynamic_smem_bytes,
                     stream, params_addr, 0)
            return
        # Cluster dims chosen at launch time need cuLaunchKernelEx.
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = m.cluster
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = m.dynamic_smem_bytes
        config.hStream = cu.CUstream(stream)
        config.attrs = [attr]
        config.numAttrs = 1
        drv.call("cuLaunchKernelEx", config, loaded.function, params_addr, 0)
