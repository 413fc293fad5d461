"""CPU backend: a shared library (TVM LLVM object + tiled's shim, see
tiled/compiler/toolchain/cc.py) loaded with ctypes and called through its TVM FFI safe-call
entry `__tvm_ffi_<name>` with one DLTensor* per tensor and an int / float per scalar.

A library is built for a CPU feature level (the manifest's arch, tiled.runtime.cpu_levels);
loading one whose level this host lacks raises LaunchError before its code is mapped.

The first library loaded lends its thread pool to every later one (the shim's `tiled_pool` /
`tiled_use_pool`): a process's CPU kernels share one set of worker threads, sized by
TILED_CPU_THREADS.

Thread-safety: calls may run concurrently (each builds its own argument structs; ctypes
releases the GIL for the call). Libraries are never unloaded: the kernel's thread pool may
still be parked in its code.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from pathlib import Path

from tiled import config
from tiled.errors import LaunchError
from tiled.runtime import Kernel, cpu_levels
from tiled.runtime.args import BoundArgs, FastBinder, TensorView, bind_fast
from tiled.runtime.dlpack import (
    DL_DTYPES,
    K_TVMFFI_BOOL,
    K_TVMFFI_DLTENSOR_PTR,
    K_TVMFFI_FLOAT,
    K_TVMFFI_INT,
    KDL_CPU,
    SAFE_CALL_ARGTYPES,
    DLDataType,
    DLDevice,
    DLTensor,
    TVMFFIAny,
)
from tiled.runtime.manifest import Manifest

# Empty tensors may have a NULL data pointer (torch), which TVM's entry rejects, or one to
# fewer bytes than an element (numpy); they get the address of this buffer instead, which a
# guarded load's clamped address may read (its value is discarded).
_EMPTY = (ctypes.c_uint8 * 128)()
_EMPTY_PTR = (ctypes.addressof(_EMPTY) + 63) & ~63


def _open_library(data: bytes, digest: str) -> ctypes.CDLL:
    """dlopens library bytes through a private file that is removed again once loaded. The
    file name carries the sha256, so the dynamic loader (which reuses a library when a path
    repeats) can only ever hand back a library with these very bytes."""
    errors = []
    for base in (None, Path(config.get("cache_dir")) / "tmp"):  # a noexec /tmp: try the cache
        try:
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            tmpdir = tempfile.mkdtemp(prefix="tiled-cpu-", dir=base)
        except OSError as e:
            errors.append(f"{base}: {e}")
            continue
        path = os.path.join(tmpdir, f"{digest}.so")
        try:
            with open(path, "wb") as f:
                f.write(data)
            return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            errors.append(str(e))
        finally:
            if os.path.exists(path):
                os.unlink(path)
            os.rmdir(tmpdir)
    raise LaunchError("cannot load the CPU kernel library: " + "; ".join(errors))


_POOL_LOCK = threading.Lock()
_pool: int | None = None  # the address of the process's pool (the first library's tiled_pool())
_pool_lib: ctypes.CDLL | None = None  # the library that owns it (its settings are the pool's)


def _share_pool(lib: ctypes.CDLL) -> bool:
    """Makes `lib` launch on the process's pool (True), or makes its pool the process's when
    it is the first (False). A library without the pool entry points (built before them) or
    of another pool ABI keeps its own (False)."""
    global _pool, _pool_lib
    try:
        own, use = lib.tiled_pool, lib.tiled_use_pool
    except AttributeError:
        return False
    own.restype, own.argtypes = ctypes.c_void_p, []
    use.restype, use.argtypes = ctypes.c_int, [ctypes.c_void_p]
    with _POOL_LOCK:
        if _pool is None:
            _pool, _pool_lib = own(), lib
            return False
        return use(_pool) == 0


def _set_spin(lib: ctypes.CDLL, us: int) -> None:
    """How long the pool's threads spin before they sleep (a library built before the
    setting has none: its threads sleep at once)."""
    fn = getattr(lib, "tiled_set_spin_us", None)
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        fn(us)


def set_pool_spin_us(us: int) -> None:
    """Sets how long the process's CPU pool threads spin between launches (TILED_CPU_SPIN_US
    at load; 0: sleep at once). No effect before a CPU kernel is loaded."""
    with _POOL_LOCK:
        lib = _pool_lib
    if lib is not None:
        _set_spin(lib, int(us))


class _Frame:
    """The ctypes arguments of a launch (TVM FFI Anys, DLTensors and their shape arrays), built
    for one set of tensor shapes and kept by the thread for its next launch with the same
    shapes, which then only writes the data pointers and the scalars: building them cost
    about 6 us of a one-block launch's 17."""

    __slots__ = ("anys", "keep", "result", "result_ref", "scalars", "shapes", "tensors")

    def __init__(self, shapes: tuple, dl_dtypes: list):
        self.shapes = shapes
        self.anys = (TVMFFIAny * len(shapes))()
        self.tensors: list[tuple[int, DLTensor, bool]] = []  # (position, tensor, empty)
        self.scalars: list[int] = []
        self.keep: list[object] = []  # the shape arrays the DLTensors point to
        for i, shape in enumerate(shapes):
            if shape is None:
                self.scalars.append(i)
                continue
            code, bits = dl_dtypes[i]
            dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            tensor = DLTensor(_EMPTY_PTR, DLDevice(KDL_CPU, 0), len(shape),
                              DLDataType(code, bits, 1), dims, None, 0)
            self.keep.append(dims)
            self.tensors.append((i, tensor, 0 in shape))
            self.anys[i].type_index = K_TVMFFI_DLTENSOR_PTR
            self.anys[i].v_ptr = ctypes.addressof(tensor)
        self.result = TVMFFIAny()
        self.result_ref = ctypes.byref(self.result)


