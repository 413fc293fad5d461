"""Streaming (non-temporal) stores on the cpu backend (targets/cpu/stream_out.py): which outputs
take them, the IR marking, and kernels that give the same results whichever way a call
stores, aligned or not, whole blocks or edge ones, with or without clang."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled import config
from tiled.compiler.targets.cpu import stream_out
from tiled.ops import kernels
from tiled.runtime import cpu_levels

X86 = cpu_levels.host_cpu().isa == "x86_64"
CLANG = shutil.which("clang-22") is not None
needs_clang = pytest.mark.skipif(not (X86 and CLANG), reason="streaming stores take x86-64 "
                                 "and clang-22")


def row_scale(cols: int, blk: int = 4, read_back: bool = False):
    M = T.dyn("M")

    @tiled.kernel
    def row_scale_kernel(X: T.Tensor((M, cols), "float32"), Y: T.Tensor((M, cols), "float32")):
        with T.Kernel(T.ceildiv(M, blk), threads=128) as bx:
            t = T.alloc_fragment((blk, cols), "float32")
            T.copy(X[bx * blk, 0], t)
            for i, j in T.Parallel(blk, cols):
                t[i, j] = t[i, j] * 2.0 + (Y[bx * blk + i, j] if read_back else 0.0)
            T.copy(t, Y[bx * blk, 0])
    return row_scale_kernel


def column_copy():
    M = T.dyn("M")

    @tiled.kernel
    def column_kernel(X: T.Tensor((4096, M), "float32"), Y: T.Tensor((4096, M), "float32")):
        with T.Kernel(M, threads=128) as bx:
            t = T.alloc_fragment((4096, 1), "float32")
            T.copy(X[0, bx], t)
            for i, j in T.Parallel(4096, 1):
                t[i, j] = t[i, j] + 1.0
            T.copy(t, Y[0, bx])
    return column_kernel


def direct_store(cols: int, transposed: bool = False):
    M = T.dyn("M")

    @tiled.kernel
    def direct_kernel(X: T.Tensor((M, cols), "float32"), Y: T.Tensor((M, cols), "float32"),
                      Z: T.Tensor((cols, M), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=128) as bx:
            for i, j in T.Parallel(4, cols):
                if transposed:
                    Z[j, bx * 4 + i] = X[bx * 4 + i, j] + 1.0
                else:
                    Y[bx * 4 + i, j] = X[bx * 4 + i, j] + 1.0
    return direct_kernel


def _outputs(kernel) -> list[str]:
    proto = kernel.ir.proto
    names = {b.id: b.name for b in proto.buffers}
    return sorted(names[b] for b in stream_out.outputs(proto))


def test_only_large_write_only_row_tiles_stream():
    assert _outputs(kernels.softmax(4096, "float32", blk_m=4)) == ["Y"]
    assert _outputs(kernels.softmax(4096, "bfloat16", blk_m=4)) == ["Y"]
    assert _outputs(row_scale(2048, blk=4)) == ["Y"]  # 8 KiB rows, 32 KiB tile
    assert _outputs(row_scale(64, blk=4)) == []  # 256-byte rows: not worth a stream
    assert _outputs(row_scale(256, blk=8)) == ["Y"]  # 1 KiB runs, an 8 KiB tile
    assert _outputs(row_scale(256, blk=4)) == []  # a 4 KiB tile
    assert _outputs(row_scale(2048, read_back=True)) == []  # the kernel reads Y
    assert _outputs(column_copy()) == []  # a column is no contiguous run
    assert _outputs(direct_store(2048)) == ["Y"]  # stored from an element loop along its rows
    assert _outputs(direct_store(2048, transposed=True)) == []  # along its columns
    assert _outputs(direct_store(128)) == []  # 512-byte runs
    # a sigmoid per element: its stores trickle out too slowly to stream
    assert _outputs(kernels.gated_activation(4096, "float32", "silu", block_n=4096)) == []


IR = """\
  store <8 x float> %a, ptr %p, align 16, !tbaa !10
  store <8 x float> %b, ptr %q, align 4, !tbaa !10
  store <8 x float> %c, ptr %r, align 32, !tbaa !20
  store float %d, ptr %s, align 16, !tbaa !10
  store <16 x i16> %e, ptr %t, align 32, !tbaa !10, !alias.scope !30
  store <16 x bfloat> %f, ptr %u, align 16, !tbaa !10
