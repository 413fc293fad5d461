"""ROCm backend of the thin runtime: an HSACO code object launched through the HIP module API
(hipModuleLoadData, hipModuleGetFunction, hipModuleLaunchKernel) by ctypes on
libamdhip64.so (ROCm 5.x or 6.x). No TVM, no ROCm install at compile time, no Python package
beyond numpy / torch: the library is opened on the first launch, and a host without it (or
without an AMD GPU) gets a LaunchError saying so.

Arguments get the checks a CUDA launch gets (tiled.runtime.args: dtypes, shapes, symbolic
dims, contiguity, alignment; ROCm torch tensors are "cuda" tensors); the kernel's argument
buffer is packed at the offsets of the manifest's code_object.kernarg (read from the code
object's own metadata by the compiler, so the buffer is laid out as the kernel reads it) and
passed with HIP_LAUNCH_PARAM_BUFFER_POINTER. Calls run on torch's current stream (HIP's,
on ROCm torch) unless given one. Thread-safe: the module is loaded once per device.

Not yet run on an AMD GPU: no machine of this project has one. What runs here is the
argument checking and packing (`KernargPlan`) and the clear error without ROCm.
"""

from __future__ import annotations

import ctypes
import re
import struct
import threading

from tiled.errors import LaunchError
from tiled.runtime import Kernel
from tiled.runtime.args import BoundArgs, TensorView, bind_args, dim_arg, scalar_bits
from tiled.runtime.cuda import current_stream, stream_handle
from tiled.runtime.launch import LaunchPlan
from tiled.runtime.manifest import Manifest

HIP_LIBRARIES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")
HIP_LAUNCH_PARAM_BUFFER_POINTER = 0x01
HIP_LAUNCH_PARAM_BUFFER_SIZE = 0x02
HIP_LAUNCH_PARAM_END = 0x03
EM_AMDGPU = 224
EMPTY_BYTES = 256
MACH = {0x3F: "gfx90a", 0x4C: "gfx942"}  # EF_AMDGPU_MACH of the archs tiled builds
_ARCH_NAME = re.compile(rb"(gfx[0-9a-f]{3,4})((?::[a-z]+[+-])*)\x00")
_SCALARS = {"bool": "<?", "int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q",
            "uint8": "<B", "uint16": "<H", "uint32": "<I", "uint64": "<Q", "float32": "<f",
            "float64": "<d"}


def check_code_object(artifact: bytes, manifest: Manifest) -> None:
    """The artifact is an AMDGPU code object for the manifest's arch (ELF header only)."""
    if len(artifact) < 64 or artifact[:4] != b"\x7fELF":
        raise LaunchError(f"{manifest.name}: the artifact is not an ELF code object")
    machine, = struct.unpack_from("<H", artifact, 18)
    flags, = struct.unpack_from("<I", artifact, 48)
    arch = MACH.get(flags & 0xFF, f"mach {flags & 0xFF:#x}")
    if machine != EM_AMDGPU or arch != manifest.arch:
        raise LaunchError(f"{manifest.name}: the artifact is an ELF for machine {machine} / "
                          f"{arch}, the manifest says AMDGPU {manifest.arch}")