def _bind(lib: ctypes.CDLL, name: str, restype, argtypes, what: str):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise LaunchError(f"{what}: the library has no symbol {name!r}") from None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


class CPUKernel(Kernel):
    """A CPU kernel loaded from `.so` bytes. Raises LaunchError when it was built for a CPU
    level this host lacks, or the library does not load or lacks the manifest's symbol or the
    tiled shim."""

    def __init__(self, artifact: bytes, manifest: Manifest):
        self.manifest = manifest
        cpu_levels.check_runs_here(manifest.name, manifest.arch)
        self._lib = _open_library(artifact, manifest.artifact_sha256)
        what = manifest.name
        self._fn = _bind(self._lib, manifest.symbol, ctypes.c_int, SAFE_CALL_ARGTYPES, what)
        self._last_error = _bind(self._lib, "tiled_last_error", ctypes.c_char_p, [],
                                 f"{what} (not linked with tiled's CPU shim)")
        self._set_threads = _bind(self._lib, "tiled_set_num_threads", ctypes.c_int,
                                  [ctypes.c_int], f"{what} (not linked with tiled's CPU shim)")
        if not _share_pool(self._lib):  # a pool of its own: sized here
            self._set_threads(int(config.get("cpu_threads")))
            _set_spin(self._lib, int(config.get("cpu_spin_us")))
        self._dl_dtypes = [DL_DTYPES[p.dtype] for p in manifest.params]
        self._binder = FastBinder(manifest.params, "cpu")
        self._frames = threading.local()  # each thread's last launch's ctypes arguments

    def set_num_threads(self, n: int) -> int:
        """Threads for the parallel loops of the process's CPU kernels (they share one pool;
        0: the CPUs usable); returns the count."""
        return int(self._set_threads(int(n)))

    def __call__(self, *args) -> None:
        self.launch(bind_fast(self._binder, args))

    def launch(self, bound: BoundArgs) -> None:
        """Runs the kernel on arguments already checked by bind_args."""
        values = bound.values
        shapes = tuple(v.shape if isinstance(v, TensorView) else None for v in values)
        frame = getattr(self._frames, "last", None)
        if frame is None or frame.shapes != shapes:
            frame = self._frames.last = _Frame(shapes, self._dl_dtypes)
        for i, tensor, empty in frame.tensors:
            ptr = values[i].ptr
            tensor.data = ptr if ptr and not empty else _EMPTY_PTR
        anys = frame.anys
        for i in frame.scalars:
            value = values[i]
            if isinstance(value, bool):
                anys[i].type_index, anys[i].v_int64 = K_TVMFFI_BOOL, int(value)
            elif isinstance(value, int):
                anys[i].type_index = K_TVMFFI_INT
                anys[i].v_int64 = value - (1 << 64) if value >= 1 << 63 else value  # uint64
            else:
                anys[i].type_index, anys[i].v_float64 = K_TVMFFI_FLOAT, value
        rc = self._fn(None, anys, len(values), frame.result_ref)
        if rc != 0:
            message = (self._last_error() or b"").decode("utf-8", "replace")
            raise LaunchError(f"{self.manifest.name}: kernel failed: "
                              f"{message or f'returned {rc} without a message'}")
