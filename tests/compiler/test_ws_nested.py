"""A T.Pipelined loop inside the kernel's own walk over its work (serial loops, `if`s and
uniform scalars around it: stream-K's runs, a hand-written persistent loop) is fed by the
TMA producer like a top-level one: the producer runs that skeleton of the program around
its copies (passes/pipeline.py, targets/cuda/ws_loop.py). Plans and generated code only:
numerics on the cpu target here and on the H200 through benchmarks/gpu/conformance.py."""

import re

import numpy as np
import pytest

import tiled
import tiled.lang as T
from tiled.compiler.passes.pipeline import run_ahead
from tiled.compiler.targets.cuda.backend import CudaBackend
from tiled.ir.program import as_program

K_STEPS = 8


def _walk(scalar_from="blocks", bound_in_loop=False, store_in_nest=False, units=4):
    """Each unit walks tiles pid, pid + units, ... of a 512 x 256 GEMM: a scalar `tile`
    set per step from `scalar_from` ("blocks": the block index and the loop variable,
    "table": a global table the kernel never writes, "written_table": one it writes, which
    another thread cannot know early)."""
    m, n, k = 512, 256, 64 * K_STEPS

    @tiled.kernel
    def walk(A: T.Tensor((m, k), "float16"), B: T.Tensor((k, n), "float16"),
             Table: T.Tensor((64,), "int32"), C: T.Tensor((m, n), "float32")):
        with T.Kernel(units, threads=256) as pid:
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            tile = T.alloc_var("int32")
            steps = T.alloc_var("int32")
            steps = K_STEPS
            for s in T.serial(T.ceildiv(8, units)):
                if scalar_from in ("table", "written_table"):
                    tile = Table[s * units + pid]
                else:
                    tile = s * units + pid
                if store_in_nest:
                    for i in T.Parallel(1):
                        steps = K_STEPS - i
                if tile < 8:
                    T.clear(acc)
                    for kk in T.Pipelined(steps, num_stages=3):
                        T.copy(A[tile // 2 * 128, kk * 64], A_s)
                        T.copy(B[kk * 64, tile % 2 * 128], B_s)
                        T.gemm(A_s, B_s, acc)
                        if bound_in_loop:
                            steps = K_STEPS
                    T.copy(acc, C[tile // 2 * 128, tile % 2 * 128])
            if scalar_from == "written_table":
                Table[pid] = 0

    return walk


def _var_ids(p, *names):
    return {b.id for b in p.buffers if b.name in names}


def test_a_loop_inside_the_kernels_walk_runs_ahead():
    p = as_program(_walk()).proto
    ra = run_ahead(p)
    assert ra is not None and ra.nested and ra.copies == (0, 1)
    assert ra.scalars == _var_ids(p, "tile", "steps")
    # a scalar loaded from a table the kernel never writes: the producer loads it too
    p = as_program(_walk(scalar_from="table")).proto
    assert run_ahead(p).scalars == _var_ids(p, "tile", "steps")


@pytest.mark.parametrize("variant", [dict(scalar_from="written_table"),
                                     dict(bound_in_loop=True), dict(store_in_nest=True)])
def test_a_scalar_threads_may_disagree_on_keeps_the_loop_to_the_consumers(variant):
    """A scalar loaded from a tensor the kernel writes, stored inside the pipelined loop or
    inside a T.Parallel nest is not one the producer can keep: the copies that use it do not
    run ahead."""
    p = as_program(_walk(**variant)).proto
    ra = run_ahead(p)
    assert ra is None or not ra.nested
    src = CudaBackend().generate_source(as_program(_walk(**variant)), "sm_90a")[0]
    assert "tma_load" not in src and "cp_async" in src


def test_the_producer_runs_the_skeleton_and_the_ring_runs_on():
    src, _pool, low = CudaBackend().generate_source(as_program(_walk()), "sm_90a")
    w = low.wsloop
    assert w.run.nested and w.reused and not w.persistent
    producer = src[src.index("setmaxnreg_dec"):] if "setmaxnreg_dec" in src else \
        src[src.rindex("} else {"):]
    # The producer's thread keeps the walk: the scalar stores, the `if`, then its copies.
    assert producer.index("tile_ptr[0] =") < producer.index("if (tile_ptr[0] < 8)") < \
        producer.index("tiled::sm90::tma_load(")
    assert "tiled::sm90::tma_load(" not in src[:src.index("setmaxnreg_dec")]
    # Both sides count the ring's steps across the loop's runs (stages and phases go on),
    # and the consumers free the stages their last gemm held: the producer fills them next.
    assert len(re.findall(r"(_ptr_\d+)\[0\] = \(max\(steps_ptr\[0\], 0\) \+ \1\[0\]\)",
                          src)) == 2
    consumer = src[:src.index("setmaxnreg_dec")]
    assert consumer.count("ring_release") > 2


def test_nested_walk_numerics_on_cpu():
    fn = tiled.compile(_walk(units=3), "cpu")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype(np.float16)
    b = rng.standard_normal((512, 256)).astype(np.float16)
    c = np.zeros((512, 256), np.float32)
    fn(a, b, np.zeros(64, np.int32), c)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-3)


def test_the_stream_k_kernel_runs_wgmma_on_the_tma_ring(tmp_path):
    """The conformance stream-K (TileLang's split: stream-K runs, then data-parallel waves) at
    its H200 shapes: TMA loads, wgmma, mbarriers, the producer's register handoff, and the
    accumulator in registers (SASS read with cuobjdump; no GPU needed)."""
    from tests.compiler.test_sm90_path import sass
    from tests.conformance.cases import load_all

    case = load_all()["gemm_streamk"]
    c = tiled.compile(case.factory(**case.gpu).kernel, target="cuda:sm_90a", cache=False)
    text = sass(c.artifact, tmp_path, c.manifest.symbol)
    for instr in ("HGMMA.64x256x16", "UTMALDG", "SYNCS", "USETMAXREG", "REDG.E.ADD.F32"):
        assert instr in text, instr
    assert not re.search(r"\b(LDL|STL)\b", text)
