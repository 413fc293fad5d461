"""tensor_map kernel arguments without a GPU: the 128 descriptor bytes in the parameter buffer,
the encode request, the descriptor cache and the TMA checks, against a recording encoder; the
real cuda-bindings encoder as far as it goes without a driver; a real TMA kernel on a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import shutil
import subprocess
import threading

import pytest

from tests.runtime.test_cuda_pack import CUBIN, FakeDriver, cai
from tiled.errors import LaunchError
from tiled.runtime import Manifest, bind_args, load
from tiled.runtime import cuda as rt_cuda
from tiled.runtime import launch as rt_launch
from tiled.runtime.args import BoundArgs, TensorView
from tiled.runtime.cuda import pack_kernel_params
from tiled.runtime.launch import (
    TENSOR_MAP_BYTES,
    TMA_DATA_TYPES,
    TMA_SWIZZLE_NAMES,
    LaunchPlan,
    TensorMapRequest,
    tensor_map_encode_args,
)

A_PTR, C_PTR = 0x7F0000000000, 0x7F0000100000


def manifest(**changes) -> Manifest:
    d = {
        "manifest_version": 1, "name": "gemm", "program_digest": "cd" * 32,
        "target": "cuda:sm_90a", "backend": "cuda", "arch": "sm_90a",
        "artifact_format": "cubin", "artifact_sha256": hashlib.sha256(CUBIN).hexdigest(),
        "symbol": "gemm_kernel",
        "params": [
            {"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["M", "K"]},
            {"name": "C", "kind": "tensor", "dtype": "float32", "shape": ["M", 64]},
        ],
        "kernel_args": [
            {"kind": "tensor_map", "param": 0, "box": [64, 128], "swizzle": 128},
            {"kind": "tensor", "param": 1},
            {"kind": "tensor_map", "param": 1, "box": [32, 64], "swizzle": 128},
            {"kind": "dim", "name": "M", "dtype": "int32"},
        ],
        "grid": [["ceildiv", "M", 128], 1, 1], "block": [384, 1, 1],
    }
    d.update(changes)
    return Manifest.from_dict(d)


class RecordingEncoder:
    """Stands in for cuTensorMapEncodeTiled: 128 bytes that identify the request."""

    def __init__(self):
        self.requests: list[TensorMapRequest] = []

    @staticmethod
    def descriptor(request: TensorMapRequest) -> bytes:
        return hashlib.sha512(repr(request).encode()).digest() * 2

    def __call__(self, request: TensorMapRequest) -> bytes:
        self.requests.append(request)
        return self.descriptor(request)


def bound(m=300, k=96, a_ptr=A_PTR, c_ptr=C_PTR):
    man = manifest()
    return bind_args(man.params, [cai((m, k), "<f2", a_ptr), cai((m, 64), "<f4", c_ptr)], "cuda")


def view_bound(shape, strides, ptr=A_PTR):
    """Arguments as a binder that accepts strided views would produce them."""
    a = TensorView(None, "cuda_array_interface", ptr, shape, strides, "float16", "<f2", "cuda", 0)
    c = TensorView(None, "cuda_array_interface", C_PTR, (shape[0], 64), None, "float32", "<f4",
                   "cuda", 0)
    return BoundArgs([a, c], {"M": shape[0], "K": shape[1]}, 0)


def slot_bytes(array, i) -> bytes:
    return ctypes.string_at(array[i], TENSOR_MAP_BYTES)


def test_descriptor_bytes_are_the_kernel_parameter():
    enc = RecordingEncoder()
    array = pack_kernel_params(manifest(), bound(), encode_tensor_map=enc)
    want_a = TensorMapRequest("float16", A_PTR, (96, 300), (192,), (64, 128), 128)
    want_c = TensorMapRequest("float32", C_PTR, (64, 300), (256,), (32, 64), 128)
    assert enc.requests == [want_a, want_c]
    assert slot_bytes(array, 0) == enc.descriptor(want_a)
    assert slot_bytes(array, 2) == enc.descriptor(want_c)
    assert ctypes.cast(array[1], ctypes.POINTER(ctypes.c_uint64))[0] == C_PTR
    assert ctypes.cast(array[3], ctypes.POINTER(ctypes.c_int32))[0] == 300
    assert array[0] % 64 == 0 and array[2] % 64 == 0  # host copies on 64-byte boundaries
    slots = sorted((array[i], i) for i in range(4))  # no slot overlaps the next one
    sizes = {0: TENSOR_MAP_BYTES, 1: 8, 2: TENSOR_MAP_BYTES, 3: 4}
    assert all(a + sizes[i] <= b for (a, i), (b, _) in itertools.pairwise(slots))


def test_the_cache_encodes_each_tensor_once():
    enc = RecordingEncoder()
    plan = LaunchPlan(manifest(), encode_tensor_map=enc)
    for _ in range(10):  # a serving loop reusing its buffers
        plan.pack(bound())
    assert len(enc.requests) == 2
    plan.pack(bound(a_ptr=A_PTR + 4096))  # A moved: A re-encoded, C cached
    assert [r.address for r in enc.requests[2:]] == [A_PTR + 4096]
    array = plan.pack(bound(m=129))  # a new shape: both re-encoded
    assert [r.dims for r in enc.requests[3:]] == [(96, 129), (64, 129)]
    assert slot_bytes(array, 0) == enc.descriptor(enc.requests[3])
    array = plan.pack(bound())  # back to the first call's tensors: still cached
    assert len(enc.requests) == 5
    assert slot_bytes(array, 0) == enc.descriptor(enc.requests[0])
    plan.pack(view_bound((300, 96), (96, 1)))  # explicit strides are another key
    assert len(enc.requests) == 6 and enc.requests[5] == enc.requests[0]


def test_the_cache_is_a_bounded_lru(monkeypatch):
    monkeypatch.setattr(rt_launch, "TENSOR_MAP_CACHE_SIZE", 4)
    enc = RecordingEncoder()
    plan = LaunchPlan(manifest(kernel_args=[manifest().kernel_args[0]]), encode_tensor_map=enc)
    ptrs = [A_PTR + 4096 * j for j in range(5)]
    for p in ptrs[:4]:
        plan.pack(bound(a_ptr=p))
    plan.pack(bound(a_ptr=ptrs[0]))  # a hit refreshes ptrs[0]
    plan.pack(bound(a_ptr=ptrs[4]))  # evicts the least recently used: ptrs[1]
    assert len(plan._tensor_maps) == 4 and len(enc.requests) == 5
    plan.pack(bound(a_ptr=ptrs[0]))
    assert len(enc.requests) == 5
    plan.pack(bound(a_ptr=ptrs[1]))
    assert len(enc.requests) == 6


def test_threads_share_the_cache_not_the_buffer():
    enc = RecordingEncoder()
    plan = LaunchPlan(manifest(), encode_tensor_map=enc)
    mine = plan.pack(bound())
    theirs = []

    def other_thread():  # read its buffer here: thread-local storage dies with the thread
        array = plan.pack(bound())
        theirs.append((array[0], slot_bytes(array, 0)))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(enc.requests) == 2
    assert mine[0] != theirs[0][0]
    assert slot_bytes(mine, 0) == theirs[0][1]


def test_padded_and_single_row_tensors():
    enc = RecordingEncoder()
    plan = LaunchPlan(manifest(), encode_tensor_map=enc)
    plan.pack(view_bound((300, 1001), (1008, 1)))  # K=1001 padded to 1008: legal for TMA
    assert enc.requests[-2].dims == (1001, 300) and enc.requests[-2].strides == (2016,)
    # One row: its stride is never stepped; the smallest legal one stands in.
    plan.pack(view_bound((1, 1001), (1001, 1)))
    assert enc.requests[-2].dims == (1001, 1) and enc.requests[-2].strides == (2016,)


@pytest.mark.parametrize("args, message", [
    (dict(shape=(300, 1001), strides=None),
     r"^gemm: A \(kernel_args\[0\], tensor_map\): K=1001 float16 rows are 2002 bytes; TMA needs "
     r"row strides that are multiples of 16 bytes: pad the row length to a multiple of 8$"),
    (dict(shape=(300, 1000), strides=(1004, 1)),
     r"rows 1004 float16 elements apart are 2008 bytes; TMA needs row strides that are "
     r"multiples of 16 bytes"),
    (dict(shape=(300, 96), strides=None, ptr=A_PTR + 8),
     r"^gemm: A \(kernel_args\[0\], tensor_map\): data pointer 0x7f0000000008 is not 16-byte "
     r"aligned; TMA needs a 16-byte aligned base"),
    (dict(shape=(300, 96), strides=(1, 300)),
     r"A \(kernel_args\[0\], tensor_map\): the last dim is not contiguous \(strides \(1, 300\)\); "
     r"TMA needs unit stride along the last dim"),
    (dict(shape=(300, 96), strides=(48, 1)), r"row stride 48 is shorter than a row \(96 elements"),
    (dict(shape=(0, 96), strides=None), r"shape \(0, 96\); TMA needs every dim in 1..2\^32"),
    (dict(shape=(2**32 + 1, 96), strides=None), r"TMA needs every dim in 1..2\^32"),
    (dict(shape=(2, 1000), strides=(2**39, 1)), r"row stride 1099511627776 bytes; TMA needs "
                                                  r"less than 2\^40"),
])
def test_tma_requirements_are_checked_before_encoding(args, message):
    enc = RecordingEncoder()
    ptr = args.pop("ptr", A_PTR)
    with pytest.raises(LaunchError, match=message):
        LaunchPlan(manifest(), encode_tensor_map=enc).pack(view_bound(**args, ptr=ptr))
    assert enc.requests == []


def test_static_row_length_in_the_message():
    m = manifest(params=[{"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["M", 1001]},
                         manifest().to_dict()["params"][1]])
    b = bind_args(m.params, [cai((300, 1001), "<f2", A_PTR), cai((300, 64), "<f4", C_PTR)], "cuda")
    with pytest.raises(LaunchError, match=r"1001-element float16 rows are 2002 bytes"):
        pack_kernel_params(m, b, encode_tensor_map=RecordingEncoder())


def test_encoder_failures_are_launch_errors():
    def refuses(request):
        raise LaunchError("cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE (invalid "
                          "argument)")

    with pytest.raises(LaunchError, match=r"^gemm: A \(kernel_args\[0\], tensor_map\): encoding "
                                          r"the TMA descriptor failed for TensorMapRequest\(.*"
                                          r"CUDA_ERROR_INVALID_VALUE"):
        pack_kernel_params(manifest(), bound(), encode_tensor_map=refuses)
    with pytest.raises(LaunchError, match=r"the encoder returned 64 bytes, not 128"):
        pack_kernel_params(manifest(), bound(), encode_tensor_map=lambda r: b"\0" * 64)


def test_the_driver_is_reached_only_for_a_tensor_map(monkeypatch):
    def no_driver():
        raise AssertionError("driver loaded")

    monkeypatch.setattr(rt_cuda, "_driver", None)
    monkeypatch.setattr(rt_cuda, "driver", no_driver)
    plan = LaunchPlan(manifest(), rt_cuda.driver_tensor_map)  # CUDAKernel's: nothing loaded yet
    assert plan.geometry({"M": 300}) == ((3, 1, 1), (384, 1, 1))
    plain = manifest(kernel_args=[{"kind": "tensor", "param": 1}])
    LaunchPlan(plain).pack(bound())
    with pytest.raises(AssertionError, match="driver loaded"):
        plan.pack(bound())


def test_a_plan_without_an_encoder_refuses_a_tensor_map():
    # The ROCm and Metal launchers build their plans with no encoder (geometry only).
    plan = LaunchPlan(manifest())
    with pytest.raises(LaunchError, match=r"tensor_map\): this launcher has no TMA descriptor "
                                          r"encoder"):
        plan.pack(bound())


# --- through load() and the driver interface --------------------------------------------------


class TMADriver(FakeDriver):
    """FakeDriver plus the driver's encode_tensor_map; launches record the first slot's bytes."""

    def __init__(self):
        super().__init__()
        self.encoder = RecordingEncoder()

    def encode_tensor_map(self, request):
        self.calls.append(("encode", request.address))
        return self.encoder(request)

    def call(self, name, *args):
        if name == "cuLaunchKernel":
            self.calls.append((name,))
            params = ctypes.cast(args[9], ctypes.POINTER(ctypes.c_void_p))
            self.launches.append(slot_bytes(params, 0))
            return None
        return super().call(name, *args)


def test_launch_encodes_in_the_kernel_context(monkeypatch):
    drv = TMADriver()
    monkeypatch.setattr(rt_cuda, "_driver", drv)
    k = load(CUBIN, manifest())
    args = [cai((300, 96), "<f2", A_PTR), cai((300, 64), "<f4", C_PTR)]
    k(*args)
    names = [c[0] for c in drv.calls]
    assert names[-4:] == ["context", "encode", "encode", "cuLaunchKernel"]
    assert drv.launches == [drv.encoder.descriptor(drv.encoder.requests[0])]
    drv.calls.clear()
    k(*args)
    assert [c[0] for c in drv.calls] == ["context", "cuLaunchKernel"]  # descriptors cached


# --- the real cuda-bindings encoder -----------------------------------------------------------


def test_real_encoder_arguments():
    cu = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    request = TensorMapRequest("bfloat16", A_PTR, (1008, 300), (2016,), (64, 128), 128)
    args = tensor_map_encode_args(cu, request)
    assert args[0] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert args[1:3] == (2, A_PTR)
    assert all(isinstance(x, cu.cuuint64_t) for x in args[3] + args[4])
    assert all(isinstance(x, cu.cuuint32_t) for x in args[5] + args[6])
    assert [int(x) for x in args[3]] == [1008, 300] and [int(x) for x in args[4]] == [2016]
    assert [int(x) for x in args[5]] == [64, 128] and [int(x) for x in args[6]] == [1, 1]
    assert args[7:] == (cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    for dtype in TMA_DATA_TYPES:  # every manifest dtype names an enum this binding has
        tensor_map_encode_args(cu, TensorMapRequest(dtype, A_PTR, (16, 1), (16,), (16, 1), 0))
    for swizzle in TMA_SWIZZLE_NAMES:
        tensor_map_encode_args(cu, TensorMapRequest("uint8", A_PTR, (16, 1), (16,), (16, 1),
                                                     swizzle))
    assert ctypes.sizeof(rt_launch.TensorMapStorage) == TENSOR_MAP_BYTES
    assert len(cu.CUtensorMap().opaque) * 8 == TENSOR_MAP_BYTES


def test_real_encoder_call():
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    try:
        drv = rt_cuda.driver()
    except LaunchError as e:  # the no-GPU tier: cuda-bindings without libcuda
        assert "cuInit failed" in str(e)
        pytest.skip(f"no CUDA driver here, so cuTensorMapEncodeTiled cannot run: {e}")
    # Encoding reads no memory: an aligned address need not be allocated.
    request = TensorMapRequest("float16", A_PTR, (1008, 300), (2016,), (64, 128), 128)
    desc = drv.encode_tensor_map(request)
    assert len(desc) == TENSOR_MAP_BYTES and desc == drv.encode_tensor_map(request)
    with pytest.raises(LaunchError, match="cuTensorMapEncodeTiled failed: CUDA_ERROR_"):
        drv.encode_tensor_map(TensorMapRequest("float16", A_PTR, (1008, 300), (2016,),
                                               (128, 128), 128))  # 256-byte rows > 128B swizzle


# --- on a GPU: a real TMA kernel ---------------------------------------------------------------

TMA_CU = r"""
#include <cuda.h>
#include <cuda/barrier>
using barrier = cuda::barrier<cuda::thread_scope_block>;
namespace cde = cuda::device::experimental;

