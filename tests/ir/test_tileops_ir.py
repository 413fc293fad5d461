"""The TileLang tile ops tiled adds on its Tile IR (issue 11): T.reduce_absmax, T.cumsum (Scan),
T.atomic_max / atomic_min, T.vectorized, T.gemm(policy=, k_pack=), T.copy with a cast, layout
and rasterization hints, T.max_value / min_value / infinity. What each traces to, how it
prints, the verifier's located refusals of misuse, and the DSL's located errors."""

from __future__ import annotations

import inspect
import math

import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError, VerifyError
from tiled.ir import Program, verify_program
from tiled.ir.canonical import canonicalize, program_digest
from tiled.ir.printer import format_program
from tiled.v1 import tile_ir_pb2 as pb

from .programs import node


def stmts(program) -> list[pb.Stmt]:
    """Every statement of the kernel body, in order (loops and ifs opened)."""
    out, stack = [], [program.proto.kernel.body]
    while stack:
        s = stack.pop()
        kind = s.WhichOneof("kind")
        out.append(s)
        if kind == "seq":
            stack += reversed(s.seq.stmts)
        elif kind == "for_":
            stack.append(s.for_.body)
        elif kind == "if_then_else":
            stack.append(s.if_then_else.then_body)
    return out


def first(program, kind: str):
    return next(getattr(s, kind) for s in stmts(program) if s.WhichOneof("kind") == kind)


def path_of(program, kind: str) -> str:
    """The verifier's path of the first statement of `kind`."""
    def walk(s: pb.Stmt, path: str):
        k = s.WhichOneof("kind")
        if k == kind:
            return f"{path}.{k}"
        subs = {"seq": [(f".seq.stmts[{i}]", x) for i, x in enumerate(s.seq.stmts)],
                "for_": [(".for_.body", s.for_.body)],
                "if_then_else": [(".if_then_else.then_body", s.if_then_else.then_body)]}
        for suffix, sub in subs.get(k, []):
            found = walk(sub, path + suffix)
            if found:
                return found
        return None
    return walk(program.proto.kernel.body, "kernel.body")


def reject(p: pb.Program, message: str, path: str | None = None) -> VerifyError:
    with pytest.raises(VerifyError, match=message) as info:
        verify_program(Program(p))
    if path is not None:
        assert info.value.path == path, info.value
    node(p, info.value.path)  # the path names a real field
    assert info.value.loc, "a refusal names the author's line"
    return info.value


def edited(program, edit) -> pb.Program:
    p = pb.Program()
    p.CopyFrom(program.proto)
    edit(p)
    return p


def definition_error(fn, match: str) -> KernelDefinitionError:
    """Traces `fn` (a @tiled.kernel) and expects a KernelDefinitionError at the line holding
    the `# error here` marker."""
    with pytest.raises(KernelDefinitionError, match=match) as info:
        _ = fn.ir
    lines, first_line = inspect.getsourcelines(fn.fn)
    want = first_line + next(i for i, ln in enumerate(lines) if "# error here" in ln)
    assert info.value.line == want, (info.value.line, want, str(info.value))
    return info.value


# -- T.reduce_absmax -----------------------------------------------------------------------------

@tiled.kernel
def absmax_kernel(X: T.Tensor((64, 48), "float16"), Y: T.Tensor((64,), "float32")):
    with T.Kernel(4, threads=128) as bx:
        x_frag = T.alloc_fragment((16, 48), "float16")
        amax = T.alloc_fragment((16,), "float32")
        T.copy(X[bx * 16, 0], x_frag)
        T.reduce_absmax(x_frag, amax, dim=1)
        T.copy(amax, Y[bx * 16])


def test_reduce_absmax_traces_prints_and_verifies():
    r = first(absmax_kernel.ir, "reduce")
    assert (r.kind, r.dim, r.clear) == (pb.REDUCE_ABSMAX, 1, True)
    assert "reduce_absmax(x_frag, amax, dim=1, clear=True)" in format_program(absmax_kernel.ir)


def test_reduce_absmax_rules_are_the_reductions():
    ir = absmax_kernel.ir
    path = path_of(ir, "reduce")
    bool_buf = edited(ir, lambda p: setattr(p.buffers[3], "dtype", pb.BOOL))  # amax
    reject(bool_buf, "is bool", path + ".dst")
    reject(edited(ir, lambda p: setattr(node(p, path), "kind", 9)), "unknown kind 9",
           path + ".kind")


