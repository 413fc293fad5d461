"""The CUDA launcher without a GPU: launch geometry, kernel parameter packing, stream choice,
and the driver call sequence against a recording stand-in for cuda-bindings."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tiled.errors import LaunchError
from tiled.runtime import Manifest, bind_args, load
from tiled.runtime import cuda as rt_cuda
from tiled.runtime.args import bf16_bits
from tiled.runtime.cuda import (
    current_stream,
    pack_kernel_params,
    stream_handle,
)
from tiled.runtime.launch import launch_geometry
from tiled.runtime.manifest import ManifestError

CUBIN = b"\x7fELF fake cubin"


def manifest(**changes) -> Manifest:
    d = {
        "manifest_version": 1, "name": "gemm", "program_digest": "cd" * 32,
        "target": "cuda:sm_90a", "backend": "cuda", "arch": "sm_90a",
        "artifact_format": "cubin", "artifact_sha256": hashlib.sha256(CUBIN).hexdigest(),
        "symbol": "gemm_kernel",
        "params": [
            {"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["M", "K"], "align": 16},
            {"name": "C", "kind": "tensor", "dtype": "float32", "shape": ["M", 64]},
            {"name": "alpha", "kind": "scalar", "dtype": "float32"},
            {"name": "beta", "kind": "scalar", "dtype": "float16"},
            {"name": "k", "kind": "scalar", "dtype": "int64"},
            {"name": "flag", "kind": "scalar", "dtype": "bool"},
            {"name": "bias", "kind": "scalar", "dtype": "bfloat16"},
        ],
        "kernel_args": [
            {"kind": "tensor", "param": 0}, {"kind": "tensor", "param": 1},
            {"kind": "scalar", "param": 2}, {"kind": "scalar", "param": 3},
            {"kind": "scalar", "param": 4}, {"kind": "scalar", "param": 5},
            {"kind": "scalar", "param": 6},
            {"kind": "dim", "name": "M", "dtype": "int32"},
            {"kind": "dim", "name": "K", "dtype": "int64"},
        ],
        "grid": [["ceildiv", "M", 128], ["floordiv", "K", 32], 1], "block": [128, 1, 1],
        "dynamic_smem_bytes": 0, "cluster": [1, 1, 1],
    }
    d.update(changes)
    return Manifest.from_dict(d)


def cai(shape, typestr, ptr, device_id=0):
    return types.SimpleNamespace(
        __cuda_array_interface__={"shape": shape, "typestr": typestr, "data": (ptr, False),
                                  "strides": None, "version": 3},
        device=types.SimpleNamespace(id=device_id))


def gemm_args(m=300, k=96, device_id=0):
    return [cai((m, k), "<f2", 0x7F0000000000, device_id),
            cai((m, 64), "<f4", 0x7F0000100000, device_id), 0.5, 1.5, -(2**40), True, 3.0]


def read_slots(array, ctypes_list):
    return [ctypes.cast(array[i], ctypes.POINTER(ct))[0] for i, ct in enumerate(ctypes_list)]


def test_pack_kernel_params():
    m = manifest()
    bound = bind_args(m.params, gemm_args(), "cuda")
    array = pack_kernel_params(m, bound)
    assert len(array) == 9
    got = read_slots(array, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_float, ctypes.c_uint16,
                             ctypes.c_int64, ctypes.c_bool, ctypes.c_uint16, ctypes.c_int32,
                             ctypes.c_int64])
    assert got[:2] == [0x7F0000000000, 0x7F0000100000]
    assert got[2] == 0.5
    assert got[3] == struct.unpack("<H", struct.pack("<e", 1.5))[0]
    assert got[4] == -(2**40) and got[5] is True
    assert got[6] == 0x4040  # bfloat16 3.0
    assert got[7:] == [300, 96]


def test_pack_rejects_dims_that_do_not_fit():
    m = manifest()
    bound = bind_args(m.params, gemm_args(), "cuda")
    bound.dims["M"] = 2**31
    with pytest.raises(LaunchError, match=r"dim M=2147483648 does not fit the kernel's int32"):
        pack_kernel_params(m, bound)


def test_pack_with_no_kernel_args_is_a_valid_array():
    m = manifest(kernel_args=[])
    array = pack_kernel_params(m, bind_args(m.params, gemm_args(), "cuda"))
    assert len(array) == 1


@pytest.mark.parametrize("x, bits", [(1.0, 0x3F80), (-2.0, 0xC000), (1.00390625, 0x3F80),
                                     (1.01171875, 0x3F82), (float("inf"), 0x7F80),
                                     (float("nan"), 0x7FC0), (3.3895313892515355e38, 0x7F7F)])
def test_bf16_rounding(x, bits):
    assert bf16_bits(x) == bits


def test_launch_geometry():
    m = manifest()
    assert launch_geometry(m, {"M": 300, "K": 96}) == ((3, 3, 1), (128, 1, 1))
    assert launch_geometry(m, {"M": 0, "K": 96})[0] == (0, 3, 1)  # nothing to launch
    with pytest.raises(LaunchError, match=r"grid\[1\] = 65536 outside \[0, 65535\]"):
        launch_geometry(m, {"M": 1, "K": 32 * 65536})
    with pytest.raises(LaunchError, match=r"block \(64, 32, 1\) has more than 1024 threads"):
        launch_geometry(manifest(block=[64, 32, 1]), {"M": 1, "K": 32})
    with pytest.raises(LaunchError, match=r"block\[0\] = 0 outside \[1, 1024\]"):
        launch_geometry(manifest(block=["M", 1, 1]), {"M": 0, "K": 32})
    with pytest.raises(LaunchError, match=r"grid\[0\] = 3 is not a multiple of the cluster"):
        launch_geometry(manifest(cluster=[2, 1, 1]), {"M": 300, "K": 32})


def test_stream_handles():
    assert stream_handle(7) == 7
    assert stream_handle(types.SimpleNamespace(cuda_stream=11)) == 11
    assert stream_handle(types.SimpleNamespace(ptr=12)) == 12

    class CoreStream:
        def __cuda_stream__(self):
            return (0, 13)

    assert stream_handle(CoreStream()) == 13
    with pytest.raises(LaunchError, match="cannot get a CUDA stream handle from str"):
        stream_handle("s")


def test_current_stream_follows_torch(monkeypatch):
    m = manifest()
    bound = bind_args(m.params, gemm_args(), "cuda")
    assert current_stream(bound, 0) == 0
    asked = []
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})
    torch.cuda = types.SimpleNamespace(current_stream=lambda d: asked.append(d) or
                                       types.SimpleNamespace(cuda_stream=0xABC))
    monkeypatch.setitem(sys.modules, "torch", torch)
    bound.uses_torch = True
    assert current_stream(bound, 3) == 0xABC and asked == [3]


# --- the driver sequence, against a recording stand-in ----------------------------------------


class FakeDriver:
    """Answers the _Driver interface; records the calls."""

    def __init__(self, current_ctx=0, cluster=(0, 0, 0)):
        attr = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="smem",
                                     CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH="cw",
                                     CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT="ch",
                                     CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH="cd")
        self.cu = types.SimpleNamespace(CUfunction_attribute=attr)
        self.calls: list[tuple] = []
        self.current_ctx = current_ctx
        self.cluster = dict(zip(("cw", "ch", "cd"), cluster, strict=True))
        self.launches: list[tuple] = []
        self.ex_launches: list[tuple] = []  # cuLaunchKernelEx: (attributes, grid)
        self.functions: list[str] = []  # the function each launch ran

    def call(self, name, *args):
        self.calls.append((name, *args))
        if name == "cuDeviceGet":
            return 100 + args[0]
        if name == "cuDevicePrimaryCtxRetain":
            return 1000 + args[0]
        if name == "cuModuleLoadData":
            assert args[0] == CUBIN
            return "module"
        if name == "cuModuleGetFunction":
            if args[1] == b"gemm_fallback_kernel":
                return "fallback"
            if args[1] != b"gemm_kernel":
                raise LaunchError("cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND")
            return "function"
        if name == "cuFuncGetAttribute":
            return self.cluster[args[0]]
        if name == "cuLaunchKernelEx":
            config = args[0]
            self.ex_launches.append(([(int(a.id), a) for a in config.attrs],
                                     (config.gridDimX, config.gridDimY, config.gridDimZ)))
        if name == "cuLaunchKernel":
            self.functions.append(args[0])
            params = ctypes.cast(args[9], ctypes.POINTER(ctypes.c_void_p))
            self.launches.append((args[1:4], args[4:7], args[7], args[8],
                                  ctypes.cast(params[7], ctypes.POINTER(ctypes.c_int32))[0]))
        return None

    def make_current(self, ctx):
        self.calls.append(("context", ctx))
        return False

    @contextlib.contextmanager
    def context(self, ctx):
        self.make_current(ctx)
        yield

    def device_of_pointer(self, ptr):
        return 0


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(rt_cuda, "_driver", drv)
    return drv


def test_launch_sequence(fake):
    k = load(CUBIN, manifest(dynamic_smem_bytes=100_000))
    assert fake.calls == []  # loading touches no driver
    k(*gemm_args())
    names = [c[0] for c in fake.calls]
    assert names == ["cuDeviceGet", "cuDevicePrimaryCtxRetain", "context", "cuModuleLoadData",
                     "cuModuleGetFunction", "cuFuncSetAttribute", *["cuFuncGetAttribute"] * 3,
                     "context", "cuLaunchKernel"]
    assert ("cuFuncSetAttribute", "function", "smem", 100_000) in fake.calls
    assert fake.launches == [((3, 3, 1), (128, 1, 1), 100_000, 0, 300)]
    fake.calls.clear()
    k(*gemm_args(m=129), stream=types.SimpleNamespace(cuda_stream=55))
    assert [c[0] for c in fake.calls] == ["context", "cuLaunchKernel"]  # module cached
    assert fake.launches[-1] == ((2, 3, 1), (128, 1, 1), 100_000, 55, 129)


def test_module_per_device(fake):
    k = load(CUBIN, manifest())
    k(*gemm_args(device_id=0))
    k(*gemm_args(device_id=1))
    k(*gemm_args(device_id=1))
    assert [c for c in fake.calls if c[0] == "cuDevicePrimaryCtxRetain"] == \
        [("cuDevicePrimaryCtxRetain", 100), ("cuDevicePrimaryCtxRetain", 101)]
    assert [c[1] for c in fake.calls if c[0] == "context"] == [1100, 1100, 1101, 1101, 1101]
    assert len(fake.launches) == 3


def test_empty_grid_launches_nothing(fake):
    load(CUBIN, manifest())(*gemm_args(m=0))
    assert fake.calls == []


def test_missing_symbol_and_bad_args(fake):
    k = load(CUBIN, manifest(symbol="nope"))
    with pytest.raises(LaunchError, match=r"cubin has no kernel 'nope'.*CUDA_ERROR_NOT_FOUND"):
        k(*gemm_args())
    with pytest.raises(LaunchError, match=r"^expected 7 arguments"):
        k(*gemm_args()[:3])


TMA_ROWS = ["floormod", ["mul", 2, "K"], 16]  # A's fp16 rows a multiple of 16 bytes apart


def test_a_failed_precondition_launches_the_fallback(fake):
    fallback = {"symbol": "gemm_fallback_kernel", "kernel_args": manifest().to_dict()[
        "kernel_args"], "grid": [["ceildiv", "M", 64], 1, 1], "block": [64, 1, 1],
        "dynamic_smem_bytes": 0, "cluster": [1, 1, 1]}
    k = load(CUBIN, manifest(requires=[TMA_ROWS], fallback=fallback))
    k(*gemm_args(k=96))  # 192-byte rows: the main kernel
    k(*gemm_args(k=97))  # 194-byte rows: its TMA descriptor cannot be encoded
    k(*gemm_args(k=104))
    assert fake.functions == ["function", "fallback", "function"]
    assert [launch[:2] for launch in fake.launches] == [
        ((3, 3, 1), (128, 1, 1)), ((5, 1, 1), (64, 1, 1)), ((3, 3, 1), (128, 1, 1))]


def test_a_failed_precondition_without_fallback_is_refused(fake):
    k = load(CUBIN, manifest(requires=[TMA_ROWS]))
    with pytest.raises(LaunchError, match=r"fail the kernel's launch precondition.*'K'"):
        k(*gemm_args(k=97))
    assert fake.launches == []
    k(*gemm_args(k=96))
    assert len(fake.launches) == 1


def test_compiled_cluster_must_match(monkeypatch):
    drv = FakeDriver(cluster=(2, 1, 1))
    monkeypatch.setattr(rt_cuda, "_driver", drv)
    with pytest.raises(LaunchError, match=r"cubin fixes cluster dims \(2, 1, 1\) but the "
                                          r"manifest says \(1, 1, 1\)"):
        load(CUBIN, manifest())(*gemm_args())
    load(CUBIN, manifest(cluster=[2, 1, 1], grid=[2, 1, 1]))(*gemm_args())
    assert drv.launches[-1][0] == (2, 1, 1)  # compiled-in cluster: plain cuLaunchKernel


def test_a_kernel_holding_pdl_sync_launches_programmatically(monkeypatch):
    """A manifest with `pdl` (the kernel holds a T.pdl_sync) launches through
    cuLaunchKernelEx with programmatic stream serialization allowed; beside launch-time
    cluster dims both attributes go; a plain manifest keeps cuLaunchKernel."""
    cu = pytest.importorskip("cuda.bindings.driver")
    drv = FakeDriver()
    drv.cu = types.SimpleNamespace(CUfunction_attribute=drv.cu.CUfunction_attribute,
                                   CUlaunchAttribute=cu.CUlaunchAttribute,
                                   CUlaunchAttributeID=cu.CUlaunchAttributeID,
                                   CUlaunchConfig=cu.CUlaunchConfig, CUstream=cu.CUstream)
    monkeypatch.setattr(rt_cuda, "_driver", drv)
    pdl = int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    cluster = int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    load(CUBIN, manifest(pdl=True))(*gemm_args())
    (attrs, grid), = drv.ex_launches
    assert [i for i, _ in attrs] == [pdl] and grid == (3, 3, 1) and not drv.launches
    assert attrs[0][1].value.programmaticStreamSerializationAllowed == 1
    load(CUBIN, manifest(pdl=True, cluster=[2, 1, 1], grid=[2, 1, 1]))(*gemm_args())
    assert [i for i, _ in drv.ex_launches[-1][0]] == [cluster, pdl]
    load(CUBIN, manifest())(*gemm_args())
    assert len(drv.ex_launches) == 2 and len(drv.launches) == 1
    assert "pdl" not in manifest().to_dict() and manifest(pdl=True).to_dict()["pdl"] is True
    with pytest.raises(ManifestError, match=r"pdl: expected true or false"):
        manifest(pdl=1)


def test_importing_the_backend_loads_no_driver():
    code = ("import sys, tiled.runtime.cuda\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cuda', 'torch', 'tvm')]\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- on a GPU: real cubins (nvcc at test time) through the real driver ------------------------

KERNELS_CU = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scalars_kernel(const __half* A, float* C, float alpha, __half beta,
                                          long long k, bool flag, __nv_bfloat16 bias, int M,
                                          long long K) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < (long long)M * K)
    C[i] = alpha * __half2float(A[i]) + __half2float(beta) + __bfloat162float(bias) +
           (flag ? 1000.f : 0.f) + (float)k;
}
// 100 KiB of dynamic shared memory: launching it needs the opt-in attribute.
extern "C" __global__ void reverse_kernel(const float* X, float* Y) {
  extern __shared__ float buf[];
  const float* x = X + blockIdx.x * 25600;
  for (int j = threadIdx.x; j < 25600; j += blockDim.x) buf[j] = x[j];
  __syncthreads();
  for (int j = threadIdx.x; j < 25600; j += blockDim.x) Y[blockIdx.x * 25600 + j] = buf[25599 - j];
}
"""

