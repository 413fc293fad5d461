"""CUDA backend: a cubin loaded and launched through the driver API (`cuda-bindings`, imported
on first launch). The pure parts (launch geometry, kernel parameter packing: LaunchPlan) live
in tiled.runtime.launch; the driver calls in `_Driver` and `CUDAKernel`.

Contexts: a kernel runs in the primary context of its tensors' device (the one torch and cupy
use). When another context is current on the calling thread, the right one is pushed for the
call and popped after, so the caller's current device never changes.

Thread-safety: calls may run concurrently; module loading is serialised per kernel.

TMA descriptors (kernel_args of kind "tensor_map") are encoded on the host at launch by
cuTensorMapEncodeTiled (driver_tensor_map), once per (argument, pointer, shape, strides): see
LaunchPlan.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from tiled.errors import LaunchError
from tiled.runtime import Kernel
from tiled.runtime.args import BoundArgs, FastBinder, TensorView, bind_fast
from tiled.runtime.launch import (
    TENSOR_MAP_BYTES,
    LaunchPlan,
    TensorMapEncoder,
    TensorMapRequest,
    tensor_map_encode_args,
)
from tiled.runtime.manifest import (
    SM_COUNT_DIM,
    Manifest,
    compile_expr,
)

DEFAULT_SMEM_LIMIT = 48 * 1024  # beyond this a kernel must opt in (cuFuncSetAttribute)


def driver_tensor_map(request: TensorMapRequest) -> bytes:
    """The 128 descriptor bytes for `request`, from the driver (loaded on first use): the
    encoder of CUDAKernel's LaunchPlan. Raises LaunchError when the driver refuses."""
    return (_driver or driver()).encode_tensor_map(request)


def pack_kernel_params(manifest: Manifest, bound: BoundArgs,
                       encode_tensor_map: TensorMapEncoder | None = None) -> ctypes.Array:
    """A `void**` kernelParams array for `bound` that owns its storage; see LaunchPlan.pack."""
    plan = LaunchPlan(manifest, encode_tensor_map or driver_tensor_map)
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
        self._plan = LaunchPlan(manifest, driver_tensor_map)
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
        attrs = []
        if m.cluster != (1, 1, 1) and loaded.compiled_cluster is None:
            # Cluster dims chosen at launch time (cuLaunchKernelEx).
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = \
                m.cluster
            attrs.append(attr)
        if m.pdl:  # T.pdl_sync: the kernel may start before the stream's earlier ones end
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if not attrs:
            drv.call("cuLaunchKernel", loaded.function, *grid, *block, m.dynamic_smem_bytes,
                     stream, params_addr, 0)
            return
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = m.dynamic_smem_bytes
        config.hStream = cu.CUstream(stream)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        drv.call("cuLaunchKernelEx", config, loaded.function, params_addr, 0)
