"""Metal backend of the thin runtime: MSL source (the artifact) compiled on the Mac that runs
it, through PyObjC's Metal framework (`pip install pyobjc-framework-Metal`) for numpy arrays
and CPU tensors, or through `torch.mps.compile_shader` for torch MPS tensors. No TVM, no
compiler package: a host without Metal (any non-Mac) gets a LaunchError saying so on the
first call (tiled's CompiledKernel.emulate runs Metal kernels on the CPU instead).

PyObjC path, per device: the source is compiled once at the manifest's MSL version with fast
math off (`newLibraryWithSource:options:error:`), the pipeline state is made and cached
(`newComputePipelineStateWithFunction:error:`), and a threadgroup larger than its
`maxTotalThreadsPerThreadgroup` or more threadgroup memory than the device has is refused.
Each call copies the tensors into shared buffers, binds them at the manifest's buffer
indices (`setBuffer:offset:atIndex:`), the scalar-argument struct with
`setBytes:length:atIndex:`, dispatches `dispatchThreadgroups:threadsPerThreadgroup:` with
the manifest's grid and block, waits, and copies the tensors back. torch path: the
library from `torch.mps.compile_shader` (once per kernel), called with the tensors and the
struct (an MPS uint8 tensor) in buffer order, threads = grid x block, group_size = block, on
torch's MPS stream (torch's own compile options apply there).

Not yet run on an Apple GPU: no machine of this project is a Mac. What runs here is the
argument checking and packing (`ArgsPlan`), the clear error without Metal, and the PyObjC
call sequence against a stand-in Metal module (tests/runtime/test_metal.py).
"""

from __future__ import annotations

import ctypes
import struct
import threading

from tiled.errors import LaunchError
from tiled.ir import dtypes
from tiled.runtime import Kernel
from tiled.runtime.args import BoundArgs, bind_args, dim_arg, scalar_bits
from tiled.runtime.launch import LaunchPlan
from tiled.runtime.manifest import Manifest
from tiled.runtime.metal_abi import pack_args

LANGUAGE_VERSIONS = {"3.0": (3 << 16) | 0, "3.1": (3 << 16) | 1, "3.2": (3 << 16) | 2}
STORAGE_MODE_SHARED = 0  # MTLResourceStorageModeShared
STATUS_COMPLETED = 4  # MTLCommandBufferStatusCompleted
GPU_FAMILY_APPLE = {"apple7": 1007, "apple8": 1008, "apple9": 1009}  # MTLGPUFamilyApple7..9
_FORMATS = {"bool": "<?", "int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q",
            "uint8": "<B", "uint16": "<H", "uint32": "<I", "uint64": "<Q", "float32": "<f"}
NO_METAL = ("Metal kernels run on macOS with a Metal device, through PyObjC's Metal framework "
            "(pip install pyobjc-framework-Metal) or torch MPS tensors; tiled's "
            "CompiledKernel.emulate runs them on the CPU instead")


class ArgsPlan:
    """The scalar-argument struct of a kernel, packed from checked arguments at the offsets
    of the manifest's `metal` record. Pure: no Metal call."""

    def __init__(self, manifest: Manifest):
        rec = manifest.metal
        if rec is None:
            raise LaunchError(f"{manifest.name}: a metal manifest without its metal record")
        self.manifest, self.rec = manifest, rec
        self.buffers: dict[int, int] = {}  # param index -> buffer index
        self._fields = []
        for ka, b in zip(manifest.kernel_args, rec["bindings"], strict=True):
            if ka.kind == "tensor":
                self.buffers[ka.param] = b["buffer"]  # type: ignore[index]
                continue
            dt = ka.dtype if ka.kind == "dim" else \
                manifest.params[ka.param].dtype  # type: ignore[index]
            # 16-bit floats go as their bits (args.scalar_bits)
            fmt = "<H" if dt in ("float16", "bfloat16") else _FORMATS.get(dt)  # type: ignore[arg-type]
            if fmt is None or struct.calcsize(fmt) != b["size"]:
                raise LaunchError(f"{manifest.name}: a {dt} argument cannot fill a "
                                  f"{b['size']}-byte slot of the Metal argument struct")
            self._fields.append((ka, fmt))

    def pack(self, bound: BoundArgs) -> bytes:
        """The struct's bytes (b"" when the kernel takes none)."""
        if self.rec["args_buffer"] is None:
            return b""
        values, fields = [], iter(self._fields)
        for ka in self.manifest.kernel_args:
            if ka.kind == "tensor":
                values.append(None)
                continue
            _, fmt = next(fields)
            if ka.kind == "dim":
                value = dim_arg(self.manifest.name, ka.name, bound.dims[ka.name], fmt,
                                ka.dtype)  # type: ignore[index]
            else:
                value = scalar_bits(bound.values[ka.param],  # type: ignore[index]
                                    self.manifest.params[ka.param].dtype)  # type: ignore[index]
            values.append(struct.pack(fmt, value))
        return pack_args(self.rec, self.manifest.kernel_args, values)

    @property
    def args_buffer(self) -> int | None:
        return self.rec["args_buffer"]


