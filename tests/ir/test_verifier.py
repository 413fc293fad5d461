"""The verifier accepts the samples and rejects each broken rule with a located message."""

from __future__ import annotations

import re

import pytest

from tiled import config
from tiled.errors import VerifyError
from tiled.ir import Limits, Program, verify_program
from tiled.v1 import tile_ir_pb2 as pb

from . import programs as P
from .programs import F16, F32, I32, add, binary, call, const, load, node, var

GEMM_LOOP = "kernel.body.seq.stmts[1].for_"
GEMM_COPY_A = GEMM_LOOP + ".body.seq.stmts[0].copy"
GEMM_GEMM = GEMM_LOOP + ".body.seq.stmts[2].gemm"
SM_STORE = "kernel.body.seq.stmts[2].for_.body.for_.body.store"  # X_frag[i, j] = ...
SS_IF = "kernel.body.seq.stmts[1].for_.body.if_then_else"


def reject(p: pb.Program, message: str, path: str | None = None, limits: Limits | None = None):
    with pytest.raises(VerifyError) as info:
        verify_program(Program(p), limits)
    err = info.value
    assert re.search(message, err.message), f"{err.message!r} does not match {message!r}"
    if path is not None:
        assert err.path == path, err
    node(p, err.path)  # every path names a real field
    return err


