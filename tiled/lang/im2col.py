"""`T.im2col` (TileLang's, and its older name `T.c2d_im2col`): one tile of a 2-D convolution's
implicit GEMM operand, gathered from an NHWC image.

The GEMM is out[n p q, f] = sum over (kh, kw, c) of img[n, p s + kh d - pad, q s + kw d - pad,
c] * w[kh, kw, c, f]: M runs over the output pixels (n, p, q), K over the taps (kh, kw, c),
c fastest. `T.im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad)` fills the
[BM, BK] tile `col` with rows nhw_step * BM .. and columns c_step * BK .. of that operand:
zero where a tap falls in the padding, and past the last pixel or tap. It is traced as the
T.Parallel gather an author would write (so every target lowers it as such a loop: on CUDA a
cp.async producer when its channels fill whole steps, targets/cuda/gather.py).
"""

from __future__ import annotations

from tiled.lang.builder import definition_error
from tiled.lang.expr import SCOPE_NAMES, BufferRef, as_expr, select
from tiled.lang.loops import Parallel
from tiled.v1 import tile_ir_pb2 as pb

_EVICTION = (None, "evict_normal", "evict_first", "evict_last")


def _int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise definition_error(f"T.im2col: {name} must be an int >= {low}, got {value!r}")
    return value


def im2col(img, col, nhw_step, c_step, kernel: int, stride: int = 1, dilation: int = 1,
           pad: int = 0, eviction_policy: str | None = None, annotations: dict | None = None
           ) -> None:
    """Gathers the [BM, BK] convolution operand tile `col` (shared or fragment) from `img`, a
    global [N, H, W, C] tensor (N may be symbolic): row i is output pixel nhw_step * BM + i
    (n, p, q with q fastest), column j the tap c_step * BK + j (kh, kw, c with c fastest) of
    a kernel x kernel filter. `eviction_policy` and `annotations` are TileLang's cache hints:
    checked, then dropped.

    >>> T.im2col(data, data_shared, by, k_iter, KH, S, D, P)
    """
    if not isinstance(img, BufferRef) or img.scope != pb.GLOBAL or img.ndim != 4:
        raise definition_error(f"T.im2col: img must be a 4-D global tensor [N, H, W, C], got "
                               f"{img!r}")
    if not isinstance(col, BufferRef) or col.scope not in (pb.SHARED, pb.FRAGMENT) or \
            col.ndim != 2:
        raise definition_error(f"T.im2col: col must be a 2-D shared or fragment tile, got "
                               f"{col!r}")
    if col.dtype != img.dtype:
        raise definition_error(f"T.im2col: col {col.name} is {col.dtype} ({SCOPE_NAMES[col.scope]}"
                               f"), img {img.name} is {img.dtype}; they must match")
    if eviction_policy not in _EVICTION:
        raise definition_error(f"T.im2col: eviction_policy must be one of "
                               f"{', '.join(map(repr, _EVICTION))}, got {eviction_policy!r}")
    if annotations is not None and not isinstance(annotations, dict):
        raise definition_error(f"T.im2col: annotations must be a dict, got {annotations!r}")
    k = _int(kernel, "kernel", 1)
    s, d, p = _int(stride, "stride", 1), _int(dilation, "dilation", 1), _int(pad, "pad", 0)
    N, H, W, C = img.shape
    for name, size in (("H", H), ("W", W), ("C", C)):
        if not isinstance(size, int):
            raise definition_error(f"T.im2col: img {img.name}'s {name} must be static, got "
                                   f"{size!r}")
    OH, OW = (H + 2 * p - d * (k - 1) - 1) // s + 1, (W + 2 * p - d * (k - 1) - 1) // s + 1
    if OH < 1 or OW < 1:
        raise definition_error(f"T.im2col: a {k}x{k} kernel (dilation {d}, pad {p}) leaves no "
                               f"output of a {H}x{W} image")
    BM, BK = col.shape
    pixels, taps = as_expr(N) * (OH * OW), k * k * C
    for i, j in Parallel(BM, BK):
        m = nhw_step * BM + i
        if C % BK == 0:
            # Each step's columns are consecutive channels of one tap (the same values as
            # below, written so that the tap and the test are free of j: the gather then
            # moves whole vectors of channels).
            chunks = C // BK
            tap, c = c_step // chunks, c_step % chunks * BK + j
            r, q = tap // k, tap % k
            in_taps = c_step * BK < taps
        else:
            t = c_step * BK + j
            r, q, c = t // (k * C), t // C % k, t % C
            in_taps = t < taps
        h = m % (OH * OW) // OW * s + r * d - p
        w = m % OW * s + q * d - p
        inside = (m < pixels) & in_taps & (h >= 0) & (h < H) & (w >= 0) & (w < W)
        col[i, j] = select(inside, img[m // (OH * OW), h, w, c], 0)


def c2d_im2col(img, col, nhw_step, c_step, kernel: int, stride: int = 1, dilation: int = 1,
               pad: int = 0, eviction_policy: str | None = None,
               annotations: dict | None = None) -> None:
    """TileLang's older name of T.im2col (same arguments).

    >>> T.c2d_im2col(data, data_shared, by, k_iter, KH, S, D, P)
    """
    im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad, eviction_policy,
           annotations)