// Copies one 8 x 32 float box per block through TMA into a padded output, out-of-bounds
// elements included (TMA fills them with zeros).
extern "C" __global__ void tma_copy_kernel(const __grid_constant__ CUtensorMap src, float* out,
                                           int ld) {
  __shared__ alignas(128) float tile[8][32];
  #pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ barrier bar;
  int x = blockIdx.x * 32, y = blockIdx.y * 8;
  if (threadIdx.x == 0) {
    init(&bar, blockDim.x);
    cde::fence_proxy_async_shared_cta();
  }
  __syncthreads();
  barrier::arrival_token token;
  if (threadIdx.x == 0) {
    cde::cp_async_bulk_tensor_2d_global_to_shared(&tile, &src, x, y, bar);
    token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
  } else {
    token = bar.arrive();
  }
  bar.wait(std::move(token));
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    out[(y + i / 32) * (long long)ld + x + i % 32] = tile[i / 32][i % 32];
}
"""


@pytest.mark.gpu
def test_gpu_tma_copy(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    (tmp_path / "tma.cu").write_text(TMA_CU)
    subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-o", str(tmp_path / "tma.cubin"),
                    str(tmp_path / "tma.cu")], check=True, capture_output=True)
    cubin = (tmp_path / "tma.cubin").read_bytes()
    k = load(cubin, manifest(
        name="tma_copy", symbol="tma_copy_kernel",
        artifact_sha256=hashlib.sha256(cubin).hexdigest(),
        params=[{"name": "X", "kind": "tensor", "dtype": "float32", "shape": ["R", "C"]},
                {"name": "Y", "kind": "tensor", "dtype": "float32", "shape": ["RP", "CP"]}],
        kernel_args=[{"kind": "tensor_map", "param": 0, "box": [32, 8], "swizzle": 0},
                     {"kind": "tensor", "param": 1}, {"kind": "dim", "name": "CP",
                                                      "dtype": "int32"}],
        grid=[["ceildiv", "C", 32], ["ceildiv", "R", 8], 1], block=[128, 1, 1]))
    for rows, cols in [(37, 100), (64, 128), (1, 4)]:  # ragged tails in both dims
        x = torch.randn(rows, cols, device="cuda")
        y = torch.full((-(-rows // 8) * 8, -(-cols // 32) * 32), float("nan"), device="cuda")
        k(x, y)
        torch.cuda.synchronize()
        want = torch.zeros_like(y)
        want[:rows, :cols] = x
        torch.testing.assert_close(y, want)
    with pytest.raises(LaunchError, match=r"C=101 float32 rows are 404 bytes"):
        k(torch.zeros(8, 101, device="cuda"), torch.zeros(8, 128, device="cuda"))


def test_a_4d_tensor_gets_a_4d_descriptor():
    """Attention's K: [batch, heads, seq, dim]; the box takes one seq tile of one head, so a
    tile past the end of a sequence reads zeros instead of the next head's rows."""
    params = [{"name": "K", "kind": "tensor", "dtype": "float16", "shape": [2, 4, "S", 128]}]
    m = manifest(params=params, grid=[1, 1, 1],
                 kernel_args=[{"kind": "tensor_map", "param": 0, "box": [64, 128, 1, 1],
                               "swizzle": 128}])
    enc = RecordingEncoder()
    k = cai((2, 4, 1000, 128), "<f2", A_PTR)
    pack_kernel_params(m, bind_args(m.params, [k], "cuda"), encode_tensor_map=enc)
    assert enc.requests == [TensorMapRequest("float16", A_PTR, (128, 1000, 4, 2),
                                             (256, 256 * 1000, 256 * 1000 * 4),
                                             (64, 128, 1, 1), 128)]
    # A strided view (every other head) keeps its real strides; a size-1 dim any legal one.
    plan = LaunchPlan(m, encode_tensor_map=enc)
    view = TensorView(None, "cuda_array_interface", A_PTR, (2, 2, 1000, 128),
                      (8 * 128000, 2 * 128000, 128, 1), "float16", "<f2", "cuda", 0)
    plan.pack(BoundArgs([view], {"S": 1000}, 0))
    assert enc.requests[-1].strides == (256, 512000, 2048000)
    view = TensorView(None, "cuda_array_interface", A_PTR, (2, 2, 1000, 128),
                      (2 * 128004, 128004, 128, 1), "float16", "<f2", "cuda", 0)
    with pytest.raises(LaunchError, match=r"K \(kernel_args\[0\], tensor_map\): stride of dim 1 "
                                          r"is 256008 bytes; TMA needs strides that are multiples "
                                          r"of 16 bytes"):
        plan.pack(BoundArgs([view], {"S": 1000}, 0))