def copy_of(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def sample(name: str) -> pb.Program:
    return P.SAMPLES[name]()


def put(path: str, field: str, value):
    return lambda p: setattr(node(p, path), field, value)


def replace_with(path: str, make):
    return lambda p: node(p, path).CopyFrom(make(p))


def clear(path: str, field: str):
    return lambda p: node(p, path).ClearField(field)


@pytest.mark.parametrize("name", sorted(P.SAMPLES))
def test_samples_verify(name):
    assert verify_program(Program(sample(name))) is None


def test_package_verify_stays_a_function():
    """`tiled.ir.verify` is the function: importing the verifier module must not rebind it
    (a submodule named `verify` would, on its first import)."""
    import tiled.ir

    program = Program(P.gemm())
    assert tiled.ir.verify(program) is program
    assert tiled.ir.verify(program) is program


@pytest.mark.parametrize("kwargs", [dict(block_m=64, block_n=256, block_k=64, stages=2),
                                    dict(block_m=16, block_n=16, block_k=16, stages=1)])
def test_gemm_variants_verify(kwargs):
    verify_program(Program(P.gemm(**kwargs)))


def _bad_extent_shape(p):
    src, dst = node(p, GEMM_COPY_A + ".src"), node(p, GEMM_COPY_A + ".dst")
    src.extents[:] = [64, 32]
    dst.extents[:] = [128, 32]


def _both_global(p):
    c = node(p, GEMM_COPY_A)
    c.dst.CopyFrom(P.region(102, [0, 0], [128, 32]))


def _oob_shared_index(p):
    store = node(p, SM_STORE)
    store.indices[1].CopyFrom(add(var(4), const(1)))


def _negative_shared_index(p):
    store = node(p, SM_STORE)
    store.indices[0].CopyFrom(binary(pb.SUB, var(3), const(1)))


def _load_past_local(p):
    s = node(p, SS_IF + ".else_body.for_.body.store")
    s.value.CopyFrom(load(103, F32, add(var(6), const(1))))


def add_buffer(p: pb.Program, name: str, shape, dtype, scope) -> int:
    bid = 200 + len(p.buffers)
    p.buffers.add(id=bid, name=name, dtype=dtype, scope=scope,
                  shape=[pb.Dim(size=d) for d in shape])
    return bid


def _gemm_rank3(p):
    node(p, GEMM_GEMM).a = add_buffer(p, "T", [4, 4, 4], F16, pb.SHARED)


def _gemm_c_shape(p):
    node(p, GEMM_GEMM).c = add_buffer(p, "C2", [128, 64], F32, pb.FRAGMENT)


def _grid_block_var(p):
    node(p, "kernel.grid[0]").CopyFrom(var(2))


def _grid_load(p):
    node(p, "kernel.grid[0]").CopyFrom(load(101, F16, const(0), const(0)))


def _unbound_var(p):
    p.vars.add(id=50, name="ghost", dtype=I32)


def _reuse_loop_var(p):
    node(p, "kernel.body.seq.stmts[4].for_").var = 3


def _tile_op_in_parallel(p):
    fill = pb.Stmt()
    fill.CopyFrom(node(p, "kernel.body.seq.stmts[0]"))
    node(p, "kernel.body.seq.stmts[0]").CopyFrom(P.loop(4, 4, fill, pb.PARALLEL))


def _gemm_into_shared(p):
    node(p, "buffers[5]").scope = pb.SHARED


def _dup_param(p):
    p.params.add(name="A2", buffer=100)


def _param_shared(p):
    p.params.add(name="A_s", buffer=103)


def _scalar_is_dim(p):
    p.params.add(name="M_again", scalar=1)


def _neg_global_offset(p):
    node(p, GEMM_COPY_A + ".src.offsets[0]").CopyFrom(
        add(binary(pb.MUL, var(3), const(128)), const(-1)))


def _neg_global_index(p):
    """Y[i - 5000] for i < 1024, unguarded: negative on every execution."""
    guarded = node(p, "kernel.body.for_.body")
    guarded.CopyFrom(copy_of(guarded.if_then_else.then_body))  # drop the tail guard
    node(p, "kernel.body.for_.body.store.indices[0]").CopyFrom(
        binary(pb.SUB, var(3), const(5000)))


CASES = [
    # program
    ("schema", "gemm", put("", "schema_version", 2), "schema version 2", "schema_version"),
    ("name", "gemm", put("", "name", "1gemm"), "not an identifier", "name"),
    ("long_name", "gemm", put("", "name", "k" * 129), "at most 128", "name"),
    # var and buffer tables
    ("dup_var", "gemm", lambda p: p.vars.add(id=1, dtype=I32), "var id 1 is declared twice",
     "vars[4]"),
    ("var_no_dtype", "gemm", put("vars[2]", "dtype", 0), "no dtype", "vars[2]"),
    ("var_bad_dtype", "gemm", put("vars[2]", "dtype", 99), "unknown dtype 99", "vars[2]"),
    ("dup_buffer", "gemm", lambda p: p.buffers.add(id=100), "buffer id 100 is declared twice",
     "buffers[6]"),
    ("buf_no_dtype", "gemm", put("buffers[3]", "dtype", 0), "A_shared has no dtype",
     "buffers[3]"),
    ("buf_no_scope", "gemm", put("buffers[3]", "scope", 0), "no scope", "buffers[3]"),
    ("rank0", "gemm", clear("buffers[3]", "shape"), "rank 0", "buffers[3]"),
    ("rank9", "gemm", lambda p: p.buffers[3].shape.extend([pb.Dim(size=1)] * 7), "rank 9",
     "buffers[3]"),
    ("dim0", "gemm", put("buffers[3].shape[0]", "size", 0), "dim 0 of A_shared is 0",
     "buffers[3].shape[0]"),
    ("dim_huge", "gemm", put("buffers[3].shape[0]", "size", 1 << 31), "static dims must be",
     "buffers[3].shape[0]"),
    ("dim_empty", "gemm", clear("buffers[3].shape[0]", "kind"), "neither a size nor a var",
     "buffers[3].shape[0]"),
    ("sym_shared", "gemm", put("buffers[3].shape[0]", "var", 1),
     "only GLOBAL buffers may have symbolic dims", "buffers[3].shape[0].var"),
    ("sym_int64", "gemm", put("vars[0]", "dtype", pb.INT64), "must be an int32 var",
     "buffers[0].shape[0].var"),
    ("sym_unknown", "gemm", put("buffers[0].shape[0]", "var", 77), "unknown var id 77",
     "buffers[0].shape[0].var"),
    ("tile_elements", "softmax", lambda p: p.buffers[2].shape.add(size=1 << 12),
     "4194304", "buffers[2]"),
    # params
    ("global_not_param", "gemm", lambda p: p.params.pop(), "global buffer C is not a parameter",
     "buffers[2]"),
    ("param_shared", "gemm", _param_shared, "tensor parameters are GLOBAL", "params[3].buffer"),
    ("param_twice", "gemm", _dup_param, "passed as two parameters", "params[3].buffer"),
    ("param_names", "gemm", put("params[1]", "name", "A"), "two parameters are named 'A'",
     "params[1]"),
    ("param_ident", "gemm", put("params[1]", "name", "B-1"), "not an identifier", "params[1]"),
    ("param_empty", "gemm", clear("params[1]", "kind"), "neither a buffer nor a scalar",
     "params[1]"),
    ("param_unknown_buf", "gemm", put("params[1]", "buffer", 999), "unknown buffer id 999",
     "params[1].buffer"),
    ("scalar_is_dim", "gemm", _scalar_is_dim, "bound twice", None),
    ("scalar_unknown", "scaled_sum", put("params[2]", "scalar", 77), "unknown var id 77",
     "params[2].scalar"),
    # kernel
    ("no_kernel", "gemm", clear("", "kernel"), "no kernel", "kernel"),
    ("grid_empty", "gemm", clear("kernel", "grid"), "grid has 0 dims", "kernel.grid"),
    ("grid_4", "gemm", lambda p: p.kernel.grid.extend([const(1)] * 2), "grid has 4 dims",
     "kernel.grid"),
    ("block_vars", "gemm", lambda p: p.kernel.block_vars.pop(), "1 block vars",
     "kernel.block_vars"),
    ("threads0", "gemm", put("kernel", "threads", 0), "0 threads", "kernel.threads"),
    ("threads2048", "gemm", put("kernel", "threads", 2048), "2048 threads", "kernel.threads"),
    ("grid_float", "scaled_sum", replace_with("kernel.grid[0]", lambda p: const(1.0, F32)),
     "must be an integer", "kernel.grid[0]"),
    ("grid_block_var", "gemm", _grid_block_var, "the grid uses bx", "kernel.grid[0].var"),
    ("grid_load", "gemm", _grid_load, "cannot load", "kernel.grid[0].load"),
    ("grid_zero", "scaled_sum", put("kernel.grid[0]", "int_value", 0), "at least 1",
     "kernel.grid[0]"),
    ("block_var_i64", "gemm", put("vars[1]", "dtype", pb.INT64), "block var bx must be int32",
     "kernel.block_vars[0]"),
    ("no_body", "gemm", clear("kernel", "body"), "no body", "kernel.body"),
    # binding and scope
    ("loop_var_outside", "gemm",
     replace_with("kernel.body.seq.stmts[2].copy.dst.offsets[0]", lambda p: var(4)),
     "k is used where it is not defined", "kernel.body.seq.stmts[2].copy.dst.offsets[0].var"),
    ("unbound", "gemm", _unbound_var, "ghost is declared but never bound", "vars[4]"),
    ("loop_var_twice", "softmax", _reuse_loop_var, "i is bound twice",
     "kernel.body.seq.stmts[4].for_.var"),
    ("loop_over_block_var", "gemm", put(GEMM_LOOP, "var", 2),
     "bx is bound twice: first as a block var, again as a loop var", GEMM_LOOP + ".var"),
    ("loop_var_i64", "gemm", put("vars[3]", "dtype", pb.INT64), "loop var k must be int32",
     GEMM_LOOP + ".var"),
    ("unknown_var_use", "gemm", put(GEMM_COPY_A + ".src.offsets[0].binary.a", "var", 77),
     "unknown var id 77", GEMM_COPY_A + ".src.offsets[0].binary.a.var"),
    ("var_dtype", "gemm", put("kernel.grid[1].binary.a.binary.a", "dtype", pb.INT64),
     "M is int32 but used as int64", "kernel.grid[1].binary.a.binary.a"),
]


@pytest.mark.parametrize(("sample_name", "edit", "message", "path"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejects(sample_name, edit, message, path):
    p = sample(sample_name)
    edit(p)
    reject(p, message, path)


# -- expression typing ---------------------------------------------------------------------------

FILL_VALUE = "kernel.body.seq.stmts[0].fill.value"  # gemm: fill(C_local, 0.0f32)


def f32(x=1.0):
    return const(x, F32)


def raw(dtype, **kind) -> pb.Expr:
    return pb.Expr(dtype=dtype, **kind)


EXPR_CASES = [
    ("no_dtype", raw(0, float_value=0.0), "expression has no dtype", ""),
    ("bad_dtype", raw(77, float_value=0.0), "unknown dtype 77", ""),
    ("no_kind", raw(F32), "empty expression", ""),
    ("int_as_float", raw(F32, int_value=1), "use float_value", ""),
    ("float_as_int", pb.Expr(dtype=F32, cast=pb.Cast(value=raw(I32, float_value=1.5))),
     "use int_value", ".cast.value"),
    ("int8_range", pb.Expr(dtype=F32, cast=pb.Cast(value=raw(pb.INT8, int_value=300))),
     "300 does not fit in int8", ".cast.value"),
    ("operand_dtypes", binary(pb.ADD, f32(), const(1.0, F16)), "different dtypes", ".binary"),
    ("cmp_result", raw(F32, binary=pb.Binary(op=pb.LT, a=f32(), b=f32())), "gives bool",
     ".binary"),
    ("and_on_floats", raw(F32, binary=pb.Binary(op=pb.AND, a=f32(), b=f32())),
     "logical and takes and gives bool", ".binary"),
    ("bitwise_float", binary(pb.BIT_AND, f32(), f32()), "works on integers", ".binary"),
    ("floordiv_float", binary(pb.FLOOR_DIV, f32(), f32()), "works on integers", ".binary"),
    ("arith_result", raw(F32, binary=pb.Binary(op=pb.ADD, a=const(1.0, F16), b=const(1.0, F16))),
     "gives float16, not float32", ".binary"),
    ("arith_bool", pb.Expr(dtype=F32, cast=pb.Cast(value=binary(
        pb.ADD, raw(pb.BOOL, int_value=1), raw(pb.BOOL, int_value=0)))), "on bool operands",
     ".cast.value.binary"),
    ("no_op", raw(F32, binary=pb.Binary(a=f32(), b=f32())), "no operator", ".binary.op"),
    ("bad_op", raw(F32, binary=pb.Binary(op=99, a=f32(), b=f32())), "unknown operator 99",
     ".binary.op"),
    ("no_operand", raw(F32, binary=pb.Binary(op=pb.ADD, a=f32())), "no operand b",
     ".binary.b"),
    ("arity", raw(F32, call=pb.Call(op=pb.EXP, args=[f32(), f32()])),
     "exp takes 1 argument", ".call.args"),
    ("pow_arity", raw(F32, call=pb.Call(op=pb.POW, args=[f32()])), "pow takes 2", ".call.args"),
    ("bad_intrinsic", raw(F32, call=pb.Call(op=55, args=[f32()])), "unknown intrinsic 55",
     ".call.op"),
    ("exp_int", pb.Expr(dtype=F32, cast=pb.Cast(value=raw(I32, call=pb.Call(
        op=pb.EXP, args=[const(1)])))), "exp works on floats", ".cast.value.call"),
    ("not_float", raw(F32, call=pb.Call(op=pb.NOT, args=[f32()])), "works on bool", ".call"),
    ("neg_bool", pb.Expr(dtype=F32, cast=pb.Cast(value=raw(pb.BOOL, call=pb.Call(
        op=pb.NEG, args=[raw(pb.BOOL, int_value=1)])))), "neg does not work on bool",
     ".cast.value.call"),
    ("call_arg_dtype", raw(F32, call=pb.Call(op=pb.EXP, args=[const(1.0, F16)])),
     "gives float16, not float32", ".call.args[0]"),
    ("cast_empty", raw(F32, cast=pb.Cast()), "cast to float32 has no value", ".cast.value"),
    ("select_cond", raw(F32, select=pb.Select(cond=f32(), true_value=f32(), false_value=f32())),
     "condition has dtype float32", ".select.cond"),
    ("select_branch", raw(F32, select=pb.Select(cond=raw(pb.BOOL, int_value=1),
                                                true_value=f32(), false_value=const(0.0, F16))),
     "false_value is float16", ".select.false_value"),
    ("select_missing", raw(F32, select=pb.Select(cond=raw(pb.BOOL, int_value=1),
                                                 true_value=f32())), "no false_value",
     ".select.false_value"),
    ("load_unknown", load(999, F32, const(0)), "unknown buffer id 999", ".load.buffer"),
    ("load_rank", load(105, F32, const(0)), "C_local has rank 2 but is indexed with 1",
     ".load.indices"),
    ("load_float_index", load(105, F32, const(0), f32(0.0)), "index 1 into C_local has dtype "
     "float32", ".load.indices[1]"),
    ("load_dtype", load(103, F32, const(0), const(0)), "from float16 buffer A_shared is typed "
     "float32", ""),
]


@pytest.mark.parametrize(("expr", "message", "subpath"), [c[1:] for c in EXPR_CASES],
                         ids=[c[0] for c in EXPR_CASES])
def test_rejects_expression(expr, message, subpath):
    p = P.gemm()
    node(p, FILL_VALUE).CopyFrom(expr)
    err = reject(p, message, FILL_VALUE + subpath)
    assert err.loc == "kernels.py:10"


def test_float_constants_may_be_inf_and_nan():
    for x in (float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38, -1e38):
        p = P.gemm()
        node(p, FILL_VALUE).float_value = x
        verify_program(Program(p))


@pytest.mark.parametrize(("value", "dtype", "message"), [
    (1e300, F32, r"float constant 1e\+300 does not fit in float32 \(largest finite value "
     r"3.40282e\+38\); use inf"),
    (-3.5e38, F32, "does not fit in float32"),
    (65520.0, F16, "float constant 65520 does not fit in float16"),
    (449.0, pb.FLOAT8_E4M3, "does not fit in float8_e4m3"),
])
def test_rejects_float_constant_outside_its_dtype(value, dtype, message):
    p = P.gemm()
    literal = raw(dtype, float_value=value)
    node(p, FILL_VALUE).CopyFrom(literal if dtype == F32 else P.cast(literal, F32))
    reject(p, message, FILL_VALUE if dtype == F32 else FILL_VALUE + ".cast.value")


# -- static bounds --------------------------------------------------------------------------------

BOUNDS_CASES = [
    ("shared_past_end", "softmax", _oob_shared_index,
     "index 128 is out of bounds for X_frag dim 1 of extent 128", SM_STORE + ".indices[1]"),
    ("shared_negative", "softmax", _negative_shared_index,
     "index -1 is out of bounds for X_frag dim 0", SM_STORE + ".indices[0]"),
    ("local_load", "scaled_sum", _load_past_local, "index 4 is out of bounds for scratch",
     SS_IF + ".else_body.for_.body.store.value.load.indices[0]"),
    ("region_past_end", "gemm", put(GEMM_COPY_A + ".dst.offsets[1]", "int_value", 1),
     "tile of 32 starting at offset 1 runs past the end of A_shared dim 1 of extent 32",
     GEMM_COPY_A + ".dst.offsets[1]"),
    ("global_negative_offset", "gemm", _neg_global_offset, "starts at offset -1 in dim 0",
     GEMM_COPY_A + ".src.offsets[0]"),
    ("global_negative_index", "elementwise", _neg_global_index, r"index in -5000..-3977 is out "
     r"of bounds for Y dim 0 of extent M \(valid 0..M-1\) on every execution",
     "kernel.body.for_.body.store.indices[0]"),
]


@pytest.mark.parametrize(("sample_name", "edit", "message", "path"),
                         [c[1:] for c in BOUNDS_CASES], ids=[c[0] for c in BOUNDS_CASES])
def test_rejects_out_of_bounds(sample_name, edit, message, path):
    p = sample(sample_name)
    edit(p)
    reject(p, message, path)


def test_region_larger_than_tile():
    p = P.gemm()
    node(p, GEMM_COPY_A + ".src").extents[:] = [256, 32]
    node(p, GEMM_COPY_A + ".dst").extents[:] = [256, 32]
    reject(p, "tile extent 256 is larger than A_shared dim 0 of extent 128",
           GEMM_COPY_A + ".dst.extents[0]")


def test_global_region_may_run_past_the_end():
    p = P.gemm()  # K = 1024, yet the tile starts at 1000 + k * 32: a ragged tail, legal
    offset = node(p, GEMM_COPY_A + ".src.offsets[1]")
    offset.CopyFrom(add(copy_of(offset), const(1000)))
    verify_program(Program(p))


def test_global_region_wholly_outside():
    p = P.gemm()  # the tile starts at 1024 + k * 32 >= K = 1024: no element inside, ever
    offset = node(p, GEMM_COPY_A + ".src.offsets[1]")
    offset.CopyFrom(add(copy_of(offset), const(1024)))
    reject(p, r"tile of 32 starting at offset 1024 or more lies wholly outside A dim 1 of "
           r"extent 1024 \(valid starts 0..1023\)", GEMM_COPY_A + ".src.offsets[1]")
    p = P.gemm()  # a fill of a global region past the end, at a constant offset
    p.kernel.body.seq.stmts[0].fill.dst.CopyFrom(P.region(102, [0, 1024], [1, 8]))
    p.kernel.body.seq.stmts[0].fill.value.CopyFrom(const(0.0, F16))
    reject(p, "tile of 8 starting at offset 1024 lies wholly outside C dim 1",
           "kernel.body.seq.stmts[0].fill.dst.offsets[1]")


def _global_kernel(index, n: int = 1000, loop: int = 1024, load_index=None) -> pb.Program:
    """for j in Parallel(loop): Y[index] = X[load_index or index], X and Y of n floats (j is
    var 2). The compiler guards these accesses: only one outside on every execution is an
    error (TileLang's semantics: a load outside reads 0, a store outside is skipped)."""
    b = P.Builder("oob")
    x, y = b.tensor("X", [n], F32), b.tensor("Y", [n], F32)
    bx, j = b.var("bx"), b.var("j")
    assert (bx, j) == (1, 2)
    body = P.store(y, [index], load(x, F32, load_index if load_index is not None else index))
    return b.kernel([const(1)], [bx], 128, P.loop(j, loop, body, pb.PARALLEL))


JG = var(2)  # the loop var j of _global_kernel


@pytest.mark.parametrize("index", [
    JG,                                            # j < 1024 over 1000 elements: the tail
    binary(pb.SUB, JG, const(1)),                  # -1 at j = 0
    binary(pb.SUB, JG, const(1023)),               # -1023..0: only j = 1023 is inside
    add(JG, const(999)),                           # 999..2022: only j = 0 is inside
    binary(pb.MUL, JG, const(1000)),               # only j = 0 is inside
])
def test_global_access_partly_outside_is_guarded_not_rejected(index):
    verify_program(Program(_global_kernel(index)))


@pytest.mark.parametrize(("index", "load_index", "message", "path"), [
    (const(1000), None, r"index 1000 is out of bounds for Y dim 0 of extent 1000 "
     r"\(valid 0..999\) on every execution", "store.indices[0]"),
    (JG, add(JG, const(1000)), r"index in 1000..2023 is out of bounds for X dim 0 of extent "
     "1000", "store.value.load.indices[0]"),
    (binary(pb.SUB, JG, const(1024)), None, r"index in -1024..-1 is out of bounds for Y dim 0",
     "store.indices[0]"),
    (call(pb.NEG, add(JG, const(1))), JG, "index in -1024..-1 is out of bounds for Y",
     "store.indices[0]"),
])
def test_global_access_outside_on_every_execution(index, load_index, message, path):
    reject(_global_kernel(index, load_index=load_index), message, "kernel.body.for_.body." + path)


def test_global_atomic_add_outside():
    p = _global_kernel(JG)
    p.kernel.body.for_.body.CopyFrom(pb.Stmt(atomic_add=pb.AtomicAdd(
        buffer=101, indices=[add(JG, const(1000))], value=const(1.0, F32))))
    reject(p, "index in 1000..2023 is out of bounds for Y dim 0",
           "kernel.body.for_.body.atomic_add.indices[0]")
    p.kernel.body.for_.body.atomic_add.indices[0].CopyFrom(add(JG, const(999)))
    verify_program(Program(p))


def test_symbolic_global_dim_rejects_only_negative():
    p = P.elementwise()  # Y[bx * 1024 + i + 10**6] may be inside M: guarded, not rejected
    idx = node(p, "kernel.body.for_.body.if_then_else.then_body.store.indices[0]")
    idx.CopyFrom(add(copy_of(idx), const(10**6)))
    verify_program(Program(p))


def test_index_returns_its_interval():
    """The seam of the compiler's guard pass: index() returns each access's interval."""
    from tiled.ir.verifier import _Verifier

    seen = []

    class Recorder(_Verifier):
        def index(self, b, i, idx, ipath, depth):
            iv = super().index(b, i, idx, ipath, depth)
            seen.append((self.bname(b.id), iv and (iv.lo, iv.hi)))
            return iv

    v = Recorder(_global_kernel(binary(pb.SUB, JG, const(1))), Limits())
    v.tables()
    v.kernel()
    assert seen == [("Y", (-1, 1022)), ("X", (-1, 1022))]
    p = _global_kernel(JG, loop=0)  # a loop that never runs: no interval
    seen.clear()
    v = Recorder(p, Limits())
    v.tables()
    v.kernel()
    assert seen == [("Y", None), ("X", None)]


def _bounds_kernel(index: pb.Expr, cond: pb.Expr | None = None, extent: int = 64) -> pb.Program:
    """for i, j in Parallel(128, 128): [if cond:] S[index] = 0 with S a (extent,) fragment."""
    b = P.Builder("bounds")
    bx, i, j = b.var("bx"), b.var("i"), b.var("j")
    s = b.buffer("S", [extent], F32, pb.FRAGMENT)
    assert (bx, i, j) == (1, 2, 3)
    st = P.store(s, [index], const(0.0, F32))
    body = st if cond is None else P.if_(cond, st)
    return b.kernel([const(1)], [bx], 128,
                    P.loop(i, 128, P.loop(j, 128, body, pb.PARALLEL), pb.PARALLEL))


I, J = var(2), var(3)  # noqa: E741 (the loop vars i and j of _bounds_kernel)


@pytest.mark.parametrize(("index", "cond"), [
    (I, binary(pb.LT, I, const(64))),                                    # guarded tail
    (I, binary(pb.GT, const(64), I)),                                    # mirrored guard
    (binary(pb.SUB, I, const(64)), binary(pb.GE, I, const(64))),         # guard from below
    (add(I, J), binary(pb.LT, add(I, J), const(64))),                    # guard on a sum
    (I, binary(pb.AND, binary(pb.LT, I, const(64)), binary(pb.LT, J, const(3)))),
    (add(I, const(500)), binary(pb.GE, I, const(128))),                  # dead code
    (binary(pb.FLOOR_MOD, add(I, J), const(64)), None),                  # i + j mod 64
    (binary(pb.FLOOR_DIV, I, const(2)), None),                           # 0..63
    (binary(pb.SHR, I, const(1)), None),
    (binary(pb.BIT_AND, add(I, J), const(63)), None),
    (binary(pb.SUB, I, I), None),                                        # 0, not -127..127
    (binary(pb.MIN, I, const(63)), None),
    (binary(pb.MAX, binary(pb.SUB, I, const(64)), const(0)), None),
])
def test_bounds_accepts(index, cond):
    verify_program(Program(_bounds_kernel(index, cond)))


@pytest.mark.parametrize(("index", "cond", "message"), [
    (I, None, "index 127 is out of bounds for S dim 0 of extent 64"),
    (I, binary(pb.LT, I, const(65)), "index 64 is out"),
    (binary(pb.SUB, I, const(63)), binary(pb.GE, I, const(62)), "index -1 is out"),
    (I, binary(pb.AND, binary(pb.LT, I, const(100)), binary(pb.LT, J, const(3))), "index 99"),
    (binary(pb.FLOOR_DIV, I, const(2)), binary(pb.NE, J, const(0)), None),  # guard not on i
    (binary(pb.MUL, I, const(-1)), None, "index -127"),
    (binary(pb.MIN, add(I, const(64)), const(200)), None, "index 191 is out"),
    (binary(pb.MAX, I, const(64)), None, "index 127 is out"),
    (add(binary(pb.FLOOR_MOD, J, const(64)), const(64)), None, "index 64 or more"),
])
def test_bounds_rejects(index, cond, message):
    p = _bounds_kernel(index, cond, extent=64 if message else 32)
    reject(p, message or "index 63 is out of bounds")


def test_select_guards_a_load():
    p = _bounds_kernel(I, binary(pb.LT, I, const(64)))
    guarded = P.select(binary(pb.LT, J, const(64)), load(100, F32, J), const(0.0, F32))
    node(p, "kernel.body.for_.body.for_.body.if_then_else.then_body.store.value").CopyFrom(guarded)
    verify_program(Program(p))
    unguarded = P.select(binary(pb.LT, J, const(65)), load(100, F32, J), const(0.0, F32))
    node(p, "kernel.body.for_.body.for_.body.if_then_else.then_body.store.value").CopyFrom(
        unguarded)
    reject(p, "index 64 is out of bounds for S")


# -- statements -----------------------------------------------------------------------------------

STMT_CASES = [
    ("for_float_extent", replace_with(GEMM_LOOP + ".extent", lambda p: const(32.0, F32)),
     "extent of loop k has dtype float32", GEMM_LOOP + ".extent"),
    ("for_no_extent", clear(GEMM_LOOP, "extent"), "loop over k has no extent",
     GEMM_LOOP + ".extent"),
    ("for_negative", replace_with(GEMM_LOOP + ".extent", lambda p: const(-3)),
     "extent -3", GEMM_LOOP + ".extent"),
    ("for_no_kind", put(GEMM_LOOP, "kind", 0), "loop over k has no kind", GEMM_LOOP + ".kind"),
    ("for_bad_kind", put(GEMM_LOOP, "kind", 9), "unknown kind 9", GEMM_LOOP + ".kind"),
    ("stages0", put(GEMM_LOOP, "num_stages", 0), "num_stages 0; it needs 1 to 8",
     GEMM_LOOP + ".num_stages"),
    ("stages9", put(GEMM_LOOP, "num_stages", 9), "num_stages 9",
     GEMM_LOOP + ".num_stages"),
    ("serial_stages", put(GEMM_LOOP, "kind", pb.SERIAL), "sets num_stages 3 but is not "
     "pipelined", GEMM_LOOP + ".num_stages"),
    ("for_no_body", clear(GEMM_LOOP, "body"), "loop over k has no body", GEMM_LOOP + ".body"),
    ("copy_rank", lambda p: node(p, GEMM_COPY_A + ".src").extents.pop(),
     "region of A has 2 offsets and 1 extents, but A has rank 2", GEMM_COPY_A + ".src"),
    ("copy_extent0", lambda p: node(p, GEMM_COPY_A + ".src").extents.__setitem__(0, 0),
     "extent 0 in dim 0",
     GEMM_COPY_A + ".src.extents[0]"),
    ("copy_shapes", _bad_extent_shape, "copy shapes differ: the A tile is 64x32 but the "
     "A_shared tile is 128x32", GEMM_COPY_A),
    ("copy_global_global", _both_global, "copy from global A to global C", GEMM_COPY_A),
    ("copy_no_src", clear(GEMM_COPY_A, "src"), "copy has no src", GEMM_COPY_A + ".src"),
    ("copy_unknown_buffer", put(GEMM_COPY_A + ".dst", "buffer", 5), "unknown buffer id 5",
     GEMM_COPY_A + ".dst.buffer"),
    ("gemm_global_a", put(GEMM_GEMM, "a", 100), "operand A is global buffer A",
     GEMM_GEMM + ".a"),
    ("gemm_shared_c", _gemm_into_shared, "operand C is shared buffer C_local; it must be "
     "FRAGMENT", GEMM_GEMM + ".c"),
    ("gemm_rank3", _gemm_rank3, "operand A \\(T\\) has rank 3", GEMM_GEMM + ".a"),
    ("gemm_k", put(GEMM_GEMM, "transpose_a", True), "gemm K differs", GEMM_GEMM),
    ("gemm_c_shape", _gemm_c_shape, "C \\(C2\\) is 128x64 but A @ B is 128x128",
     GEMM_GEMM + ".c"),
    ("gemm_alias", put(GEMM_GEMM, "a", 105), "also an input", GEMM_GEMM + ".c"),
    ("fill_dtype", replace_with(FILL_VALUE, lambda p: const(0.0, F16)),
     "fill of float32 buffer C_local with a float16 value", FILL_VALUE),
    ("fill_no_value", clear("kernel.body.seq.stmts[0].fill", "value"), "has no value",
     FILL_VALUE),
    ("fill_no_dst", clear("kernel.body.seq.stmts[0].fill", "dst"), "fill has no dst",
     "kernel.body.seq.stmts[0].fill.dst"),
    ("tile_op_in_parallel", _tile_op_in_parallel, "cannot appear inside a Parallel loop",
     "kernel.body.seq.stmts[0].for_.body.fill"),
    ("empty_stmt", clear("kernel.body.seq.stmts[2]", "kind"), "empty statement",
     "kernel.body.seq.stmts[2]"),
]

SM_REDUCE = "kernel.body.seq.stmts[1].reduce"
SS_ATOMIC = SS_IF + ".then_body.atomic_add"
STMT_CASES_2 = [
    ("reduce_kind", "softmax", put(SM_REDUCE, "kind", 0), "reduce has no kind",
     SM_REDUCE + ".kind"),
    ("reduce_src_global", "softmax", put(SM_REDUCE, "src", 100), "source X is global",
     SM_REDUCE + ".src"),
    ("reduce_dst_shared", "softmax", put("buffers[3]", "scope", pb.SHARED),
     "destination row_max is shared", SM_REDUCE + ".dst"),
    ("reduce_dim", "softmax", put(SM_REDUCE, "dim", 2), "reduce dim 2 is out of range",
     SM_REDUCE + ".dim"),
    ("reduce_negative_dim", "softmax", put(SM_REDUCE, "dim", -1), "reduce dim -1",
     SM_REDUCE + ".dim"),
    ("reduce_shape", "softmax", put(SM_REDUCE, "dim", 0), "gives shape 128, but row_max is 16",
     SM_REDUCE + ".dst"),
    ("atomic_local", "scaled_sum", put(SS_ATOMIC, "buffer", 103),
     "atomic_add into local buffer scratch", SS_ATOMIC + ".buffer"),
    ("atomic_dtype", "scaled_sum", replace_with(SS_ATOMIC + ".value", lambda p: const(1.0, F16)),
     "atomic_add of float16 value into float32 buffer partial", SS_ATOMIC + ".value"),
    ("atomic_rank", "scaled_sum", lambda p: node(p, SS_ATOMIC).indices.add(dtype=I32,
                                                                           int_value=0),
     "partial has rank 1 but is indexed with 2", SS_ATOMIC + ".indices"),
    ("store_dtype", "softmax", replace_with(SM_STORE + ".value", lambda p: const(0.0, F16)),
     "store of float16 value into float32 buffer X_frag", SM_STORE + ".value"),
    ("store_rank", "softmax", lambda p: node(p, SM_STORE).indices.pop(),
     "X_frag has rank 2 but is indexed with 1", SM_STORE + ".indices"),
    ("store_no_value", "softmax", clear(SM_STORE, "value"), "has no value",
     SM_STORE + ".value"),
    ("if_cond_dtype", "scaled_sum", replace_with(SS_IF + ".cond", lambda p: const(1)),
     "if condition has dtype int32", SS_IF + ".cond"),
    ("if_no_cond", "scaled_sum", clear(SS_IF, "cond"), "if has no condition", SS_IF + ".cond"),
    ("if_no_then", "scaled_sum", clear(SS_IF, "then_body"), "no then body",
     SS_IF + ".then_body"),
]


@pytest.mark.parametrize(("edit", "message", "path"), [c[1:] for c in STMT_CASES],
                         ids=[c[0] for c in STMT_CASES])
def test_rejects_statement(edit, message, path):
    p = P.gemm()
    edit(p)
    reject(p, message, path)


@pytest.mark.parametrize(("sample_name", "edit", "message", "path"),
                         [c[1:] for c in STMT_CASES_2], ids=[c[0] for c in STMT_CASES_2])
def test_rejects_statement_2(sample_name, edit, message, path):
    p = sample(sample_name)
    edit(p)
    reject(p, message, path)


def test_rank1_reduce_gives_shape_1():
    p = P.softmax()
    del p.buffers[3].shape[1:]  # row_max: (1,)
    p.buffers[3].shape[0].size = 1
    node(p, SM_REDUCE).src = 104  # row_sum (16,) reduced over dim 0
    node(p, SM_REDUCE).dim = 0
    node(p, "kernel.body.seq.stmts[2].for_.body.for_.body.store.value.call.args[0].binary.b"
         ".load.indices[0]").int_value = 0
    node(p, "kernel.body.seq.stmts[2].for_.body.for_.body.store.value.call.args[0].binary.b"
         ".load.indices[0]").dtype = I32
    verify_program(Program(p))


# -- locations and limits -------------------------------------------------------------------------

def test_error_carries_nearest_location():
    p = P.gemm()
    node(p, GEMM_COPY_A + ".dst.offsets[1]").int_value = 1
    err = reject(p, "runs past the end")
    assert err.loc == "kernels.py:12"
    assert str(err).startswith("kernels.py:12 at kernel.body.seq.stmts[1].for_")
    node(p, GEMM_LOOP + ".body.seq.stmts[0]").ClearField("loc")
    assert reject(p, "runs past the end").loc == "kernels.py:11"  # the loop's
    p.kernel.grid[0].dtype = F32
    assert reject(p, "not float32").loc == "kernels.py:9"  # the kernel's


def test_limit_threads():
    reject(P.gemm(), "128 threads per block; it needs 1 to 64", "kernel.threads",
           Limits(max_threads=64))


def test_limit_loop_extent():
    reject(P.gemm(), "extent 32", GEMM_LOOP + ".extent", Limits(max_loop_extent=16))


def test_tensors_past_32_bit_indexing():
    """Kernels index with int32: a static shape of 2^31 or more elements cannot launch."""
    reject(P.gemm(n=1 << 16, k_dim=1 << 16), r"tensor B of shape 65536x65536 has 4294967296 "
           r"or more elements; kernels index tensors with 32-bit integers", "buffers[1]")
    verify_program(Program(P.gemm(n=1 << 15, k_dim=1 << 15)))  # 2^30: fine


def test_loop_extents_leave_room_for_index_arithmetic():
    assert Limits().max_loop_extent == 1 << 30
    p = P.elementwise()
    node(p, "kernel.body.for_.extent").int_value = (1 << 30) + 1
    reject(p, "extent 1073741825; it must be in 0..1073741824", "kernel.body.for_.extent")


def test_limit_nodes():
    reject(P.gemm(), "more than 40 IR nodes", None, Limits(max_nodes=40))
    verify_program(Program(P.gemm()), Limits(max_nodes=200))


def test_limit_depth():
    reject(P.softmax(), "nests deeper than 6", None, Limits(max_depth=6))


def test_limit_tile_elements():
    reject(P.gemm(), "C_local of shape 128x128 has 16384 elements; the limit is 5000",
           "buffers[5]", Limits(max_tile_elements=5000))


def test_limit_shared_memory():
    with pytest.raises(VerifyError) as info:
        verify_program(Program(P.gemm(block_m=256, block_n=256, block_k=256)))
    assert "kernel allocates 256 KiB of shared memory, the limit is 227 KiB: reduce block " \
           "sizes or num_stages" in info.value.message
    assert info.value.path == "buffers[4]"  # B_shared: A_shared alone fits
    with config.override(max_shared_bytes=12 * 1024):
        reject(P.gemm(), "16 KiB of shared memory, the limit is 12 KiB")
    reject(P.gemm(block_m=64, block_n=64, block_k=32),
           r"8 KiB of shared memory, the limit is 1 KiB \(1000 bytes\)",
           limits=Limits(max_shared_bytes=1000))


def _deep_expr(depth: int) -> pb.Expr:
    """1 + (1 + (1 + ...)) built in place: deeper than protobuf's decoder would accept."""
    root = pb.Expr()
    e = root
    for _ in range(depth):
        e.dtype = F32
        e.binary.op = pb.ADD
        e.binary.a.CopyFrom(const(1.0, F32))
        e = e.binary.b
    e.CopyFrom(const(1.0, F32))
    return root


def test_deep_program_is_a_verify_error():
    p = P.gemm()
    node(p, FILL_VALUE).CopyFrom(_deep_expr(5000))
    reject(p, "nests deeper than 200")
    stmt = pb.Stmt()
    inner = stmt
    for _ in range(3000):
        inner = inner.seq.stmts.add()
    p = P.gemm()
    p.kernel.body.CopyFrom(stmt)
    reject(p, "nests deeper than 200")
    verify_program(Program(P.gemm()), Limits(max_depth=10))


def test_huge_repeated_fields_stop_early():
    p = P.gemm()
    node(p, GEMM_COPY_A + ".src").offsets.extend([const(0)] * 1_000_000)
    reject(p, "1000002 offsets", GEMM_COPY_A + ".src")
    p = P.gemm()
    p.kernel.body.seq.stmts.extend([pb.Stmt(seq=pb.Seq())] * 300_000)
    reject(p, "more than 200000 IR nodes")


# -- integer operands: shift amounts and divisors -------------------------------------------------

def _int_kernel(value: pb.Expr, cond: pb.Expr | None = None, dtype=I32) -> pb.Program:
    """for j in Parallel(40): [if cond:] S[0] = value, S a (1,) LOCAL buffer of `dtype`; the
    loop var j is var 2, the scalar param n is var 3 (of `dtype`)."""
    b = P.Builder("ints")
    bx, j = b.var("bx"), b.var("j")
    n = b.scalar("n", dtype)
    assert (bx, j, n) == (1, 2, 3)
    s = b.buffer("S", [1], dtype, pb.LOCAL)
    st = P.store(s, [const(0)], value)
    body = st if cond is None else P.if_(cond, st)
    return b.kernel([const(1)], [bx], 32, P.loop(j, 40, body, pb.PARALLEL))


N = var(3)


@pytest.mark.parametrize(("value", "cond", "message"), [
    (binary(pb.SHL, N, const(32)), None, r"shift << by 32 on int32: the amount must be in "
     r"0..31 \(the width of int32 is 32 bits\)"),
    (binary(pb.SHR, N, const(-1)), None, "shift >> by -1 on int32"),
    (binary(pb.SHL, N, JG), None, "shift << by 39 on int32"),  # j = 39 is reached
    (binary(pb.SHR, N, binary(pb.SUB, JG, const(5))), None, "shift >> by -5"),
    (binary(pb.SHL, N, add(JG, const(100))), binary(pb.NE, N, const(0)),
     "shift << by in 100..139"),
    (binary(pb.FLOOR_DIV, N, const(0)), None, r"integer // by constant 0 \(int32\): division "
     "by zero is undefined"),
    (binary(pb.DIV, N, const(0)), None, "integer / by constant 0"),
    (binary(pb.FLOOR_MOD, N, const(0)), None, "integer % by constant 0"),
    (binary(pb.FLOOR_MOD, N, JG), None, "integer % by a value in 0..39 that reaches 0"),
    (binary(pb.DIV, N, binary(pb.SUB, JG, const(39))), None, "a value in -39..0 that reaches 0"),
])
def test_rejects_undefined_integer_operand(value, cond, message):
    reject(_int_kernel(value, cond), message, None)


@pytest.mark.parametrize("value", [
    binary(pb.SHL, N, const(31)),
    binary(pb.SHR, N, binary(pb.MIN, JG, const(31))),
    binary(pb.SHL, N, N),                            # unknown amount: the author's business
    binary(pb.FLOOR_DIV, N, add(JG, const(1))),      # 1..40
    binary(pb.FLOOR_MOD, N, N),                      # unknown divisor
    binary(pb.DIV, N, binary(pb.SUB, JG, const(20))),  # 0 only mid-range (j = 20)
])
def test_accepts_integer_operand(value):
    verify_program(Program(_int_kernel(value)))


def test_integer_operand_rules_follow_dtype_and_guards():
    verify_program(Program(_int_kernel(binary(pb.SHL, var(3, pb.INT64), const(40, pb.INT64)),
                                       dtype=pb.INT64)))
    reject(_int_kernel(binary(pb.SHL, var(3, pb.INT8), const(8, pb.INT8)), dtype=pb.INT8),
           "shift << by 8 on int8: the amount must be in 0..7")
    guarded = binary(pb.GT, JG, const(0))  # if j > 0: n // j
    verify_program(Program(_int_kernel(binary(pb.FLOOR_DIV, N, JG), guarded)))
    p = _int_kernel(const(0))  # a float division by a constant zero: TVM refuses to fold it
    p.buffers[0].dtype = F32
    value = node(p, "kernel.body.for_.body.store.value")
    value.CopyFrom(binary(pb.DIV, P.cast(N, F32), call(pb.NEG, const(0.0, F32))))
    reject(p, "float32 division by constant 0: TVM refuses to fold it")
    value.CopyFrom(binary(pb.DIV, P.cast(N, F32), const(1e-30, F32)))
    verify_program(Program(p))


def test_constant_shift_in_dead_code_is_rejected():
    """A constant amount is wrong whenever the code runs; TVM folds it even where it never
    does. An amount that depends on vars is not judged in code that never runs."""
    never = binary(pb.LT, JG, const(0))
    reject(_int_kernel(binary(pb.SHL, N, const(40)), never), "shift << by 40")
    verify_program(Program(_int_kernel(binary(pb.SHL, N, binary(pb.SUB, JG, const(5))), never)))


# -- names of the generated C ---------------------------------------------------------------------

def _dim_named(name: str, p: pb.Program | None = None) -> pb.Program:
    p = p if p is not None else P.gemm()
    p.vars[0].name = name  # M, the symbolic dim of A and C
    return p


@pytest.mark.parametrize(("name", "message"), [
    ("1abc", "symbolic dim '1abc' \\(dim 0 of A\\): the name is not an identifier"),
    ("a b", "is not an identifier"),
    ("m" * 65, "is longer than 64 characters"),
    ("int", "is reserved: a C/C\\+\\+/CUDA keyword"),
    ("float", "is reserved"),
    ("blockIdx", "is reserved"),
    ("threadIdx", "is reserved"),
    ("uint", "is reserved"),       # `#define uint unsigned int` in TVM's CUDA preamble
    ("expf", "is reserved"),       # hides the function the body calls
    ("float4", "is reserved"),
    ("__x", "is reserved: names starting with __"),
    ("_X", "is reserved: names starting with __, _ and a capital letter"),
    ("tiled_m", "is reserved"),
    ("TILED_M", "is reserved"),
    ("A", "has the name of parameter A; dims and parameters need distinct C names"),
    ("B_ptr", "has the name of tensor parameter B's data pointer"),
])
def test_rejects_dim_name(name, message):
    reject(_dim_named(name), message, "vars[0]")


def test_dim_names_accepted():
    for name in ("M", "m" * 64, "_m", "seq_len", "M2", "Integer"):
        verify_program(Program(_dim_named(name)))
    verify_program(Program(_dim_named("")))  # unnamed: the compiler calls it d<id>


def test_unnamed_dim_is_checked_under_the_name_it_gets():
    p = _dim_named("")
    p.params[1].name = "d1"  # the name the compiler gives var 1
    reject(p, "symbolic dim 'd1' \\(dim 0 of A\\) has the name of parameter d1", "vars[0]")


def test_two_dims_with_one_name():
    p = P.gemm()
    p.vars.add(id=9, name="M", dtype=I32)  # a second dim var, also called M, for B's rows
    p.buffers[1].shape[0].CopyFrom(pb.Dim(var=9))
    reject(p, "symbolic dim 'M' \\(dim 0 of B\\) has the name of dim var 1", "vars[4]")


@pytest.mark.parametrize(("name", "message"), [
    ("threadIdx", "parameter name 'threadIdx' is reserved"),
    ("int", "parameter name 'int' is reserved"),
    ("_Bool", "is reserved"),
    ("tiled_tmap_0", "is reserved"),  # the sm90 path's TMA descriptor parameters
    ("x" * 65, "is longer than 64 characters"),
    ("", "parameter name '' is empty"),
])
def test_rejects_param_name(name, message):
    p = P.gemm()
    p.params[1].name = name
    reject(p, message, "params[1]")


def test_rejects_param_named_like_a_data_pointer():
    p = P.scaled_sum()
    p.params[3].name = "X_ptr"  # the scalar n, named as tensor X's pointer in the C signature
    reject(p, "parameter name 'X_ptr' is the C name of tensor parameter X's data pointer",
           "params[3]")


# -- memory per thread and per block --------------------------------------------------------------

def _alloc_kernel(buffers, threads: int = 32) -> pb.Program:
    """A kernel that allocates `buffers` [(scope, elements, dtype)] and stores into the first."""
    b = P.Builder("alloc")
    x = b.tensor("X", [1024], F32)
    bx = b.var("bx")
    ids = [b.buffer(f"buf{k}", [n], dt, scope) for k, (scope, n, dt) in enumerate(buffers)]
    first = buffers[0][2]
    body = P.store(ids[0], [const(0)], P.cast(load(x, F32, const(0)), first))
    return b.kernel([const(1)], [bx], threads, body)


def test_limit_local_memory_per_thread():
    """Finding 9 of issue 10: 50 LOCAL buffers of 4M float64 (1.6 GB per thread)."""
    p = _alloc_kernel([(pb.LOCAL, 1 << 22, pb.FLOAT64)] * 50)
    err = reject(p, r"kernel allocates 1600 MiB of local memory per thread \(LOCAL buffers, and "
                 r"FRAGMENT buffers spread over the block's 32 threads\), the limit is 64 KiB "
                 r"\(Limits.max_local_bytes\): use fewer or smaller buffers \(largest: buf0 32 "
                 r"MiB, buf1 32 MiB, buf2 32 MiB; buf0 crosses the limit\)", "buffers[1]")
    assert err.loc == "kernels.py:1"  # the kernel's: buf0 has no location
    p.buffers[1].loc.CopyFrom(pb.Location(file="k.py", line=7))
    assert reject(p, "local memory per thread").loc == "k.py:7"  # where buf0 is allocated
    reject(_alloc_kernel([(pb.LOCAL, 4096, F32)] * 3), "48 KiB of local memory per thread .*, the "
           "limit is 40 KiB", "buffers[3]", Limits(max_local_bytes=40 << 10))
    verify_program(Program(_alloc_kernel([(pb.LOCAL, 4096, F32)] * 3)))  # 48 KiB


def test_limit_fragments_count_per_thread():
    # 64K float32 spread over 32 threads: 8 KiB each; over 1024 threads, 256 bytes each
    reject(_alloc_kernel([(pb.FRAGMENT, 1 << 16, F32)] * 9), "72 KiB of local memory per "
           "thread", "buffers[9]")
    verify_program(Program(_alloc_kernel([(pb.FRAGMENT, 1 << 16, F32)] * 9, threads=1024)))
    reject(_alloc_kernel([(pb.FRAGMENT, 1000, F32), (pb.LOCAL, 100, F32)], threads=3),
           r"1.7 KiB \(1734 bytes\) of local memory per thread", "buffers[2]",
           Limits(max_local_bytes=1500))


def test_limit_memory_per_block():
    big = [(pb.FRAGMENT, 1 << 22, F32)] * 3  # 48 MiB; 48 KiB per thread over 1024 threads
    reject(_alloc_kernel(big, threads=1024), r"kernel allocates 48 MiB of memory per block "
           r"\(SHARED, FRAGMENT and LOCAL buffers together\), the limit is 32 MiB "
           r"\(Limits.max_block_bytes\)", "buffers[3]")
    verify_program(Program(_alloc_kernel(big[:2], threads=1024)))
    reject(_alloc_kernel([(pb.SHARED, 1024, F32), (pb.LOCAL, 1024, F32)]),
           "8 KiB of memory per block", "buffers[2]", Limits(max_block_bytes=6000))


# -- constants the compiler folds -----------------------------------------------------------------

U8, U32 = pb.UINT8, pb.UINT32


@pytest.mark.parametrize(("value", "dtype", "message"), [
    (P.cast(const(-1), U32), U32, r"cast of constant -1 to uint32: uint32 holds "
     r"0..4294967295; mask or clamp it first"),
    (P.cast(const(300), U8), U8, "cast of constant 300 to uint8"),
    (P.cast(const(-1.0, F32), pb.UINT64), pb.UINT64, "cast of constant -1 to uint64"),
    (P.cast(const(float("inf"), F32), I32), I32, "cast of constant inf to int32"),
    (P.cast(const(float("nan"), F32), I32), I32, "cast of constant nan to int32"),
    (P.cast(const(3e9, F32), I32), I32, "cast of constant 3e\\+09 to int32"),
    (P.cast(binary(pb.SUB, JG, JG), U8), U8, None),  # not a constant: may be anything
    (P.cast(binary(pb.MUL, const(1 << 20, U32), const(1 << 20, U32)), I32), I32, None),
    (binary(pb.SHL, const(3), const(30)), I32, "constant shift 3 << 30 overflows int32"),
    (binary(pb.SHL, const(1), const(31)), I32, "constant shift 1 << 31 overflows"),
    (binary(pb.SHL, const(1, U32), const(31, U32)), U32, None),
    (binary(pb.SUB, const(0, U8), const(1, U8)), U8, "constant 0 - 1 wraps below 0 in uint8"),
    (call(pb.NEG, const(5, U8)), U8, "neg of constant 5 wraps below 0 in uint8"),
    (call(pb.ABS, const(-(1 << 31))), I32, "abs of constant -2147483648 overflows int32"),
    (call(pb.ABS, const(-5)), I32, None),
])
def test_constant_folds(value, dtype, message):
    p = _int_kernel(value, dtype=dtype)
    if message is None:
        verify_program(Program(p))
    else:
        reject(p, message)


def test_cast_of_constant_to_bool_and_float():
    p = _int_kernel(const(0))
    BOOL_ = pb.BOOL
    p.buffers[0].dtype = BOOL_
    value = node(p, "kernel.body.for_.body.store.value")
    value.CopyFrom(P.cast(const(5), BOOL_))
    reject(p, r"cast of constant 5 to bool: bool holds 0..1; compare instead \(x != 0\)")
    value.CopyFrom(P.cast(const(1), BOOL_))
    verify_program(Program(p))
    p.buffers[0].dtype = F16
    value.CopyFrom(P.cast(const(70000), F16))
    reject(p, "cast of constant 70000 to float16: float16 holds largest finite value 65504")
    value.CopyFrom(P.cast(const(1e6, F32), F16))
    reject(p, "cast of constant 1e\\+06 to float16")
    value.CopyFrom(P.cast(const(float("-inf"), F32), F16))
    verify_program(Program(p))


# -- the grid is what the launch manifest can evaluate --------------------------------------------

@pytest.mark.parametrize(("grid", "message"), [
    (var(2), "the grid uses scalar parameter n; the launch manifest computes the grid from "
     "tensor shapes"),
    (binary(pb.SHL, const(1), const(2)), "the grid uses <<"),
    (binary(pb.BIT_AND, const(5), const(3)), "the grid uses &"),
    (call(pb.ABS, const(3)), "the grid uses a call"),
    (P.select(binary(pb.LT, const(1), const(2)), const(1), const(2)), "the grid uses a select"),
])
def test_rejects_grid_the_manifest_cannot_evaluate(grid, message):
    p = P.scaled_sum()
    p.kernel.grid[0].CopyFrom(grid)
    reject(p, message)


def test_grid_may_use_dims_and_arithmetic():
    p = P.elementwise()
    grid = binary(pb.MAX, binary(pb.FLOOR_MOD, binary(pb.DIV, var(1), const(3)), const(7)),
                  P.cast(binary(pb.SUB, P.cast(var(1), pb.INT64), const(1, pb.INT64)), I32))
    p.kernel.grid[0].CopyFrom(add(grid, const(1)))
    verify_program(Program(p))


@pytest.mark.parametrize(("value", "message"), [
    (binary(pb.MUL, const(1 << 20), const(1 << 20)), r"int32 arithmetic overflows: \* reaches "
     r"1099511627776, outside -2147483648..2147483647 \(signed overflow is undefined\); "
     "compute in a wider dtype"),
    (binary(pb.MUL, JG, const(-(1 << 31))),  # TVM negates such a literal: refused as such
     r"constant -2147483648 \(the int32 minimum\) as an operand of \*"),
    (add(binary(pb.MUL, JG, const(1 << 25)), const(1 << 30)),
     "overflows: \\+ reaches 2382364672"),
    (binary(pb.SUB, const(-(1 << 31)), add(JG, const(1))),
     "overflows: - reaches -2147483688..-2147483649"),  # on every execution
    (binary(pb.SHL, JG, const(27)), "overflows: << reaches 5234491392"),
])
def test_rejects_signed_overflow(value, message):
    reject(_int_kernel(value), message)


@pytest.mark.parametrize(("value", "cond", "dtype"), [
    (binary(pb.MUL, N, const(1 << 20)), None, I32),           # n unknown: it may not overflow
    (binary(pb.MUL, JG, const(1 << 25)), None, I32),          # 39 << 25 fits
    (binary(pb.MUL, JG, const(1 << 27)), binary(pb.NE, N, JG), I32),  # j blurred by the guard
    (binary(pb.SUB, const(0, U32), const(0, U32)), None, U32),
    (binary(pb.MUL, const(1 << 31, U32), const(4, U32)), None, U32),   # unsigned: wraps
    (binary(pb.MUL, const(1 << 40, pb.INT64), const(1 << 20, pb.INT64)), None, pb.INT64),
])
def test_accepts_arithmetic_that_need_not_overflow(value, cond, dtype):
    verify_program(Program(_int_kernel(value, cond, dtype)))


def test_decided_select_is_its_live_side():
    """select(256 <= 17, j, 65) is 65: a shift by it is a shift by 65."""
    amount = P.select(binary(pb.LE, const(256), const(17)), JG, const(65))
    reject(_int_kernel(binary(pb.SHL, N, amount)), "shift << by 65 on int32")
    amount = P.select(binary(pb.LE, const(16), const(17)), binary(pb.FLOOR_MOD, JG, const(8)),
                      const(65))
    verify_program(Program(_int_kernel(binary(pb.SHL, N, amount))))


# -- operand dtypes the compiler cannot take ------------------------------------------------------

@pytest.mark.parametrize("dtype", [pb.BFLOAT16, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2])
def test_rejects_scalar_params_no_abi_passes(dtype):
    p = P.scaled_sum()
    p.vars[0].dtype = dtype  # alpha
    node(p, SS_IF + ".then_body.atomic_add.value.binary.b").dtype = dtype
    reject(p, f"scalar parameter alpha is {pb.DType.Name(dtype).lower()}; kernels take bool, "
           "integer, float16, float32 or float64 scalars", "params[2].scalar")


def test_rejects_bool_gemm_and_reduce():
    p = P.gemm()
    p.buffers[5].dtype = pb.BOOL  # C_local
    node(p, FILL_VALUE).CopyFrom(raw(pb.BOOL, int_value=0))
    reject(p, "gemm operand C \\(C_local\\) is bool; gemm multiplies and adds numbers",
           GEMM_GEMM + ".c")
    p = P.softmax()
    del p.kernel.body.seq.stmts[2:]
    p.buffers[3].dtype = pb.BOOL  # row_max
    reject(p, "reduce destination row_max is bool", SM_REDUCE + ".dst")