CLUSTER_CU = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cluster_kernel(int* out) {
  cg::cluster_group c = cg::this_cluster();
  if (threadIdx.x == 0) out[blockIdx.x] = c.block_rank() + 100 * c.num_blocks();
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) fixed_cluster_kernel(int* out) {
  cg::cluster_group c = cg::this_cluster();
  if (threadIdx.x == 0) out[blockIdx.x] = c.block_rank() + 100 * c.num_blocks();
}
"""


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}{'a' if major == 9 else ''}"
    out = tmp_path_factory.mktemp("cubins")
    cubins = {}
    sources = {"kernels": KERNELS_CU, **({"cluster": CLUSTER_CU} if major >= 9 else {})}
    for name, src in sources.items():
        (out / f"{name}.cu").write_text(src)
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-o", str(out / f"{name}.cubin"),
                        str(out / f"{name}.cu")], check=True, capture_output=True)
        cubins[name] = (out / f"{name}.cubin").read_bytes()
    return torch, cubins, major


def gpu_manifest(cubin: bytes, **d) -> Manifest:
    base = {"manifest_version": 1, "program_digest": "cd" * 32, "target": "cuda:sm_90a",
            "backend": "cuda", "arch": "sm_90a", "artifact_format": "cubin",
            "artifact_sha256": hashlib.sha256(cubin).hexdigest()}
    return Manifest.from_dict({**base, **d})


@pytest.mark.gpu
def test_gpu_every_scalar_type(gpu):
    torch, cubins, _ = gpu
    m = manifest(symbol="scalars_kernel",
                 artifact_sha256=hashlib.sha256(cubins["kernels"]).hexdigest(),
                 grid=[["ceildiv", ["mul", "M", "K"], 128], 1, 1], block=[128, 1, 1])
    m = Manifest.from_dict({**m.to_dict(), "params": [
        {**p, "shape": ["M", "K"]} if p["name"] == "C" else p for p in m.to_dict()["params"]]})
    k = load(cubins["kernels"], m)
    a = torch.randn(37, 300, device="cuda", dtype=torch.float16)
    c = torch.zeros(37, 300, device="cuda", dtype=torch.float32)
    k(a, c, 0.5, 1.5, -(2**20), True, 3.0)
    torch.cuda.synchronize()
    want = 0.5 * a.float() + 1.5 + 3.0 + 1000.0 - 2**20
    torch.testing.assert_close(c, want)
    with pytest.raises(LaunchError, match=r"A: on cpu but the kernel runs on cuda"):
        k(a.cpu(), c, 0.5, 1.5, 0, True, 3.0)


@pytest.mark.gpu
def test_gpu_large_dynamic_smem_streams_and_threads(gpu):
    torch, cubins, _ = gpu
    k = load(cubins["kernels"], gpu_manifest(
        cubins["kernels"], name="reverse", symbol="reverse_kernel",
        params=[{"name": "X", "kind": "tensor", "dtype": "float32", "shape": ["nb", 25600]},
                {"name": "Y", "kind": "tensor", "dtype": "float32", "shape": ["nb", 25600]}],
        kernel_args=[{"kind": "tensor", "param": 0}, {"kind": "tensor", "param": 1}],
        grid=["nb", 1, 1], block=[256, 1, 1], dynamic_smem_bytes=102400))
    x = torch.randn(9, 25600, device="cuda")
    y = torch.zeros_like(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # runs on torch's current stream
        k(x, y)
    s.synchronize()
    torch.testing.assert_close(y, x.flip(1))
    # a fresh thread has no current CUDA context: the launcher pushes the primary one
    y2 = torch.zeros_like(x)
    errors = []
    import threading

    def run():
        try:
            k(x, y2, stream=0)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, x.flip(1))
    k(x[:0], y[:0])  # zero blocks: nothing launched


@pytest.mark.gpu
@pytest.mark.parametrize("symbol, cluster", [("cluster_kernel", 4), ("fixed_cluster_kernel", 2)])
def test_gpu_clusters(gpu, symbol, cluster):
    torch, cubins, major = gpu
    if major < 9:
        pytest.skip("clusters need sm_90")
    k = load(cubins["cluster"], gpu_manifest(
        cubins["cluster"], name=symbol, symbol=symbol,
        params=[{"name": "out", "kind": "tensor", "dtype": "int32", "shape": ["G"]}],
        kernel_args=[{"kind": "tensor", "param": 0}], grid=["G", 1, 1], block=[32, 1, 1],
        cluster=[cluster, 1, 1]))
    out = torch.full((16,), -1, device="cuda", dtype=torch.int32)
    k(out)
    torch.cuda.synchronize()
    want = torch.arange(16, dtype=torch.int32) % cluster + 100 * cluster
    assert out.cpu().tolist() == want.tolist()
    with pytest.raises(LaunchError, match="not a multiple of the cluster size"):
        k(out[:cluster + 1])


@pytest.mark.gpu
def test_gpu_cupy_arrays(gpu):
    cupy = pytest.importorskip("cupy")
    _, cubins, _ = gpu
    k = load(cubins["kernels"], gpu_manifest(
        cubins["kernels"], name="reverse", symbol="reverse_kernel",
        params=[{"name": "X", "kind": "tensor", "dtype": "float32", "shape": ["nb", 25600]},
                {"name": "Y", "kind": "tensor", "dtype": "float32", "shape": ["nb", 25600]}],
        kernel_args=[{"kind": "tensor", "param": 0}, {"kind": "tensor", "param": 1}],
        grid=["nb", 1, 1], block=[256, 1, 1], dynamic_smem_bytes=102400))
    x = cupy.random.rand(3, 25600, dtype=cupy.float32)
    y = cupy.zeros_like(x)
    k(x, y)
    cupy.cuda.get_current_stream().synchronize()
    assert bool((y == x[:, ::-1]).all())
