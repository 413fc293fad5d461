"""Two 16-bit fragment slots stored as one 32-bit pair where the program computes them from the
halves of one 32-bit value (targets/cuda/halves.py): the rule on TIR, and kernels written
element by element that take it (or not) on cuda:sm_90a and rocm:gfx942, the latter run by
the ROCm emulator."""

import re
import shutil

import ml_dtypes
import numpy as np
import pytest

import tiled
import tiled.lang as T


def _halves_of(t, c, shift_hi=16, t_hi=None):
    from tvm import tirx

    def half(word, s):
        shifted = word >> tirx.BitwiseAnd(tirx.const(s, "int32"), tirx.const(31, "int32"))
        return tirx.reinterpret("float16", tirx.Cast("int16", shifted)) - c

    return half(t, 0), half(t if t_hi is None else t_hi, shift_hi)


def test_the_halves_of_one_word_fuse_into_a_pair():
    """cast(int16, t) and cast(int16, t >> 16) under the same arithmetic are the lanes of
    reinterpret(float16x2, t); the constant beside them is broadcast. The lowering's masked
    shift amounts (`s & 31`) count as constants."""
    from tvm import tirx

    from tiled.compiler.targets.cuda.halves import fuse

    t = tirx.Var("t", "int32")
    c = tirx.const(1032.0, "float16")
    pair = fuse(*_halves_of(t, c))
    assert pair is not None and str(pair.ty) == "float16x2"
    assert "reinterpret" in str(pair) and "int16" not in str(pair)


def test_lanes_that_are_not_one_words_halves_stay_apart():
    """A shift other than 16, two different words, and two identical lanes (nothing to gain)
    are not fused."""
    from tvm import tirx

    from tiled.compiler.targets.cuda.halves import fuse

    t, u = tirx.Var("t", "int32"), tirx.Var("u", "int32")
    c = tirx.const(1032.0, "float16")
    assert fuse(*_halves_of(t, c, shift_hi=8)) is None
    assert fuse(*_halves_of(t, c, t_hi=u)) is None
    lo, _ = _halves_of(t, c)
    assert fuse(lo, lo) is None


def _unpack(N: int, paired: bool, dtype: str = "float16", ints: str = "int16", rows=True):
    """Y = 2 x - 1 for 16-bit floats x stored two to an int32 word, unpacked element by
    element into a fragment, each row also scaled by a per-row factor held in a rows
    fragment (`rows`); `paired` False reads a word per element (its low half), so no two
    slots share a word."""

    @tiled.kernel
    def unpack(P: T.Tensor((64, N), "int32"), R: T.Tensor((64,), dtype),
               Y: T.Tensor((64, N), dtype)):
        with T.Kernel(1, threads=128):
            f = T.alloc_fragment((64, N), dtype)
            r = T.alloc_fragment((64,), dtype)
            T.copy(R, r)
            for i, j in T.Parallel(64, N):
                word = P[i, j // 2] if paired else P[i, j]
                half = T.reinterpret(dtype, T.cast(word >> (j % 2 * 16 if paired else 0), ints))
                f[i, j] = (half * 2.0 - 1.0) * r[i] if rows else half * 2.0 - 1.0
            T.copy(f, Y)

    return unpack


@pytest.mark.parametrize("paired,dtype,ints", [(True, "float16", "int16"),
                                               (True, "bfloat16", "uint16"),
                                               (False, "float16", "int16")])
def test_a_fragment_unpacked_from_half_pairs(paired, dtype, ints):
    """The paired kernel's fragment is stored a 32-bit pair at a time (one two-lane store per
    two slots; the row factor, the same in both, broadcast) and its values are right, the low
    half first: the ROCm build run by the emulator, float16 and bfloat16 (unsigned halves).
    The unpaired one is stored element by element and is right too."""
    import torch

    N = 64
    kernel = _unpack(N, paired, dtype, ints)
    vec = "half2" if dtype == "float16" else r"\w*bfloat16\w*2"
    for target in ("cuda:sm_90a", "rocm:gfx942"):
        src = tiled.compile(kernel, target=target, cache=False).source
        stores = re.findall(rf"\*\({vec}\*\)\(f_ptr \+ \d+\) =", src)
        assert len(stores) == (N * 64 // 128 // 2 if paired else 0), (target, src)
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, N, generator=g).to(tdt)
    r = (torch.rand(64, generator=g) + 0.5).to(tdt)
    words = torch.zeros(64, N, dtype=torch.int32)
    if paired:
        words[:, :N // 2] = x.view(torch.int32)
    else:
        words[:] = x.view(torch.int16).to(torch.int32) & 0xFFFF
    npdt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    y = np.zeros((64, N), npdt)
    r16 = r.view(torch.int16).numpy().view(npdt)
    tiled.compile(kernel, target="rocm:gfx942", cache=False).emulate(words.numpy(), r16, y)
    want = ((x * 2 - 1) * r[:, None]).view(torch.int16).numpy()  # in the 16-bit dtype
    np.testing.assert_array_equal(y.view(np.int16), want)


def test_paired_unpacking_has_no_repacking_on_sm90a(tmp_path):
    """On sm_90a the paired kernel's pairs take no PRMT (nvcc's repacking of two halves it
    narrowed apart) and their arithmetic runs two lanes at a time (HFMA2). (Without the row
    factor, whose broadcast to both lanes is a PRMT of its own.)"""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tests.compiler.test_sm90_path import sass

    kernel = _unpack(64, True, rows=False)
    text = sass(tiled.compile(kernel, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert not re.search(r"\bPRMT\b", text)
    assert re.search(r"\bHFMA2\b", text)
