"""The cpu lowering's folded copies (tiled.compiler.targets.cpu.forward): which copies between
a global tensor and a whole tile it folds, and that folding keeps the results: each kernel
runs compiled with and without the folds on ragged shapes (rows past the tensor read as zero,
are not written); bfloat16 outputs agree bit for bit, float32 ones within 2e-6 relative (a
value computed in another loop may be contracted into FMAs differently: softmax's differ by
up to 10 ulp, its exp being within 2 ulp either way)."""

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled import config
from tiled.compiler.targets.cpu import forward
from tiled.ops import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")


def in_place(N, rows=4):
    """The source is also the destination: the copy in must stay."""
    M = T.dyn("M")

    @tiled.kernel
    def scale_in_place(X: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            T.copy(X[bx * rows, 0], x)
            for i, j in T.Parallel(rows, N):
                x[i, j] = x[i, j] * 2.0
            T.copy(x, X[bx * rows, 0])
    return scale_in_place


def mirrored(N, rows=4):
    """The whole-tile loop reads another element of the tile than it writes (not a fold),
    and the tile is read after its copy out (nor is that)."""
    M = T.dyn("M")

    @tiled.kernel
    def mirror(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32"),
               Z: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            y = T.alloc_fragment((rows, N), "float32")
            T.copy(X[bx * rows, 0], x)
            for i, j in T.Parallel(rows, N):
                x[i, j] = x[i, N - 1 - j] + 1.0
            for i, j in T.Parallel(rows, N):
                y[i, j] = x[i, j] * 3.0
            T.copy(y, Y[bx * rows, 0])
            T.copy(y, Z[bx * rows, 0])
    return mirror


def touches_destination(N, rows=4):
    """The whole-tile loop before the copy out also stores into the copy's destination."""
    M = T.dyn("M")

    @tiled.kernel
    def touch(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            for i, j in T.Parallel(rows, N):
                x[i, j] = X[bx * rows + i, j] + 1.0
                Y[bx * rows + i, N - 1 - j] = 0.0
            T.copy(x, Y[bx * rows, 0])
    return touch


def plan_of(kernel):
    p = kernel.ir.proto
    return forward.plan(p), [s.WhichOneof("kind") for s in forward.top_level(p.kernel.body)]


def test_rms_norm_stages_no_tile():
    plan, kinds = plan_of(kernels.rms_norm(64, "bfloat16", 1e-6, blk_m=4))
    copies = {i for i, k in enumerate(kinds) if k == "copy"}
    squares = {i for i, k in enumerate(kinds) if k == "for_" and kinds[i + 1] == "reduce"}
    assert plan.skip == copies | squares and len(copies) == 2 and len(squares) == 1
    assert len(plan.copy_in) == 1 and len(plan.copy_out) == 1
    assert list(plan.into_reduce) == list(squares)


def test_unsafe_copies_stay():
    plan, _ = plan_of(in_place(64))
    assert not plan.copy_in and plan.copy_out  # X is written: read it through x no more
    plan, _ = plan_of(mirrored(64))
    assert not plan.copy_in  # x[i, N-1-j] is read after x[i, j'] was written
    assert not plan.copy_out  # y is copied out twice
    assert not plan.into_reduce and not plan.skip
    plan, _ = plan_of(touches_destination(64))
    assert not plan.copy_out and not plan.skip  # a later iteration would overwrite Y


def run(kernel, args, folded: bool, monkeypatch, tmp_path):
    with monkeypatch.context() as m:
        if not folded:
            m.setattr(forward, "plan", lambda _p: forward.Plan())
        with config.override(cache_dir=tmp_path / str(folded)):
            k = tiled.compile(kernel, "cpu")
    out = [a.copy() for a in args]
    k(*out)
    return out


CASES = {
    "rms_norm_bf16": lambda: kernels.rms_norm(96, "bfloat16", 1e-6, blk_m=4),
    "softmax_f32": lambda: kernels.softmax(80, "float32", blk_m=4),
    "fused_add_rms_norm_bf16": lambda: kernels.fused_add_rms_norm(64, "bfloat16", 1e-6,
                                                                  blk_m=4),
    "in_place": lambda: in_place(48),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_folding_keeps_results(name, monkeypatch, tmp_path):
    kernel = CASES[name]()
    rng = np.random.default_rng(3)
    M = 13  # 3 blocks of 4 and a tail of 1
    args = []
    for prm in kernel.ir.proto.params:
        buf = next(b for b in kernel.ir.proto.buffers if b.id == prm.buffer)
        shape = [d.size if d.WhichOneof("kind") == "size" else M for d in buf.shape]
        dt = ml_dtypes.bfloat16 if "bf16" in name else np.float32
        args.append((rng.standard_normal(shape) * 2).astype(dt))
    want = run(kernel, args, False, monkeypatch, tmp_path)
    got = run(kernel, args, True, monkeypatch, tmp_path)
    for w, g in zip(want, got, strict=True):
        if w.dtype == np.float32:  # LLVM may contract a * b + c into an FMA in one loop
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=0)  # and not in the other
        else:
            assert np.array_equal(w.view(np.uint8), g.view(np.uint8))