def metal_module():
    """PyObjC's Metal framework, or LaunchError naming what is missing."""
    try:
        import Metal  # type: ignore[import-not-found]
    except ImportError:
        raise LaunchError(f"no Metal here: PyObjC's Metal framework is not importable. "
                          f"{NO_METAL}") from None
    return Metal


class _Device:
    """One Metal device: the kernel's library and pipeline state on it, its command queue."""

    def __init__(self, mtl, device, manifest: Manifest, source: str):
        m = manifest
        options = mtl.MTLCompileOptions.alloc().init()
        options.setLanguageVersion_(LANGUAGE_VERSIONS[m.metal["language_version"]])
        options.setFastMathEnabled_(bool(m.metal["fast_math"]))
        library, error = device.newLibraryWithSource_options_error_(source, options, None)
        if library is None:
            raise LaunchError(f"{m.name}: Metal could not compile the kernel's MSL: {error}")
        function = library.newFunctionWithName_(m.symbol)
        if function is None:
            raise LaunchError(f"{m.name}: the MSL library has no kernel {m.symbol}")
        pso, error = device.newComputePipelineStateWithFunction_error_(function, None)
        if pso is None:
            raise LaunchError(f"{m.name}: no compute pipeline state for {m.symbol}: {error}")
        self.mtl, self.device, self.pso = mtl, device, pso
        self.max_threads = int(pso.maxTotalThreadsPerThreadgroup())
        memory = int(device.maxThreadgroupMemoryLength())
        if m.metal["threadgroup_bytes"] > memory:
            raise LaunchError(f"{m.name}: needs {m.metal['threadgroup_bytes']} bytes of "
                              f"threadgroup memory, {device.name()} has {memory}")
        self.queue = device.newCommandQueue()