!8 = !{!"0xabc", !9, i64 0}
!9 = !{!"root"}
!10 = !{!8, !8, i64 0}
!18 = !{!"0xdef", !9, i64 0}
!20 = !{!18, !18, i64 0}
!30 = !{!30}
"""


def test_mark_takes_only_aligned_vector_stores_of_the_alias_types():
    out, count = stream_out.mark(IR, ["0xabc"])
    lines = out.splitlines()
    assert count == 3
    assert lines[0].endswith("!tbaa !10, !nontemporal !31")  # aligned, the alias's type
    assert "nontemporal" not in lines[1]  # align 4: LLVM could not prove it aligned
    assert "nontemporal" not in lines[2]  # another buffer's type
    assert "nontemporal" not in lines[3]  # a scalar
    assert lines[4].endswith("!alias.scope !30, !nontemporal !31")
    # bfloat16 vectors go as i16 bits out of an empty asm (x86 would store them plainly)
    assert lines[5:8] == [
        "  %tiled.nt.bits2.0 = bitcast <16 x bfloat> %f to <16 x i16>",
        '  %tiled.nt.bits2 = call <16 x i16> asm "", "=v,0"(<16 x i16> %tiled.nt.bits2.0)',
        "  store <16 x i16> %tiled.nt.bits2, ptr %u, align 16, !tbaa !10, !nontemporal !31"]
    assert lines[-1] == "!31 = !{i32 1}"


def _objdump(artifact: bytes, tmp_path: Path) -> str:
    so = tmp_path / "k.so"
    so.write_bytes(artifact)
    return subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True,
                          check=True).stdout


_RUN = """
import json, sys
import numpy as np
import tiled
from tiled.ops import kernels
rows, offset, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
k = tiled.compile(kernels.softmax(4096, dtype, blk_m=4), target="cpu")
x = (np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32) * 3)
if dtype == "bfloat16":
    import ml_dtypes
    x = x.astype(ml_dtypes.bfloat16)
raw = np.zeros(rows * 4096 * x.itemsize + 128, np.uint8)
start = (-raw.ctypes.data) % 64 + offset
y = raw[start:start + rows * 4096 * x.itemsize].view(x.dtype).reshape(rows, 4096)
k(x, y)
np.save(sys.argv[4], y.astype(np.float32))
"""


def _softmax_in_child(tmp_path, rows, offset, dtype, stream_bytes, cache) -> np.ndarray:
    out = tmp_path / f"y_{rows}_{offset}_{dtype}_{stream_bytes}.npy"
    env = {**os.environ, "TILED_CACHE_DIR": str(cache), "TILED_CPU_STREAM_BYTES": stream_bytes}
    subprocess.run([sys.executable, "-c", _RUN, str(rows), str(offset), dtype, str(out)],
                   env=env, check=True, timeout=600)
    return np.load(out)


@needs_clang
@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is missing")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softmax_streams_and_matches_its_plain_stores(tmp_path, dtype):
    """The same kernel, three ways a call stores: streaming (threshold 0, output 64-byte
    aligned), plain because the output is 4 bytes off 16-byte alignment, plain because the
    output is below the threshold. 13 rows: three whole blocks of 4 and an edge block."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    cache = tmp_path / "cache"
    with config.override(cache_dir=cache):
        k = tiled.compile(kernels.softmax(4096, dtype, blk_m=4), target="cpu")
    asm = _objdump(k.artifact, tmp_path)
    assert re.search(r"vmovnt(ps|dq)", asm)  # float32 or bfloat16 bits
    streamed = _softmax_in_child(tmp_path, 13, 0, dtype, "0", cache)
    unaligned = _softmax_in_child(tmp_path, 13, 4, dtype, "0", cache)
    small = _softmax_in_child(tmp_path, 13, 0, dtype, str(1 << 40), cache)
    np.testing.assert_array_equal(streamed, unaligned)
    np.testing.assert_array_equal(streamed, small)
    x = np.random.default_rng(0).standard_normal((13, 4096), dtype=np.float32) * 3
    if dtype == "bfloat16":
        import ml_dtypes

        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert np.abs(streamed - want).max() / want.max() < tol


