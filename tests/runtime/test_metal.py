"""tiled.runtime.metal without a Mac: the scalar-argument struct packed where the kernel's MSL
reads it, the clear LaunchError where there is no Metal, and the PyObjC launch sequence
(compile options, pipeline state and its thread limit, buffer indices, setBytes, dispatch
sizes, the copy back) against a stand-in `Metal` module whose GPU is tiled's CPU emulation of
the same MSL. Launches on an Apple GPU: test_metal_gpu.py (apple_gpu, skipped here)."""

from __future__ import annotations

import struct
import sys
import types

import numpy as np
import pytest

import tiled.lang as T
from tiled.compiler import compile_program
from tiled.compiler.emulation import REDZONE, ArgumentFile
from tiled.compiler.targets.metal.emulate import emulator
from tiled.errors import LaunchError
from tiled.runtime import load
from tiled.runtime.args import bind_args
from tiled.runtime.metal import ArgsPlan, MetalKernel, local_arch


def _scaled():
    M = T.dyn("M")

    @T.prim_func
    def scaled(X: T.Tensor((M, 64), "float32"), alpha: T.float32, shift: T.int32,
               Y: T.Tensor((M, 64), "float32")):
        with T.Kernel(T.ceildiv(M, 2), threads=64) as bx:
            for i, j in T.Parallel(2, 64):
                Y[bx * 2 + i, j] = X[bx * 2 + i, j] * alpha + shift

    return scaled


@pytest.fixture(scope="module")
def scaled():
    return compile_program(_scaled(), "metal")


def test_the_struct_is_packed_where_the_msl_reads_it(scaled):
    m = scaled.manifest
    x, y = np.ones((5, 64), np.float32), np.zeros((5, 64), np.float32)
    bound = bind_args(m.params, [x, 2.5, -3, y], "cpu")
    data = ArgsPlan(m).pack(bound)
    assert len(data) == m.metal["args_size"]
    for ka, b in zip(m.kernel_args, m.metal["bindings"], strict=True):
        if ka.kind == "tensor":
            continue
        fmt, want = ("<i", 5) if ka.kind == "dim" else (("<f", 2.5) if ka.param == 1
                                                        else ("<i", -3))
        assert struct.unpack_from(fmt, data, b["offset"])[0] == want
        assert data[b["offset"] + 4:b["offset"] + 8] == b"\0" * 4  # the rest of the slot


def _shifted_half():
    @T.prim_func
    def shifted(X: T.Tensor((64,), "float16"), alpha: T.float16, Y: T.Tensor((64,), "float16")):
        with T.Kernel(1, threads=64):
            for j in T.Parallel(64):
                Y[j] = X[j] + alpha
    return shifted, np.float16


def test_a_float16_scalar_is_packed_as_its_bits():
    """(bfloat16 scalars are refused by the verifier: kernels take a float32 and cast it.)"""
    kernel, npdt = _shifted_half()
    m = compile_program(kernel, "metal").manifest
    x = np.ones(64, npdt)
    data = ArgsPlan(m).pack(bind_args(m.params, [x, 1.25, x], "cpu"))
    (slot,) = [b for ka, b in zip(m.kernel_args, m.metal["bindings"], strict=True)
               if ka.kind == "scalar"]
    assert struct.unpack_from("<H", data, slot["offset"])[0] == 0x3D00  # 1.25 in float16


def test_a_dim_that_does_not_fit_its_argument_is_refused(scaled):
    plan = ArgsPlan(scaled.manifest)
    bound = bind_args(scaled.manifest.params, [np.ones((5, 64), np.float32), 1.0, 0,
                                               np.ones((5, 64), np.float32)], "cpu")
    bound.dims["M"] = 2**31
    with pytest.raises(LaunchError, match=r"dim M=2147483648 does not fit"):
        plan.pack(bound)


def test_without_metal_a_call_says_so(scaled, monkeypatch):
    monkeypatch.setitem(sys.modules, "Metal", None)  # import Metal fails, as on Linux
    kernel = load(scaled.artifact, scaled.manifest)  # loading touches no Metal API
    assert isinstance(kernel, MetalKernel)
    x = np.ones((4, 64), np.float32)
    with pytest.raises(LaunchError, match=r"no Metal here: PyObjC's Metal framework is not "
                                          r"importable.*CompiledKernel\.emulate"):
        kernel(x, 1.0, 0, np.zeros_like(x))
    assert local_arch() is None