# -- T.cumsum -------------------------------------------------------------------------------------

@tiled.kernel
def cumsum_kernel(X: T.Tensor((32, 16), "float32"), Y: T.Tensor((32, 16), "float32")):
    with T.Kernel(2, threads=128) as bx:
        a = T.alloc_shared((16, 16), "float32")
        b = T.alloc_fragment((16, 16), "float32")
        h = T.alloc_fragment((16, 16), "float16")
        T.copy(X[bx * 16, 0], a)
        T.cumsum(a, dim=1)
        T.cumsum(a, b, dim=0, reverse=True)
        T.copy(b, h)
        T.copy(b, Y[bx * 16, 0])


def test_cumsum_traces_in_place_and_into_dst():
    scans = [s.scan for s in stmts(cumsum_kernel.ir) if s.WhichOneof("kind") == "scan"]
    a, b = (buf.id for buf in cumsum_kernel.ir.proto.buffers if buf.name in ("a", "b"))
    assert [(s.src, s.dst, s.dim, s.reverse) for s in scans] == [(a, a, 1, False),
                                                                  (a, b, 0, True)]
    text = format_program(cumsum_kernel.ir)
    assert "cumsum(a, dim=1)" in text and "cumsum(a, b, dim=0, reverse=True)" in text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("src", 0, "cumsum source X is global; it must be SHARED or FRAGMENT"),
    ("dst", 1, "cumsum destination Y is global"),
    ("dst", 4, "cumsum of float32 a into float16 h: both must have one dtype"),
    ("dim", 2, "cumsum dim 2 is out of range for a of rank 2"),
    ("dim", -1, "cumsum dim -1 is out of range"),
    ("src", 77, "unknown buffer id 77"),
])
def test_cumsum_misuse_is_refused_where_it_is(field, value, message):
    ir = cumsum_kernel.ir
    path = path_of(ir, "scan")
    reject(edited(ir, lambda p: setattr(node(p, path), field, value)), message,
           f"{path}.{field}")


def test_cumsum_refuses_bool_other_shapes_and_parallel_loops():
    ir = cumsum_kernel.ir
    path = path_of(ir, "scan")

    def bool_a(p):
        p.buffers[2].dtype = pb.BOOL
    reject(edited(ir, bool_a), "cumsum source a is bool", path + ".src")

    def other_shape(p):
        p.buffers[3].shape[0].size = 8
    err = reject(edited(ir, other_shape), r"into b \(8x16\): both must have one shape")
    assert err.path.endswith(".scan.dst")  # the second cumsum's

    def in_parallel(p):
        s = node(p, path.removesuffix(".scan"))
        inner = pb.Stmt()
        inner.CopyFrom(s)
        v = max(x.id for x in p.vars) + 1
        p.vars.add(id=v, name="i", dtype=pb.INT32)
        s.ClearField("scan")
        s.for_.var, s.for_.kind = v, pb.PARALLEL
        s.for_.extent.CopyFrom(pb.Expr(dtype=pb.INT32, int_value=4))
        s.for_.body.CopyFrom(inner)
    reject(edited(ir, in_parallel), "cumsum is a tile op run by the whole block")