class MetalKernel(Kernel):
    """A Metal kernel from its MSL source. Nothing touches Metal until the first call; the
    source is then compiled once per device (PyObjC) or once (torch). Calls are thread-safe.
    Raises LaunchError for bad arguments, a host without Metal, a threadgroup the pipeline
    cannot run, or a failed command buffer (its error named)."""

    def __init__(self, artifact: bytes, manifest: Manifest):
        try:
            self._source = bytes(artifact).decode("utf-8")
        except UnicodeDecodeError:
            raise LaunchError(f"{manifest.name}: a metal artifact is MSL source, UTF-8; these "
                              "bytes are not") from None
        if f"kernel void {manifest.symbol}(" not in self._source:
            raise LaunchError(f"{manifest.name}: the MSL source defines no kernel "
                              f"{manifest.symbol}")
        self.manifest = manifest
        self._plan = LaunchPlan(manifest)  # grid / block from the dims (geometry only)
        self._args = ArgsPlan(manifest)
        self._devices: dict[int, _Device] = {}
        self._torch_fn = None
        self._lock = threading.Lock()

    def __call__(self, *args) -> None:
        first = next((a for a, p in zip(args, self.manifest.params, strict=False)
                      if p.kind == "tensor"), None)
        on_mps = getattr(getattr(first, "device", None), "type", None) == "mps"
        bound = bind_args(self.manifest.params, args, "mps" if on_mps else "cpu")
        grid, block = self._plan.geometry(bound.dims)
        if 0 in grid:
            return
        struct_bytes = self._args.pack(bound)
        if on_mps:
            return self._launch_torch(bound, grid, block, struct_bytes)
        return self._launch_objc(bound, grid, block, struct_bytes)

    def _check_block(self, max_threads: int, block) -> None:
        threads = block[0] * block[1] * block[2]
        if threads > max_threads:
            raise LaunchError(f"{self.manifest.name}: {threads} threads per threadgroup, but "
                              f"this device's pipeline for {self.manifest.symbol} runs at most "
                              f"{max_threads} (maxTotalThreadsPerThreadgroup): compile with "
                              "fewer threads")

    def _device(self) -> _Device:
        mtl = metal_module()
        with self._lock:
            if 0 not in self._devices:
                device = mtl.MTLCreateSystemDefaultDevice()
                if device is None:
                    raise LaunchError(f"no Metal device: MTLCreateSystemDefaultDevice() "
                                      f"returned none. {NO_METAL}")
                self._devices[0] = _Device(mtl, device, self.manifest, self._source)
            return self._devices[0]

    def _launch_objc(self, bound: BoundArgs, grid, block, struct_bytes: bytes) -> None:
        d = self._device()
        self._check_block(d.max_threads, block)
        mtl = d.mtl
        staged = []  # (buffer, tensor view, nbytes)
        cmd = d.queue.commandBuffer()
        enc = cmd.computeCommandEncoder()
        enc.setComputePipelineState_(d.pso)
        for param, index in self._args.buffers.items():
            view = bound.values[param]
            n = view.numel * dtypes.nbytes(self.manifest.params[param].dtype)  # type: ignore
            buf = d.device.newBufferWithLength_options_(max(n, 16), STORAGE_MODE_SHARED)
            if buf is None:
                raise LaunchError(f"{self.manifest.name}: cannot allocate a {n}-byte Metal "
                                  "buffer")
            if n:
                contents = buf.contents().as_buffer(n)
                contents[:n] = ctypes.string_at(view.ptr, n)  # type: ignore[union-attr]
            enc.setBuffer_offset_atIndex_(buf, 0, index)
            staged.append((buf, view, n))
        if self._args.args_buffer is not None:
            enc.setBytes_length_atIndex_(struct_bytes, len(struct_bytes),
                                         self._args.args_buffer)
        enc.dispatchThreadgroups_threadsPerThreadgroup_(mtl.MTLSizeMake(*grid),
                                                        mtl.MTLSizeMake(*block))
        enc.endEncoding()
        cmd.commit()
        cmd.waitUntilCompleted()
        if cmd.status() != STATUS_COMPLETED:
            raise LaunchError(f"{self.manifest.name}: the Metal command buffer failed "
                              f"(status {cmd.status()}): {cmd.error()}")
        for buf, view, n in staged:
            if n:
                data = bytes(buf.contents().as_buffer(n)[:n])
                ctypes.memmove(view.ptr, data, n)  # type: ignore[union-attr]

    def _launch_torch(self, bound: BoundArgs, grid, block, struct_bytes: bytes) -> None:
        import torch

        with self._lock:
            if self._torch_fn is None:
                try:
                    library = torch.mps.compile_shader(self._source)
                except (RuntimeError, AttributeError) as e:
                    raise LaunchError(f"{self.manifest.name}: torch.mps.compile_shader failed: "
                                      f"{e}") from None
                self._torch_fn = getattr(library, self.manifest.symbol)
        fn = self._torch_fn
        max_threads = getattr(fn, "max_threads_per_threadgroup", None)
        if max_threads is not None:
            self._check_block(int(max_threads), block)
        by_index = {index: bound.values[param].obj  # type: ignore[union-attr]
                    for param, index in self._args.buffers.items()}
        if self._args.args_buffer is not None:
            by_index[self._args.args_buffer] = torch.frombuffer(
                bytearray(struct_bytes), dtype=torch.uint8).to("mps")
        if sorted(by_index) != list(range(len(by_index))):
            raise LaunchError(f"{self.manifest.name}: buffer indices {sorted(by_index)} are "
                              "not 0..n-1, which torch.mps kernels take in order")
        fn(*(by_index[i] for i in range(len(by_index))),
           threads=[g * b for g, b in zip(grid, block, strict=True)], group_size=list(block))


def local_arch() -> str | None:
    """The Apple GPU family of the default Metal device as a tiled arch ("apple9"), or None
    without Metal (or for a device older than Apple7)."""
    try:
        mtl = metal_module()
    except LaunchError:
        return None
    device = mtl.MTLCreateSystemDefaultDevice()
    if device is None:
        return None
    for arch in ("apple9", "apple8", "apple7"):
        if device.supportsFamily_(GPU_FAMILY_APPLE[arch]):
            return arch
    return None


__all__ = ["ArgsPlan", "MetalKernel", "local_arch", "metal_module"]