def test_an_artifact_that_is_not_msl_is_refused(scaled):
    with pytest.raises(LaunchError, match=r"MSL source, UTF-8; these bytes are not"):
        MetalKernel(b"\xff\xfe\x00", scaled.manifest)
    with pytest.raises(LaunchError, match="defines no kernel scaled_kernel"):
        MetalKernel(b"kernel void other(", scaled.manifest)


# --- a stand-in for PyObjC's Metal framework ----------------------------------------------

class FakeMetal:
    """The Metal calls MetalKernel makes, recorded; a dispatch runs the library's source under
    tiled's CPU emulation on the bound buffers and bytes."""

    def __init__(self, max_threads=1024, tg_memory=32768, families=(1007, 1008)):
        self.calls: list[tuple] = []
        self.max_threads, self.tg_memory, self.families = max_threads, tg_memory, families
        fake = self

        class Options:
            @staticmethod
            def alloc():
                return Options()

            def init(self):
                return self

            def setLanguageVersion_(self, v):
                fake.calls.append(("languageVersion", v))

            def setFastMathEnabled_(self, v):
                fake.calls.append(("fastMath", v))

        self.module = types.SimpleNamespace(
            MTLCompileOptions=Options, MTLCreateSystemDefaultDevice=lambda: Device(fake),
            MTLSizeMake=lambda x, y, z: (x, y, z))


class Buffer:
    def __init__(self, n):
        self.data = bytearray(n)

    def contents(self):
        return types.SimpleNamespace(as_buffer=lambda n: memoryview(self.data)[:n])


class Device:
    def __init__(self, fake):
        self.fake = fake

    def name(self):
        return "Fake GPU"

    def newLibraryWithSource_options_error_(self, source, options, error):
        self.fake.calls.append(("newLibraryWithSource", len(source)))
        if "kernel void" not in source:
            return None, "program_source:1:1: error: no kernel"
        self.fake.source = source
        return types.SimpleNamespace(newFunctionWithName_=lambda n: n), None

    def newComputePipelineStateWithFunction_error_(self, function, error):
        self.fake.calls.append(("newComputePipelineState", function))
        self.fake.symbol = function
        return types.SimpleNamespace(
            maxTotalThreadsPerThreadgroup=lambda: self.fake.max_threads), None

    def maxThreadgroupMemoryLength(self):
        return self.fake.tg_memory

    def supportsFamily_(self, family):
        return family in self.fake.families

    def newCommandQueue(self):
        return types.SimpleNamespace(commandBuffer=lambda: CommandBuffer(self.fake))

    def newBufferWithLength_options_(self, n, mode):
        assert mode == 0  # shared storage
        return Buffer(n)


class CommandBuffer:
    def __init__(self, fake):
        self.fake, self.buffers, self.bytes = fake, {}, {}

    def computeCommandEncoder(self):
        cb = self

        class Encoder:
            def setComputePipelineState_(self, pso):
                cb.fake.calls.append(("setComputePipelineState",))

            def setBuffer_offset_atIndex_(self, buf, offset, index):
                cb.fake.calls.append(("setBuffer", offset, index))
                cb.buffers[index] = buf

            def setBytes_length_atIndex_(self, data, n, index):
                cb.fake.calls.append(("setBytes", bytes(data), n, index))
                cb.bytes[index] = bytes(data)

            def dispatchThreadgroups_threadsPerThreadgroup_(self, grid, block):
                cb.fake.calls.append(("dispatch", grid, block))
                cb.grid, cb.block = grid, block

            def endEncoding(self):
                cb.fake.calls.append(("endEncoding",))

        return Encoder()

    def commit(self):  # the "GPU": the same MSL under the CPU emulation
        exe = emulator(self.fake.source, self.fake.symbol)
        file = ArgumentFile()
        tokens = ["-"] * (max([*self.buffers, *self.bytes]) + 1)
        for i, buf in self.buffers.items():
            tokens[i] = file.tensor(np.frombuffer(buf.data, np.uint8))
        for i, data in self.bytes.items():
            tokens[i] = file.value(data)
        file.run([str(exe)], [*map(str, self.grid), *map(str, self.block), str(REDZONE),
                              *tokens], "fake Metal dispatch", 120)

    def waitUntilCompleted(self):
        pass

    def status(self):
        return 4  # MTLCommandBufferStatusCompleted

    def error(self):
        return None


