"""CPU backend end to end: kernels built here with TVM's IR builder, linked with tiled's shim,
loaded and run through tiled.runtime (which never imports TVM)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tiled import config
from tiled.errors import LaunchError
from tiled.runtime import Manifest, TensorView, load
from tiled.runtime.args import BoundArgs

tvm = pytest.importorskip("tvm")
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from tiled.compiler.toolchain.cc import link_cpu_library

ROOT = Path(__file__).resolve().parents[2]


def _compile(func, name: str, out_dir: Path) -> bytes:
    ex = tvm.compile(tvm.IRModule({name: func}), target=tvm.target.Target({"kind": "llvm"}))
    obj, lib = out_dir / f"{name}.o", out_dir / f"{name}.so"
    ex.mod.write_to_file(str(obj))
    link_cpu_library(obj, lib)
    return lib.read_bytes()


def _manifest(name: str, artifact: bytes, params: list[dict]) -> Manifest:
    return Manifest.from_dict({
        "manifest_version": 1, "name": name, "program_digest": hashlib.sha256(name.encode())
        .hexdigest(), "target": "cpu", "backend": "cpu", "arch": "x86_64",
        "artifact_format": "so", "artifact_sha256": hashlib.sha256(artifact).hexdigest(),
        "symbol": f"__tvm_ffi_{name}", "params": params})


def _tensor(name, dtype, shape, align=64):
    # TVM assumes 64-byte aligned buffers unless a T.Buffer says otherwise.
    return {"name": name, "kind": "tensor", "dtype": dtype, "shape": shape, "align": align}


def aligned(shape, dtype, fill=None, align=64):
    """A C-contiguous numpy array whose data is `align`-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    a = raw[off:off + nbytes].view(dtype).reshape(shape)
    if fill is not None:
        a[...] = fill
    return a


def _vadd():
    n = tirx.Var("n", "int32")
    with IRBuilder() as ib, T.prim_func():
        T.func_name("vadd")
        T.func_attr({"tirx.noalias": True})
        A = T.arg("A", T.Buffer((n,), "float32"))
        B = T.arg("B", T.Buffer((n,), "float32"))
        C = T.arg("C", T.Buffer((n,), "float32"))
        with T.parallel(0, n) as i:
            T.buffer_store(C, A[i] + B[i], [i])
    return ib.get()


def _workspace():
    # A 16 KiB buffer per iteration of a parallel loop: TVM takes it from the workspace
    # allocator (one per task), and the assert fails on whichever thread meets a negative row.
    n = tirx.Var("n", "int32")
    with IRBuilder() as ib, T.prim_func():
        T.func_name("rev")
        T.func_attr({"tirx.noalias": True})
        A = T.arg("A", T.Buffer((n, 4096), "float32"))
        B = T.arg("B", T.Buffer((n, 4096), "float32"))
        with T.parallel(0, n) as i, T.Assert(A[i, 0] >= T.float32(0), ["row starts negative"]):
            tmp = T.alloc_buffer((4096,), "float32")
            with T.serial(0, 4096) as j:
                T.buffer_store(tmp, A[i, j] * T.float32(2), [j])
            with T.serial(0, 4096) as j:
                T.buffer_store(B, tmp[4095 - j] + T.float32(1), [i, j])
    return ib.get()


def _axpb():
    # out[i] = x[i] * alpha + k: a float and an int scalar.
    n = tirx.Var("n", "int32")
    with IRBuilder() as ib, T.prim_func():
        T.func_name("axpb")
        T.func_attr({"tirx.noalias": True})
        X = T.arg("X", T.Buffer((n,), "float32"))
        alpha = T.arg("alpha", tirx.Var("alpha", "float32"))
        k = T.arg("k", tirx.Var("k", "int32"))
        Y = T.arg("Y", T.Buffer((n,), "float32"))
        with T.serial(0, n) as i:
            T.buffer_store(Y, X[i] * alpha + T.Cast("float32", k), [i])
    return ib.get()


def _transpose():
    m, n = tirx.Var("m", "int32"), tirx.Var("n", "int32")
    with IRBuilder() as ib, T.prim_func():
        T.func_name("transpose")
        T.func_attr({"tirx.noalias": True})
        A = T.arg("A", T.Buffer((m, n), "float16"))
        B = T.arg("B", T.Buffer((n, m), "float16"))
        with T.parallel(0, n) as j, T.serial(0, m) as i:
            T.buffer_store(B, A[i, j], [j, i])
    return ib.get()