@needs_clang
@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is missing")
def test_no_streaming_when_turned_off_or_without_clang(tmp_path):
    from tiled.compiler.toolchain.digest import clear_memo

    with config.override(cache_dir=tmp_path / "cache"):
        off = tiled.compile(row_scale(2048), target="cpu", stream_stores=False)
        assert "vmovnt" not in _objdump(off.artifact, tmp_path)
        with config.override(clang="no-such-clang"):
            clear_memo()
            try:
                none = tiled.compile(row_scale(2048), target="cpu")
            finally:
                clear_memo()
        assert "vmovnt" not in _objdump(none.artifact, tmp_path)
        on = tiled.compile(row_scale(2048), target="cpu")
        assert "vmovntps" in _objdump(on.artifact, tmp_path)
    x = np.arange(5 * 2048, dtype=np.float32).reshape(5, 2048)
    for k in (off, none, on):
        y = np.zeros_like(x)
        k(x, y)
        np.testing.assert_array_equal(y, x * 2)


_DIRECT = """
import sys
import numpy as np
import tiled
sys.path.insert(0, sys.argv[3])
from test_cpu_stream_out import direct_store
k = tiled.compile(direct_store(2048), target="cpu")
x = np.random.default_rng(1).standard_normal((7, 2048), dtype=np.float32)
raw = np.zeros(7 * 2048 * 4 + 128, np.uint8)
start = (-raw.ctypes.data) % 64 + int(sys.argv[1])
y = raw[start:start + 7 * 2048 * 4].view(np.float32).reshape(7, 2048)
k(x, y, np.zeros((2048, 7), np.float32))
np.save(sys.argv[2], y)
"""


@needs_clang
@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is missing")
def test_element_loop_stores_stream_too(tmp_path):
    """An element loop storing Y along its rows streams (threshold 0, aligned) or stores plainly
    (4 bytes off alignment), the same values; 7 rows: an edge block."""
    cache = tmp_path / "cache"
    with config.override(cache_dir=cache):
        k = tiled.compile(direct_store(2048), target="cpu")
    assert "vmovntps" in _objdump(k.artifact, tmp_path)
    got = []
    for offset in (0, 4):
        out = tmp_path / f"direct_{offset}.npy"
        env = {**os.environ, "TILED_CACHE_DIR": str(cache), "TILED_CPU_STREAM_BYTES": "0"}
        subprocess.run([sys.executable, "-c", _DIRECT, str(offset), str(out),
                        str(Path(__file__).parent)], env=env, check=True, timeout=600)
        got.append(np.load(out))
    x = np.random.default_rng(1).standard_normal((7, 2048), dtype=np.float32)
    np.testing.assert_array_equal(got[0], x + 1)
    np.testing.assert_array_equal(got[1], x + 1)


_THRESHOLD = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.tiled_stream_threshold.restype = ctypes.c_int64
print(lib.tiled_stream_threshold())
"""


@needs_clang
@pytest.mark.parametrize("env, want", [("0", 0), ("123456", 123456), (None, "llc"),
                                       ("lots", "llc"), ("-5", "llc")])
def test_stream_threshold_from_the_environment_else_twice_the_largest_cache(tmp_path, env, want):
    with config.override(cache_dir=tmp_path / "cache"):
        k = tiled.compile(row_scale(2048), target="cpu")
    so = tmp_path / "k.so"
    so.write_bytes(k.artifact)
    child_env = {k: v for k, v in os.environ.items() if k != "TILED_CPU_STREAM_BYTES"}
    if env is not None:
        child_env["TILED_CPU_STREAM_BYTES"] = env
    got = int(subprocess.run([sys.executable, "-c", _THRESHOLD, str(so)], env=child_env,
                             capture_output=True, text=True, check=True).stdout)
    if want != "llc":
        assert got == want
        return
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    assert got == (2 * max(sizes) if sizes else 64 << 20)


def test_stream_stores_is_a_checked_cpu_option():
    from tiled.compiler.registry import check_options

    assert check_options("cpu", {"stream_stores": True}) == {}  # the default: same key
    assert check_options("cpu", {"stream_stores": False}) == {"stream_stores": False}
    with pytest.raises(ValueError, match=r"stream_stores.*must be a bool"):
        check_options("cpu", {"stream_stores": 1})