def test_cumsum_dsl_errors_are_located():
    @tiled.kernel
    def on_slice(X: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((16, 16), "float32")
            T.cumsum(a[0:8, :], dim=0)  # error here
    definition_error(on_slice, "TileLang feature T.cumsum of a slice is not supported by tiled")

    @tiled.kernel
    def bad_dim(X: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_fragment((16, 16), "float32")
            T.cumsum(a, dim=2)  # error here
    definition_error(bad_dim, "dim 2 is out of range for a, which has 2 dims")

    @tiled.kernel
    def global_src(X: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            T.cumsum(X, dim=0)  # error here
    definition_error(global_src, "src X must be a shared or fragment tile")

    @tiled.kernel
    def other_shape(X: T.Tensor((16, 16), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_fragment((16, 16), "float32")
            b = T.alloc_fragment((16, 8), "float32")
            T.cumsum(a, b, dim=1)  # error here
    definition_error(other_shape, r"dst b\(16, 8\) must have the shape of src a\(16, 16\)")


def test_scan_buffers_are_renumbered_by_the_canonical_form():
    # b is declared before a but used after it: canonical ids follow first use, and the
    # Scan's ids must follow them (else the digest would name the wrong tile).
    @tiled.kernel
    def k(X: T.Tensor((16,), "float32"), Y: T.Tensor((16,), "int32")):
        with T.Kernel(1, threads=128):
            b = T.alloc_shared((16,), "int32")
            a = T.alloc_shared((16,), "float32")
            T.copy(X[0], a)
            T.cumsum(a, dim=0)
            T.copy(a, b)
            T.cumsum(b, dim=0)
            T.copy(b, Y[0])
    canon = canonicalize(k.ir)
    verify_program(canon)
    bufs = {b.id: b for b in canon.proto.buffers}
    scans = [s.scan for s in stmts(canon) if s.WhichOneof("kind") == "scan"]
    assert [bufs[s.src].dtype for s in scans] == [pb.FLOAT32, pb.INT32]


# -- T.atomic_max / T.atomic_min ----------------------------------------------------------------

@tiled.kernel
def atomics_kernel(X: T.Tensor((256,), "float32"), Hi: T.Tensor((1,), "float32"),
                   Lo: T.Tensor((4,), "int32")):
    with T.Kernel(2, threads=128) as bx:
        s = T.alloc_shared((1,), "float32")
        s[0] = -T.infinity("float32")
        for i in T.Parallel(128):
            T.atomic_max(s[0], X[bx * 128 + i])
            T.atomic_min(Lo[i % 4], T.cast(X[bx * 128 + i], "int32"), memory_order="relaxed")
        T.atomic_add(Hi[0], s[0])


def test_atomic_ops_trace_and_print():
    ops_ = [s.atomic_add.op for s in stmts(atomics_kernel.ir)
            if s.WhichOneof("kind") == "atomic_add"]
    assert ops_ == [pb.ATOMIC_MAX, pb.ATOMIC_MIN, pb.ATOMIC_ADD]
    text = format_program(atomics_kernel.ir)
    assert "atomic_max(s[0], X[bx * 128 + " in text
    assert "atomic_min(Lo[" in text and "atomic_add(Hi[0], s[0])" in text


def test_atomic_misuse_is_refused_where_it_is():
    ir = atomics_kernel.ir
    path = path_of(ir, "atomic_add")
    reject(edited(ir, lambda p: setattr(node(p, path), "op", 7)), "atomic has unknown op 7",
           path + ".op")

    def into_fragment(p):
        p.buffers[3].scope = pb.FRAGMENT  # s
    reject(edited(ir, into_fragment), "atomic_max into fragment buffer s; atomics work on "
           "GLOBAL or SHARED", path + ".buffer")

    def into_bool(p):
        flags = p.buffers.add(id=max(b.id for b in p.buffers) + 1, name="flags", dtype=pb.BOOL,
                              scope=pb.SHARED)
        flags.shape.add(size=1)
        node(p, path).buffer = flags.id
        node(p, path).value.CopyFrom(pb.Expr(dtype=pb.BOOL, int_value=1))
    reject(edited(ir, into_bool), "atomic_max into bool buffer flags", path + ".buffer")


@pytest.mark.parametrize(("call", "match"), [
    ("T.atomic_max(s[0], 1.0, memory_order='consume')", "memory_order must be one of"),
    ("T.atomic_min(s[0], 1.0, return_prev=2)", "return_prev"),
    ("T.atomic_max(s, 1.0)", "T.atomic_max on a whole tile is not supported by tiled"),
    ("T.atomic_add(s[0:1], 1.0)", "T.atomic_add on a whole tile"),
    ("T.atomic_min(1.0, 2.0)", "the destination must be an element"),
])
def test_atomic_dsl_errors(call, match):
    def body(X: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=128):
            s = T.alloc_shared((4,), "float32")  # noqa: F841 (used by `call`)
            eval(call)
    with pytest.raises(KernelDefinitionError, match=match):
        _ = tiled.kernel(body).ir


# -- T.vectorized, T.Parallel(coalesced_width=) -------------------------------------------------

@tiled.kernel
def vector_kernel(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
    with T.Kernel(1, threads=128):
        for i in T.Parallel(8, coalesced_width=8):
            for v in T.vectorized(8):
                Y[i * 8 + v] = X[i * 8 + v] * 2.0
        for v in T.vectorized(2, 6):
            Y[v] = 0.0


def test_vectorized_loops_trace_and_print():
    loops = [s.for_ for s in stmts(vector_kernel.ir) if s.WhichOneof("kind") == "for_"]
    assert [f.kind for f in loops] == [pb.PARALLEL, pb.VECTORIZED, pb.VECTORIZED]
    assert loops[2].extent.int_value == 4  # T.vectorized(2, 6): 4 iterations from 2
    text = format_program(vector_kernel.ir)
    assert "in vectorized(8):" in text and "in vectorized(4):" in text


def test_coalesced_width_is_a_hint_that_leaves_the_ir_alone():
    @tiled.kernel
    def vector_kernel(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(8):
                for v in T.vectorized(8):
                    Y[i * 8 + v] = X[i * 8 + v] * 2.0
            for v in T.vectorized(2, 6):
                Y[v] = 0.0
    assert program_digest(vector_kernel.ir) == program_digest(globals()["vector_kernel"].ir)

    @tiled.kernel
    def bad(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(8, coalesced_width=0):  # error here
                X[i] = 0.0
    definition_error(bad, "coalesced_width must be a positive int, got 0")


def test_vectorized_bodies_hold_element_statements_only():
    @tiled.kernel
    def tile_op_inside(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((64,), "float32")
            for _v in T.vectorized(4):
                T.fill(a, 0.0)  # error here
    definition_error(tile_op_inside, "fill inside T.vectorized loop .*: a vectorized loop "
                                     "holds element statements only")

    @tiled.kernel
    def parallel_inside(X: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128):
            for v in T.vectorized(4):
                for i in T.Parallel(16):  # error here
                    X[v * 16 + i] = 0.0
    definition_error(parallel_inside, "Parallel loop over .* inside T.vectorized loop")

    # Serial loops, ifs and atomics are element statements: accepted.
    @tiled.kernel
    def fine(X: T.Tensor((64,), "float32"), S: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=128):
            for v in T.vectorized(4):
                for k in T.serial(16):
                    if X[v * 16 + k] > 0:
                        T.atomic_add(S[0], X[v * 16 + k])
    verify_program(fine.ir)


# -- T.gemm(policy=, k_pack=, clear_accum=) --------------------------------------------------------

def gemm_kernel(**kwargs):
    @tiled.kernel
    def k(A: T.Tensor((64, 32), "float16"), B: T.Tensor((32, 64), "float16"),
          C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_fragment((64, 32), "float16")
            b = T.alloc_shared((32, 64), "float16")
            c = T.alloc_fragment((64, 64), "float32")
            T.copy(A[0, 0], a)
            T.copy(B[0, 0], b)
            T.gemm(a, b, c, **kwargs)
            T.copy(c, C[0, 0])
    return k


@pytest.mark.parametrize(("policy", "wire", "text"), [
    (T.GemmWarpPolicy.Square, pb.POLICY_SQUARE, "gemm(a, b, c, clear_accum=True)"),
    (T.GemmWarpPolicy.FullRow, pb.POLICY_FULL_ROW,
     "gemm(a, b, c, clear_accum=True, policy=FullRow)"),
    (T.GemmWarpPolicy.FullCol, pb.POLICY_FULL_COL,
     "gemm(a, b, c, clear_accum=True, policy=FullCol)"),
])
def test_gemm_policy_is_written_and_printed(policy, wire, text):
    ir = gemm_kernel(policy=policy, clear_accum=True, k_pack=2).ir
    g = first(ir, "gemm")
    assert (g.policy, g.clear_accum) == (wire, True)
    assert text in format_program(ir)


def test_gemm_takes_tilelang_positional_order():
    # TileLang: gemm(A, B, C, transpose_A, transpose_B, policy, clear_accum, k_pack)
    @tiled.kernel
    def k(A: T.Tensor((32, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((32, 64), "float16")
            c = T.alloc_fragment((64, 64), "float32")
            T.copy(A[0, 0], a)
            T.gemm(a, a, c, True, False, T.GemmWarpPolicy.FullCol, True, 1)
            T.copy(c, C[0, 0])
    g = first(k.ir, "gemm")
    assert (g.transpose_a, g.transpose_b, g.policy, g.clear_accum) == \
        (True, False, pb.POLICY_FULL_COL, True)


def test_traced_clear_accum_clears_c_where_it_holds():
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float16"), C: T.Tensor((32, 32), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((32, 32), "float16")
            c = T.alloc_fragment((32, 32), "float32")
            for ko in T.serial(2):
                T.copy(A[0, ko * 32], a)
                T.gemm(a, a, c, clear_accum=ko == 0)
            T.copy(c, C[0, 0])
    text = format_program(k.ir)
    assert "if ko == 0:\n        clear(c)\n      gemm(a, a, c)" in text, text
    assert first(k.ir, "gemm").clear_accum is False


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"policy": "FullRow"}, "policy must be T.GemmWarpPolicy.Square, FullRow or FullCol"),
    ({"policy": 5}, "policy must be"),
    ({"k_pack": 0}, "k_pack must be a positive int, got 0"),
    ({"clear_accum": 1}, "clear_accum must be True or False"),
    ({"mbar": object()}, r"TileLang feature T.gemm\(mbar=...\) is not supported by tiled"),
])
def test_gemm_argument_errors(kwargs, match):
    with pytest.raises(KernelDefinitionError, match=match):
        _ = gemm_kernel(**kwargs).ir


def test_gemm_unknown_policy_is_refused():
    ir = gemm_kernel().ir
    path = path_of(ir, "gemm")
    reject(edited(ir, lambda p: setattr(node(p, path), "policy", 9)), "unknown warp policy 9",
           path + ".policy")


# -- T.copy with a cast ----------------------------------------------------------------------------

def test_copies_between_fragments_and_shared_cast_and_verify():
    # fragment -> fragment (same dtype and cast), shared <-> fragment with a cast, 1-d tiles.
    @tiled.kernel
    def k(X: T.Tensor((16, 16), "float32"), Y: T.Tensor((16, 16), "float16")):
        with T.Kernel(1, threads=128):
            acc_s = T.alloc_fragment((16, 16), "float32")
            acc_s_cast = T.alloc_fragment((16, 16), "float16")
            scores_max = T.alloc_fragment((16,), "float32")
            scores_max_prev = T.alloc_fragment((16,), "float32")
            sh = T.alloc_shared((16, 16), "bfloat16")
            T.copy(X[0, 0], acc_s)
            T.reduce_max(acc_s, scores_max, dim=1)
            T.copy(scores_max, scores_max_prev)
            T.copy(acc_s, acc_s_cast)
            T.copy(acc_s_cast, sh)
            T.copy(sh, acc_s)
            T.copy(acc_s, Y[0, 0])
    text = format_program(k.ir)
    for line in ("copy(scores_max, scores_max_prev)", "copy(acc_s, acc_s_cast)",
                 "copy(acc_s_cast, sh)", "copy(sh, acc_s)"):
        assert line in text


# -- layout and rasterization hints --------------------------------------------------------------

def hinted(hints: bool):
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float16"), dQ: T.Tensor((64, 64), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            if hints:
                T.use_swizzle(panel_size=10)
                T.use_swizzle(4, order="column", enable=False)
            a_s = T.alloc_shared((32, 32), "float16")
            acc = T.alloc_fragment((32, 32), "float32")
            if hints:
                T.annotate_layout({
                    a_s: T.make_swizzled_layout(a_s),
                    acc: T.Fragment((32, 32), forward_thread_fn=lambda i, j: i * 4 + j // 8,
                                    forward_index_fn=lambda i, j: j % 8),
                    dQ: T.Layout(dQ.shape, lambda i, j: [i // 8, j, i % 8]),
                })
                T.annotate_layout({a_s: lambda i, j: [i, j ^ (i % 8)]})
                T.annotate_layout({acc: T.Fragment((32, 32), lambda i, j, rep: (i + rep, j),
                                                   replicate=2)})
            T.copy(A[by * 32, bx * 32], a_s)
            T.copy(a_s, acc)
            T.copy(acc, dQ[by * 32, bx * 32])
    return k


def test_layout_hints_are_checked_and_leave_the_program_unchanged():
    assert program_digest(hinted(True).ir) == program_digest(hinted(False).ir)


@pytest.mark.parametrize(("line", "match"), [
    ("T.annotate_layout({acc: T.Layout((32, 32), lambda i, j: [i, j])})",
     "acc is a fragment; its layout must be a T.Fragment"),
    ("T.annotate_layout({a_s: T.Fragment((32, 32), forward_thread_fn=lambda i, j: i)})",
     "a_s is not a fragment; a T.Fragment spreads a fragment over threads, use T.Layout"),
    ("T.annotate_layout({a_s: T.Layout((32, 16), lambda i, j: [i, j])})",
     r"the layout of a_s has shape \(32, 16\), but a_s is \(32, 32\)"),
    ("T.annotate_layout({a_s: T.Layout((32, 32), lambda i: [i])})",
     r"forward_fn takes 1 index argument\(s\), but the layout has 2"),
    ("T.annotate_layout({a_s: T.make_swizzled_layout(b_s)})",
     "the layout of a_s was made for b_s"),
    ("T.annotate_layout({a_s: 3})", "must be a T.Layout, a T.Fragment or a function, got 3"),
    ("T.annotate_layout([a_s])", r"takes a dict \{buffer: layout\}, got list"),
    ("T.annotate_layout({a_s[0, 0]: T.make_swizzled_layout(a_s)})",
     "keys must be whole buffers"),
    ("T.make_swizzled_layout(acc)", "T.make_swizzled_layout takes a shared tile"),
    ("T.make_swizzled_layout(a_s, k_major=1)", "k_major must be True or False"),
    ("T.Fragment((32, 32))", "T.Fragment needs forward_fn, or forward_thread_fn"),
    ("T.Fragment((32, 32), lambda i, j: (i, j), forward_thread_fn=lambda i, j: i)",
     "not both"),
    ("T.Fragment((32, 32), lambda i, j: (i, j), replicate=2)",
     r"takes 2 index argument\(s\), but the layout has 3"),
    ("T.Fragment((32, 0), lambda i, j: (i, j))", "dims must be positive ints"),
    ("T.use_swizzle(0)", "panel_size must be a positive int, got 0"),
    ("T.use_swizzle(8, order='diagonal')", "order must be one of row, column, mlx"),
    ("T.use_swizzle(8, enable='yes')", "enable must be True or False"),
])
def test_layout_hint_errors(line, match):
    def body(A: T.Tensor((32, 32), "float16")):
        with T.Kernel(1, threads=128):
            a_s = T.alloc_shared((32, 32), "float16")  # noqa: F841 (used by `line`)
            b_s = T.alloc_shared((32, 32), "float16")  # noqa: F841
            acc = T.alloc_fragment((32, 32), "float32")  # noqa: F841
            eval(line)
    with pytest.raises(KernelDefinitionError, match=match):
        _ = tiled.kernel(body).ir


def test_hints_outside_the_kernel_are_located_errors():
    @tiled.kernel
    def k(A: T.Tensor((32,), "float16")):
        T.use_swizzle(8)  # error here
        with T.Kernel(1, threads=128):
            A[0] = A[0]
    definition_error(k, r"T.use_swizzle goes inside `with T.Kernel\(...\)`")


# -- T.max_value, T.min_value, T.infinity --------------------------------------------------------

def const_of(make):
    """The constant a DSL expression traces to (filled into a 1-element fragment)."""
    @tiled.kernel
    def k(X: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=128):
            value = make()
            buf = T.alloc_fragment((1,), value.dtype)
            T.fill(buf, value)
    e = first(k.ir, "fill").value
    if e.WhichOneof("kind") == "call":  # -x
        return -e.call.args[0].float_value
    return e.float_value if e.WhichOneof("kind") == "float_value" else e.int_value


@pytest.mark.parametrize(("dtype", "hi", "lo"), [
    ("float16", 65504.0, -65504.0), ("bfloat16", 3.3895313892515355e38, -3.3895313892515355e38),
    ("float32", 3.4028234663852886e38, -3.4028234663852886e38),
    ("float64", 1.7976931348623157e308, -1.7976931348623157e308),
    ("float8_e4m3", 448.0, -448.0), ("float8_e5m2", 57344.0, -57344.0),
    ("int8", 127, -128), ("uint8", 255, 0), ("int32", 2**31 - 1, -(2**31)),
    ("int64", 2**63 - 1, -(2**63)), ("uint32", 2**32 - 1, 0),
])
def test_max_and_min_value(dtype, hi, lo):
    assert const_of(lambda: T.max_value(dtype)) == hi
    assert const_of(lambda: T.min_value(dtype)) == lo


def test_uint64_max_has_no_constant_but_its_min_does():
    assert const_of(lambda: T.min_value("uint64")) == 0
    with pytest.raises(KernelDefinitionError, match="has no Tile IR constant"):
        const_of(lambda: T.max_value("uint64"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "float8_e5m2",
                                   T.float16])
def test_infinity_of_every_float_dtype_with_an_infinity(dtype):
    assert const_of(lambda: T.infinity(dtype)) == math.inf
    assert const_of(lambda: -T.infinity(dtype)) == -math.inf


@pytest.mark.parametrize(("make", "match"), [
    (lambda: T.infinity("int32"), "T.infinity needs a float dtype, got int32"),
    (lambda: T.infinity("float8_e4m3"), "float8_e4m3 has no infinity"),
    (lambda: T.max_value("bool"), "needs a number dtype, not bool"),
    (lambda: T.min_value("complex64"), "T.min_value: 'complex64' is not a dtype"),
])
def test_dtype_constant_errors(make, match):
    with pytest.raises(KernelDefinitionError, match=match):
        const_of(make)


# -- T.Pipelined's schedule hints ---------------------------------------------------------------

def pipelined(**kwargs):
    @tiled.kernel
    def k(A: T.Tensor((256, 32), "float16"), C: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((32, 32), "float16")
            acc = T.alloc_fragment((32, 32), "float32")
            T.clear(acc)
            for ko in T.Pipelined(8, **kwargs):
                T.copy(A[ko * 32, 0], a)
                T.gemm(a, a, acc)
            row_sum = T.alloc_fragment((32,), "float32")
            T.reduce_sum(acc, row_sum, dim=1)
            T.copy(row_sum, C[0])
    return k


@pytest.mark.parametrize(("kwargs", "kind", "stages"), [
    ({}, pb.PIPELINED, 2),
    ({"num_stages": 3, "order": [0, 1], "stage": [0, 1]}, pb.PIPELINED, 3),
    ({"order": [-1, 0, 1], "stage": [-1, 0, 3], "sync": [[0, 1]], "group": [[0], [1, 2]]},
     pb.PIPELINED, 4),  # depth max(stage) + 1, as TileLang infers it
    ({"num_stages": 0}, pb.SERIAL, 0),  # TileLang: no pipelining
])
def test_pipelined_schedule_hints_are_accepted_and_dropped(kwargs, kind, stages):
    f = first(pipelined(**kwargs).ir, "for_")
    assert (f.kind, f.num_stages) == (kind, stages)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"order": [0, "1"]}, "order must be a list of ints"),
    ({"stage": [0, -2]}, "stage must be a list of ints"),
    ({"order": [0, 1], "stage": [0]}, "order has 2 entries and stage 1"),
    ({"group": [0, 1]}, "group must be a list of lists of ints"),
    ({"num_stages": 9}, r"num_stages must be an int in 0..8, got 9"),
    ({"stage": [0, 8]}, r"num_stages must be an int in 0..8, got 9"),
])
def test_pipelined_hint_errors(kwargs, match):
    with pytest.raises(KernelDefinitionError, match=match):
        _ = pipelined(**kwargs).ir


@T.prim_func
def counted(X: T.Tensor((4, 64), "float32"), P: T.Tensor((4, 64), "float32"),
            Y: T.Tensor((64,), "float32"), C: T.Tensor((1,), "int32")):
    with T.Kernel(4, threads=64) as bx:
        for i in T.Parallel(64):
            P[bx, i] = X[bx, i]
        done = T.atomic_add(C[0], 1, memory_order="acq_rel", return_prev=True)
        if done == 3:
            for i in T.Parallel(64):
                Y[i] = P[0, i] + P[1, i] + P[2, i] + P[3, i]


def test_ordered_atomic_returns_the_previous_value_into_a_local():
    (st,) = [s for s in stmts(counted.ir) if s.WhichOneof("kind") == "atomic_add"]
    a = st.atomic_add
    assert a.order == pb.ORDER_ACQ_REL and a.has_prev
    prev = counted.ir.proto.buffers[a.prev]
    assert prev.scope == pb.LOCAL and prev.dtype == pb.INT32 and prev.name == "done"
    assert "done = atomic_add(C[0], 1, memory_order='acq_rel')" in format_program(counted.ir)
    verify_program(counted.ir)

    def wide_prev(p):
        p.buffers[a.prev].shape.add(size=2)
    reject(edited(counted.ir, wide_prev), "previous value goes to a one-element LOCAL buffer",
           path_of(counted.ir, "atomic_add") + ".prev")
