"""An accumulator's initialization folded into its wgmma gemm in the software-pipelined
attention loop (targets/cuda/acc_init.py): a clear or a 0 / -inf mask before `S = Q K^T`
becomes the gemm's zero scale-d, and a mask is added after the gemm only where a tile needs
it. Generated code only (numerics: the H200 runs of benchmarks/gpu/conformance.py and
tl_attention.py)."""

import tiled
import tiled.lang as T
from tests.compiler.test_ws_loop import _loop_text, _lower

NEG_INF = float("-inf")
S, D, BM = 512, 64, 64


def _attention(mask):
    """Two gemms on a TMA ring, S initialized by `mask(i, j, bx, step)` before the first."""
    @tiled.kernel
    def attn(Q: T.Tensor((S, D), "float16"), K: T.Tensor((S, D), "float16"),
             V: T.Tensor((S, D), "float16"), Out: T.Tensor((S, D), "float16")):
        with T.Kernel(S // BM, threads=128) as bx:
            q = T.alloc_shared((BM, D), "float16")
            kt = T.alloc_shared((BM, D), "float16")
            vt = T.alloc_shared((BM, D), "float16")
            s = T.alloc_fragment((BM, BM), "float32")
            p = T.alloc_fragment((BM, BM), "float16")
            o = T.alloc_fragment((BM, D), "float32")
            T.copy(Q[bx * BM, 0], q)
            T.fill(o, 0)
            for step in T.Pipelined(S // BM, num_stages=2):
                T.copy(K[step * BM, 0], kt)
                for i, j in T.Parallel(BM, BM):
                    s[i, j] = mask(i, j, bx, step)
                T.gemm(q, kt, s, transpose_B=True)
                T.copy(s, p)
                T.copy(V[step * BM, 0], vt)
                T.gemm(p, vt, o)
            T.copy(o, Out[bx * BM, 0])

    return attn


def _stores_to_s_before_issue(loop: str) -> bool:
    return "s_ptr[0] = " in loop[:loop.index("wgmma_rows_issue<")]


def test_a_zero_init_becomes_the_gemms_zero_scale():
    src, _, _ = _lower(_attention(lambda i, j, bx, step: 0.0))
    loop = _loop_text(src)
    assert "wgmma_rows_issue<half, 64, 64, 64, 64, true, false, true>" in loop
    assert not _stores_to_s_before_issue(loop) and "s_ptr[0] = (s_ptr[0] +" not in loop


def test_a_causal_mask_is_added_after_the_gemm_where_its_tile_needs_it():
    src, _, _ = _lower(_attention(
        lambda i, j, bx, step: T.if_then_else(bx * BM + i >= step * BM + j, 0, NEG_INF)))
    loop = _loop_text(src)
    issue = loop.index("wgmma_rows_issue<half, 64, 64, 64, 64, true, false, true>")
    waited = loop.index("retire<1>", issue)
    guard = loop.index("if (", waited)  # the tile test: the block's diagonal tile only
    assert waited < guard < loop.index("s_ptr[0] = (s_ptr[0] +", guard)
    assert not _stores_to_s_before_issue(loop)


def test_a_mask_it_cannot_test_per_tile_is_added_everywhere():
    """(i * j) is not affine in the nest's indices: no corner test, the mask always added."""
    src, _, _ = _lower(_attention(
        lambda i, j, bx, step: T.if_then_else(i * j < step * 7, 0, NEG_INF)))
    loop = _loop_text(src)
    waited = loop.index("retire<1>")
    add = loop.index("s_ptr[0] = (s_ptr[0] +", waited)
    assert "if (" not in loop[waited:add]


def test_an_init_that_is_not_exact_under_addition_stays_as_written():
    """0.5 + x is not x + 0.5 in every rounding: the nest runs before the gemm, as written."""
    src, _, _ = _lower(_attention(
        lambda i, j, bx, step: T.if_then_else(bx * BM + i >= step * BM + j, 0.5, NEG_INF)))
    loop = _loop_text(src)
    assert _stores_to_s_before_issue(loop)
    assert "wgmma_rows_issue<half, 64, 64, 64, 64, true>" in loop