def test_the_pyobjc_launch_sequence(scaled, monkeypatch):
    fake = FakeMetal()
    monkeypatch.setitem(sys.modules, "Metal", fake.module)
    kernel = load(scaled.artifact, scaled.manifest)
    x = np.random.default_rng(0).standard_normal((7, 64)).astype(np.float32)
    y = np.zeros_like(x)
    kernel(x, 2.0, 3, y)
    np.testing.assert_allclose(y, x * 2 + 3, rtol=1e-6)
    kernel(x, -1.0, 0, y)
    np.testing.assert_allclose(y, -x, rtol=1e-6)
    m = scaled.manifest
    compiled_once = [c for c in fake.calls if c[0] in ("newLibraryWithSource",
                                                       "newComputePipelineState")]
    assert compiled_once == [("newLibraryWithSource", len(scaled.source)),
                             ("newComputePipelineState", "scaled_kernel")]
    assert ("languageVersion", 3 << 16) in fake.calls and ("fastMath", False) in fake.calls
    first_launch = fake.calls[fake.calls.index(("setComputePipelineState",)):]
    buffers = sorted(c[2] for c in first_launch[:4] if c[0] == "setBuffer")
    assert buffers == sorted(b["buffer"] for b in m.metal["bindings"] if "buffer" in b)
    set_bytes = next(c for c in fake.calls if c[0] == "setBytes")
    assert set_bytes[2:] == (m.metal["args_size"], m.metal["args_buffer"])
    assert ("dispatch", (4, 1, 1), (64, 1, 1)) in fake.calls  # ceil(7 / 2) threadgroups


def test_a_threadgroup_the_pipeline_cannot_run_is_refused(scaled, monkeypatch):
    monkeypatch.setitem(sys.modules, "Metal", FakeMetal(max_threads=32).module)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(LaunchError, match=r"64 threads per threadgroup.*at most 32 "
                                          r"\(maxTotalThreadsPerThreadgroup\)"):
        load(scaled.artifact, scaled.manifest)(x, 1.0, 0, x.copy())


def test_too_little_threadgroup_memory_is_refused(monkeypatch):
    k = compile_program(_softmax(), "metal")
    monkeypatch.setitem(sys.modules, "Metal", FakeMetal(tg_memory=1024).module)
    x = np.ones((4, 256), np.float32)
    with pytest.raises(LaunchError, match=r"needs \d+ bytes of threadgroup memory, Fake GPU "
                                          r"has 1024"):
        load(k.artifact, k.manifest)(x, x.copy())


def _softmax():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "softmax.py"
    spec = importlib.util.spec_from_file_location("example_softmax", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.softmax()


def test_local_arch_is_the_newest_apple_family(monkeypatch):
    monkeypatch.setitem(sys.modules, "Metal", FakeMetal(families=(1007, 1008)).module)
    assert local_arch() == "apple8"


def test_the_daemons_local_target_is_the_mac_gpu(monkeypatch):
    from tiled.runtime import metal, rocm
    from tiled.server import service

    monkeypatch.setattr(service, "_local_cuda", lambda: None)
    monkeypatch.setattr(rocm, "local_arch", lambda: None)
    monkeypatch.setattr(metal, "local_arch", lambda: "apple9")
    assert service.resolve_local() == "metal:apple9"
    monkeypatch.setattr(metal, "local_arch", lambda: None)
    assert service.resolve_local() == "cpu"


def test_jit_targets_the_mac_gpu_for_mps_tensors(monkeypatch):
    import importlib

    from tiled.runtime import metal

    jit = importlib.import_module("tiled.jit")  # (the module; tiled.jit is the decorator)
    mps = types.SimpleNamespace(device=types.SimpleNamespace(type="mps"), shape=(4,))
    monkeypatch.setattr(metal, "local_arch", lambda: "apple8")
    assert jit.JitKernel._target(types.SimpleNamespace(target="auto"), [mps]) == \
        "metal:apple8"
