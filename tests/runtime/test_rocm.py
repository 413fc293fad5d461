"""The ROCm loader (tiled.runtime.rocm) without ROCm: load() accepts a rocm artifact and
manifest, a call checks its arguments like a CUDA launch and, with arguments a launch would
take, fails with a clear error naming the missing HIP runtime; the kernel argument buffer is
packed at the code object's own offsets (read back from the HSACO here); the daemon's `local`
target names a ROCm GPU where the HIP runtime reports one. Launching on an AMD GPU is
tests/gpu/test_rocm_gpu.py's (skipped: no AMD GPU in this project)."""

from __future__ import annotations

import importlib
import struct

import numpy as np
import pytest

import tiled.lang as T
import tiled.runtime
from tiled.compiler import compile_program
from tiled.compiler.targets.rocm.codeobject import read_code_object
from tiled.errors import LaunchError
from tiled.runtime import rocm
from tiled.runtime.args import bind_args
from tiled.server import service


@pytest.fixture(scope="module")
def scaled():
    """A kernel with tensors, a float16 and a float32 scalar and a symbolic dim."""

    @T.prim_func
    def axpb(X: T.Tensor((T.dyn("N"),), "float16"), Y: T.Tensor((T.dyn("N"),), "float16"),
             a: T.float16, b: T.float32):
        with T.Kernel(T.ceildiv(T.dyn("N"), 256), threads=256) as bx:
            for i in T.Parallel(256):
                if bx * 256 + i < X.shape[0]:
                    Y[bx * 256 + i] = X[bx * 256 + i] * a + b

    return compile_program(axpb, "rocm:gfx942")


class FakeTensor:
    """Just enough of a device tensor for the argument checks (no GPU here)."""

    def __init__(self, n: int, ptr: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f2", "data": (ptr, False),
                                         "version": 3, "strides": None}


def test_load_is_lazy_and_a_call_without_rocm_says_so(scaled):
    k = tiled.runtime.load(scaled.artifact, scaled.manifest)
    assert isinstance(k, rocm.ROCmKernel)
    # Without the HIP runtime, or (Debian's libamdhip64-5 installed) without a device.
    with pytest.raises(LaunchError, match=r"ROCm runtime is not installed: no libamdhip64\.so"
                                          r"|no ROCm GPU: libamdhip64\.so is installed but "
                                          r"hipGetDeviceCount reports hipErrorNoDevice"):
        k(FakeTensor(1000, 0x7F0000001000), FakeTensor(1000, 0x7F0000002000), 2.0, 1.0)


def test_arguments_are_checked_before_any_hip_call(scaled):
    k = tiled.runtime.load(scaled.artifact, scaled.manifest)
    x = np.zeros(1000, np.float16)
    with pytest.raises(LaunchError, match="on cpu but the kernel runs on cuda"):
        k(x, x, 2.0, 1.0)
    with pytest.raises(LaunchError, match="expected 4 arguments"):
        k(FakeTensor(1000, 0x1000))
    with pytest.raises(LaunchError, match="dim 0 is N=999 here but N=1000"):
        k(FakeTensor(1000, 0x1000), FakeTensor(999, 0x2000), 2.0, 1.0)


def test_kernarg_buffer_follows_the_code_objects_layout(scaled):
    m = scaled.manifest
    meta = read_code_object(scaled.artifact).kernel(m.symbol)
    explicit = [a for a in meta[".args"] if not a[".value_kind"].startswith("hidden_")]
    bound = bind_args(m.params, [FakeTensor(1000, 0x7F0000001000),
                                 FakeTensor(1000, 0x7F0000002000), 2.5, -1.25], "cuda")
    buf = rocm.KernargPlan(m).pack(bound)
    assert len(buf) == meta[".kernarg_segment_size"]
    values = {}
    for ka, arg in zip(m.kernel_args, explicit, strict=True):
        raw = bytes(buf[arg[".offset"]:arg[".offset"] + arg[".size"]])
        if ka.kind == "tensor":
            values[m.params[ka.param].name] = struct.unpack("<Q", raw)[0]
        elif ka.kind == "dim":
            values[ka.name] = struct.unpack("<i", raw)[0]
        else:
            fmt = {"float16": "<e", "float32": "<f"}[m.params[ka.param].dtype]
            values[m.params[ka.param].name] = struct.unpack(fmt, raw)[0]
    assert values == {"X": 0x7F0000001000, "Y": 0x7F0000002000, "a": 2.5, "b": -1.25,
                      "N": 1000}


def test_a_foreign_artifact_is_refused_at_load(scaled):
    cubin_like = b"\x7fELF" + bytes(60)
    with pytest.raises(LaunchError, match=r"not an ELF code object|manifest says AMDGPU"):
        rocm.ROCmKernel(cubin_like, scaled.manifest)


def test_local_target_is_the_rocm_gpu_when_there_is_one(monkeypatch):
    monkeypatch.setattr(service, "_local_cuda", lambda: None)
    monkeypatch.setattr(rocm, "local_arch", lambda: "gfx942")
    assert service.resolve_local() == "rocm:gfx942"
    monkeypatch.setattr(rocm, "local_arch", lambda: "gfx1100")  # no tiled backend arch
    assert service.resolve_local() == "cpu"
    monkeypatch.setattr(rocm, "local_arch", lambda: None)
    assert service.resolve_local() == "cpu"


def test_jit_targets_the_rocm_gpu_of_rocm_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    jit = importlib.import_module("tiled.jit")  # (the module; tiled.jit is the decorator)

    class Props:
        gcnArchName = "gfx942:sramecc+:xnack-"

    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    assert jit._local_cuda_target(torch.empty(1)) == "rocm:gfx942"


def test_local_arch_is_none_without_rocm():
    assert rocm.local_arch() is None


def test_without_the_hip_library_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(rocm, "HIP_LIBRARIES", ("libamdhip64-not-here.so",))
    monkeypatch.setattr(rocm, "_hip", None)
    with pytest.raises(LaunchError, match=r"ROCm runtime is not installed: no libamdhip64\.so "
                                          r"\(ROCm 5\.x or 6\.x\)"):
        rocm.hip()
    assert rocm.local_arch() is None