def _atomic_sum():
    # What the CPU backend emits for T.atomic_add: a call into the shim from parallel tasks.
    n = tirx.Var("n", "int32")
    with IRBuilder() as ib, T.prim_func():
        T.func_name("asum")
        T.func_attr({"tirx.noalias": True})
        A = T.arg("A", T.Buffer((n,), "int64"))
        S = T.arg("S", T.Buffer((1,), "int64"))
        with T.parallel(0, n) as i:
            T.evaluate(T.call_extern("void", "tiled_atomic_add_int64",
                                     T.address_of(S[0]), A[i]))
    return ib.get()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels")
    with config.override(cache_dir=out / "cache"):
        arts = {name: _compile(f(), name, out) for name, f in
                [("vadd", _vadd), ("rev", _workspace), ("axpb", _axpb),
                 ("transpose", _transpose), ("asum", _atomic_sum)]}
    params = {
        "vadd": [_tensor("A", "float32", ["n"]), _tensor("B", "float32", ["n"]),
                 _tensor("C", "float32", ["n"])],
        "rev": [_tensor("A", "float32", ["n", 4096]), _tensor("B", "float32", ["n", 4096])],
        "axpb": [_tensor("X", "float32", ["n"]), {"name": "alpha", "kind": "scalar",
                 "dtype": "float32"}, {"name": "k", "kind": "scalar", "dtype": "int32"},
                 _tensor("Y", "float32", ["n"])],
        "transpose": [_tensor("A", "float16", ["m", "n"]), _tensor("B", "float16", ["n", "m"])],
        "asum": [_tensor("A", "int64", ["n"]), _tensor("S", "int64", [1])],
    }
    return {name: (art, _manifest(name, art, params[name])) for name, art in arts.items()}


@pytest.fixture(autouse=True)
def _scoped_config(tmp_path):
    with config.override(cache_dir=tmp_path / "cache"):
        yield