class KernargPlan:
    """The kernel's argument buffer, packed from checked arguments at the code object's
    offsets (manifest.code_object.kernarg). Pure: no HIP call."""

    def __init__(self, manifest: Manifest):
        co = manifest.code_object
        if co is None:
            raise LaunchError(f"{manifest.name}: a rocm manifest without code_object")
        self.manifest = manifest
        self.size = co["kernarg_size"]
        self._fields = []
        for ka, slot in zip(manifest.kernel_args, co["kernarg"], strict=True):
            if ka.kind == "tensor":
                fmt = "<Q"
            elif ka.kind == "dim":
                fmt = {"int32": "<i", "int64": "<q", "uint32": "<I", "uint64": "<Q"}[ka.dtype]
            elif ka.kind == "scalar":
                dt = manifest.params[ka.param].dtype  # type: ignore[index]
                fmt = "<H" if dt in ("float16", "bfloat16") else _SCALARS.get(dt)
                if fmt is None:
                    raise LaunchError(f"{manifest.name}: {dt} scalars cannot be passed to a "
                                      "ROCm kernel")
            else:
                raise LaunchError(f"{manifest.name}: a {ka.kind} argument has no ROCm form")
            if struct.calcsize(fmt) != slot["size"]:
                raise LaunchError(f"{manifest.name}: kernel argument {len(self._fields)} takes "
                                  f"{slot['size']} bytes, {ka.kind} values are "
                                  f"{struct.calcsize(fmt)}")
            self._fields.append((ka, slot["offset"], fmt))

    def pack(self, bound: BoundArgs) -> bytearray:
        buf = bytearray(self.size)
        for ka, offset, fmt in self._fields:
            if ka.kind == "tensor":
                value = bound.values[ka.param].ptr  # type: ignore[union-attr,index]
            elif ka.kind == "dim":
                value = dim_arg(self.manifest.name, ka.name, bound.dims[ka.name], fmt,
                                ka.dtype)  # type: ignore[index]
            else:
                value = scalar_bits(bound.values[ka.param],  # type: ignore[index]
                                    self.manifest.params[ka.param].dtype)  # type: ignore[index]
            struct.pack_into(fmt, buf, offset, value)
        return buf


class _Hip:
    """The HIP calls the launcher makes, each checked (hipGetErrorName in the message)."""

    def __init__(self) -> None:
        lib, errors = None, []
        for name in HIP_LIBRARIES:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append(str(e))
        if lib is None:
            raise LaunchError("the ROCm runtime is not installed: no libamdhip64.so (ROCm 5.x or "
                              "6.x) could be loaded; rocm kernels need an AMD GPU with ROCm "
                              "(tiled's CompiledKernel.emulate runs them on the CPU instead). "
                              f"Tried: {'; '.join(errors)}")
        self.lib = lib
        self._empty: dict[int, int] = {}
        lib.hipGetErrorName.restype = ctypes.c_char_p
        count = ctypes.c_int(0)
        err = lib.hipGetDeviceCount(ctypes.byref(count))
        if err != 0 or count.value == 0:
            why = lib.hipGetErrorName(err).decode() if err else "0 devices"
            raise LaunchError(f"no ROCm GPU: libamdhip64.so is installed but hipGetDeviceCount "
                              f"reports {why} (CompiledKernel.emulate runs rocm kernels on the "
                              "CPU)")

    def current_device(self) -> int:
        dev = ctypes.c_int(0)
        self.call("hipGetDevice", ctypes.byref(dev))
        return dev.value

    def empty_buffer(self, device: int) -> int:
        """A device pointer to EMPTY_BYTES zeros on `device` (the current device), allocated
        once, where an empty tensor argument points."""
        with _hip_lock:
            ptr = self._empty.get(device)
            if ptr is None:
                p = ctypes.c_void_p()
                self.call("hipMalloc", ctypes.byref(p), ctypes.c_size_t(EMPTY_BYTES))
                self.call("hipMemset", p, 0, ctypes.c_size_t(EMPTY_BYTES))
                ptr = self._empty[device] = int(p.value or 0)
            return ptr

    def call(self, name: str, *args) -> None:
        err = getattr(self.lib, name)(*args)
        if err != 0:
            raise LaunchError(f"{name} failed: {self.lib.hipGetErrorName(err).decode()} ({err})")

    def arch(self, device: int) -> str:
        """The device's gcnArchName without its feature suffix ("gfx942"). The property struct
        changed size across ROCm versions: the name is found in a buffer that holds any."""
        buf = ctypes.create_string_buffer(16384)
        fn = getattr(self.lib, "hipGetDevicePropertiesR0600", None) or \
            self.lib.hipGetDeviceProperties
        err = fn(buf, device)
        if err != 0:
            raise LaunchError(f"hipGetDeviceProperties failed: "
                              f"{self.lib.hipGetErrorName(err).decode()}")
        m = _ARCH_NAME.search(buf.raw)
        if m is None:
            raise LaunchError(f"device {device}: no gcnArchName in its HIP properties")
        return m.group(1).decode()