@pytest.mark.parametrize("n", [1, 7, 1000, 100_003])
def test_vadd_matches_numpy(kernels, n):
    k = load(*kernels["vadd"])
    rng = np.random.default_rng(n)
    a = aligned((n,), np.float32, rng.standard_normal(n))
    b = aligned((n,), np.float32, rng.standard_normal(n))
    c = aligned((n,), np.float32, 0)
    k(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_vadd_single_thread_and_concurrent_callers(kernels):
    k = load(*kernels["vadd"])
    assert k.set_num_threads(1) == 1
    a = aligned((5000,), np.float32, 1.5)
    c = aligned((5000,), np.float32, 0)
    k(a, a, c)
    np.testing.assert_array_equal(c, 3.0)
    assert k.set_num_threads(0) >= 1
    outs = [aligned((50_000,), np.float32, 0) for _ in range(8)]
    ins = [aligned((50_000,), np.float32, i) for i in range(8)]
    threads = [threading.Thread(target=lambda i=i: [k(ins[i], ins[i], outs[i])
                                                    for _ in range(20)]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_array_equal(outs[i], 2.0 * i)


@pytest.mark.parametrize("spin_us", [0, 1, 200])
def test_pool_threads_spinning_or_sleeping_between_launches(kernels, spin_us):
    """Workers that sleep at once (0), give up spinning between launches (1 us: the sleep path
    after a spin), or catch the next launch spinning (200) all run every task of every launch,
    from one caller and from several."""
    from tiled.runtime import cpu as cpu_runtime

    k = load(*kernels["vadd"])
    k.set_num_threads(4)
    cpu_runtime.set_pool_spin_us(spin_us)
    try:
        a = aligned((20_000,), np.float32, 1.0)
        for i in range(50):
            c = aligned((20_000,), np.float32, 0)
            b = aligned((20_000,), np.float32, float(i))
            k(a, b, c)
            np.testing.assert_array_equal(c, 1.0 + i)
            if i % 10 == 9:
                time.sleep(0.002)  # past a 1 us spin: the workers sleep, then wake
        outs = [aligned((20_000,), np.float32, 0) for _ in range(4)]
        threads = [threading.Thread(target=lambda i=i: [k(a, a, outs[i]) for _ in range(20)])
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for out in outs:
            np.testing.assert_array_equal(out, 2.0)
    finally:
        cpu_runtime.set_pool_spin_us(config.get("cpu_spin_us"))
        k.set_num_threads(0)


def test_workspace_in_parallel_loop(kernels):
    k = load(*kernels["rev"])
    n = 37
    a = aligned((n, 4096), np.float32, np.random.default_rng(0).random((n, 4096)))
    b = aligned((n, 4096), np.float32, 0)
    k(a, b)
    np.testing.assert_allclose(b, a[:, ::-1] * 2 + 1, rtol=1e-6)


def test_assert_on_worker_thread_surfaces(kernels):
    k = load(*kernels["rev"])
    k.set_num_threads(4)
    a = aligned((64, 4096), np.float32, 1.0)
    a[63, 0] = -1.0  # the last task, on a worker thread when there are several
    b = aligned((64, 4096), np.float32, 0)
    with pytest.raises(LaunchError, match="row starts negative"):
        k(a, b)
    a[63, 0] = 1.0
    k(a, b)  # the pool keeps working after a failure


def test_scalars(kernels):
    k = load(*kernels["axpb"])
    x = aligned((100,), np.float32, np.arange(100))
    y = aligned((100,), np.float32, 0)
    k(x, 0.5, 3, y)
    np.testing.assert_allclose(y, x * 0.5 + 3)
    k(x, 2, np.int32(-1), y)  # an int for a float param; a numpy scalar
    np.testing.assert_allclose(y, x * 2 - 1)
    with pytest.raises(LaunchError, match=r"k: expected an int for int32, got float"):
        k(x, 0.5, 3.0, y)
    with pytest.raises(LaunchError, match=r"k: 4294967296 is out of range for int32"):
        k(x, 0.5, 1 << 32, y)


def test_launches_reuse_arguments_only_where_shapes_match(kernels):
    """A thread's launches with the shapes of its last one reuse its ctypes arguments
    (tiled.runtime.cpu._Frame): each still reads its own tensors and scalars, and a launch
    with other shapes (an empty tensor among them) builds its own."""
    k = load(*kernels["axpb"])
    for n, scale, shift in [(100, 0.5, 3), (100, 2.0, -1), (7, 1.0, 0), (100, -1.0, 5),
                            (0, 3.0, 1), (100, 0.25, 2)]:
        x = aligned((n,), np.float32, np.arange(n))
        y = aligned((n,), np.float32, 0)
        k(x, scale, shift, y)
        np.testing.assert_allclose(y, x * scale + shift)


def test_shim_atomics_from_parallel_tasks(kernels):
    k = load(*kernels["asum"])
    k.set_num_threads(4)
    a = aligned((100_000,), np.int64, np.arange(100_000) * 3)
    total = aligned((1,), np.int64, 7)
    k(a, total)
    assert total[0] == 7 + int(a.sum())


def test_2d_transpose(kernels):
    k = load(*kernels["transpose"])
    a = aligned((33, 70), np.float16, np.random.default_rng(1).random((33, 70)))
    b = aligned((70, 33), np.float16, 0)
    k(a, b)
    np.testing.assert_array_equal(b, a.T)
    with pytest.raises(LaunchError, match=r"B: dim 0 is n=33 here but n=70 from A"):
        k(a, aligned((33, 33), np.float16))


def test_wrong_arguments_fail_before_the_call(kernels):
    k = load(*kernels["vadd"])
    a, c = aligned((10,), np.float32, 1), aligned((10,), np.float32, 0)
    with pytest.raises(LaunchError, match=r"B: dim 0 is n=11 here but n=10 from A"):
        k(a, aligned((11,), np.float32), c)
    with pytest.raises(LaunchError, match=r"C: expected dtype float32, got float64"):
        k(a, a, aligned((10,), np.float64))
    with pytest.raises(LaunchError, match=r"expected 3 arguments \(A, B, C\), got 2"):
        k(a, a)
    with pytest.raises(LaunchError, match=r"A: not contiguous"):
        k(aligned((20,), np.float32)[::2], a, c)
    with pytest.raises(LaunchError, match=r"B: data pointer 0x[0-9a-f]+ is not aligned to 64"):
        k(a, aligned((11,), np.float32)[1:], c)
    np.testing.assert_array_equal(c, 0)  # nothing ran


def test_tvm_check_message_surfaces(kernels):
    # Bypass tiled's checks: TVM's own entry check must come back as the message.
    k = load(*kernels["vadd"])
    a = aligned((4, 1), np.float32, 0)
    views = [TensorView(a, "numpy", a.ctypes.data, (4, 1), None, "float32", "float32", "cpu",
                        None) for _ in range(3)]
    with pytest.raises(LaunchError, match=r"(?s)ValueError: Mismatched A.ndim on argument #0.*"
                                          r"expected 1"):
        k.launch(BoundArgs(values=views, dims={"n": 4}))


def test_artifact_digest_is_checked(kernels):
    art, m = kernels["vadd"]
    with pytest.raises(LaunchError, match="does not match the manifest"):
        load(art + b"\0", m)
    bad = Manifest.from_dict({**m.to_dict(), "symbol": "__tvm_ffi_nope"})
    with pytest.raises(LaunchError, match="no symbol '__tvm_ffi_nope'"):
        load(art, bad)


def test_empty_tensors(kernels):
    k = load(*kernels["vadd"])
    e = np.empty((0,), np.float32)
    k(e, e, e)


def test_runtime_never_imports_tvm(kernels, tmp_path):
    art, m = kernels["axpb"]
    (tmp_path / "k.so").write_bytes(art)
    (tmp_path / "k.json").write_text(m.to_json())
    code = f"""
import sys
import numpy as np
import tiled.runtime
from pathlib import Path
def aligned(n):
    raw = np.zeros(4 * n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + 4 * n].view(np.float32)
d = Path({str(tmp_path)!r})
k = tiled.runtime.load((d / "k.so").read_bytes(), (d / "k.json").read_text())
x, y = aligned(8), aligned(8)
x[:] = np.arange(8)
k(x, 2.0, 1, y)
assert (y == x * 2 + 1).all(), y
bad = [m for m in sys.modules if m == "tvm" or m.startswith(("tvm.", "tvm_ffi"))]
assert not bad, bad
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