_hip: _Hip | None = None
_hip_lock = threading.Lock()


def hip() -> _Hip:
    """The HIP library, opened once per process. Raises LaunchError without ROCm."""
    global _hip
    with _hip_lock:
        if _hip is None:
            _hip = _Hip()
        return _hip


def local_arch() -> str | None:
    """The gfx arch of ROCm device 0 ("gfx942"), or None without ROCm or a device."""
    try:
        return hip().arch(0)
    except LaunchError:
        return None


class ROCmKernel(Kernel):
    """A ROCm kernel from HSACO bytes. Nothing touches HIP until the first call; the module is
    then loaded once per device. Raises LaunchError for bad arguments, a device of another
    arch, or any failing HIP call (named)."""

    def __init__(self, artifact: bytes, manifest: Manifest):
        check_code_object(artifact, manifest)
        self.manifest = manifest
        self._hsaco = artifact
        self._plan = LaunchPlan(manifest)  # grid / block from the dims (geometry only)
        self._kernarg = KernargPlan(manifest)
        self._functions: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()
        # Tensors that may be empty (a symbolic dim may be 0): their pointer may be NULL.
        self._may_be_empty = [i for i, p in enumerate(manifest.params) if p.kind == "tensor"
                              and any(isinstance(d, str) for d in p.shape or ())]

    def __call__(self, *args, stream: object = None) -> None:
        bound = bind_args(self.manifest.params, args, "cuda")
        grid, block = self._plan.geometry(bound.dims)
        if 0 in grid:
            return
        h = hip()
        caller = h.current_device()
        device = bound.device_index if bound.device_index is not None else caller
        if device != caller:
            h.call("hipSetDevice", device)
        try:  # in the tensors' device; the caller's current device is restored after
            function = self._functions.get(device) or self._load(h, device)
            handle = stream_handle(stream) if stream is not None else \
                current_stream(bound, device)
            for i in self._may_be_empty:
                view = bound.values[i]
                if 0 in view.shape:  # type: ignore[union-attr]
                    # A guarded load still forms its (clamped) address: never NULL.
                    view.ptr = h.empty_buffer(device)  # type: ignore[union-attr]
            args_buf = self._kernarg.pack(bound)
            raw = (ctypes.c_char * max(1, len(args_buf))).from_buffer(args_buf)
            size = ctypes.c_size_t(len(args_buf))
            extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER,
                                          ctypes.addressof(raw), HIP_LAUNCH_PARAM_BUFFER_SIZE,
                                          ctypes.addressof(size), HIP_LAUNCH_PARAM_END)
            h.call("hipModuleLaunchKernel", function, *map(ctypes.c_uint, grid),
                   *map(ctypes.c_uint, block), ctypes.c_uint(0), ctypes.c_void_p(handle), None,
                   extra)
        finally:
            if device != caller:
                h.call("hipSetDevice", caller)

    def _load(self, h: _Hip, device: int) -> ctypes.c_void_p:
        """The kernel's function on `device`, the current device (module loaded once)."""
        with self._lock:
            if device in self._functions:
                return self._functions[device]
            arch = h.arch(device)
            if arch != self.manifest.arch:
                raise LaunchError(f"{self.manifest.name}: compiled for {self.manifest.arch}, "
                                  f"but device {device} is {arch}")
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            h.call("hipModuleLoadData", ctypes.byref(module), self._hsaco)
            h.call("hipModuleGetFunction", ctypes.byref(function), module,
                   self.manifest.symbol.encode())
            self._functions[device] = function
            return function


__all__ = ["KernargPlan", "ROCmKernel", "TensorView", "check_code_object", "hip", "local_arch"]
