"""The names the author wrote travel in the Tile IR as debug names: allocations take their
assignment target's name, loop and block vars their `for` / `as` targets. The printer, the
verifier and the compiler's errors use them; the digest ignores them."""

import re
import shutil

import pytest

import tiled
import tiled.lang as T
from tiled.errors import CompileError, KernelDefinitionError
from tiled.v1 import tile_ir_pb2 as pb


def gemm(names: dict[str, str] | None = None, block_K: int = 32):
    """A GEMM whose every local name can be respelled: `names` maps the spelling below to
    another one (the kernel's source is rebuilt, as an author renaming would)."""
    src = '''
def make(T, block_K):
    @T.prim_func
    def gemm(A: T.Tensor((128, 256), T.float16), B: T.Tensor((256, 128), T.float16),
             C: T.Tensor((128, 128), T.float32)):
        with T.Kernel(T.ceildiv(128, 64), T.ceildiv(128, 64), threads=128) as (bx, by):
            A_shared = T.alloc_shared((64, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, 64), T.float16)
            C_local = T.alloc_fragment((64, 64), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(256, block_K), num_stages=2):
                T.copy(A[by * 64, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(64, 64):
                C_local[i, j] = C_local[i, j] * 2.0
            T.copy(C_local, C[by * 64, bx * 64])
    return gemm
'''
    for old, new in (names or {}).items():
        src = re.sub(rf"\b{old}\b", new, src)
    return _define(src, "make")(T, block_K)


def _define(src: str, name: str, filename: str | None = None):
    """Defines `src` in a file of its own, so that inspect (and the rewrite) can read it."""
    import linecache

    filename = filename or f"<tiled-test-{abs(hash(src))}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    env: dict = {}
    exec(compile(src, filename, "exec"), env)
    return env[name]


def buffer_names(p):
    return [b.name for b in p.proto.buffers]


def var_names(p):
    return [v.name for v in p.proto.vars]


def test_allocations_loops_and_block_vars_carry_the_authors_names():
    p = gemm().ir
    assert buffer_names(p) == ["A", "B", "C", "A_shared", "B_shared", "C_local"]
    assert var_names(p) == ["bx", "by", "k", "i", "j"]
    text = str(p)
    assert "A_shared = alloc_shared((64, 32), float16)" in text
    assert "for k in Pipelined(8, num_stages=2):" in text
    assert "copy(A[by * 64 : +64, k * 32 : +32], A_shared)" in text
    assert "as (bx, by):" in text


def test_the_digest_is_unchanged_by_renaming_every_variable():
    """Every local name respelled (allocations, loop and block vars): same digest, other
    names. Parameter names are the kernel's interface (manifest, launch): they stay."""
    renamed = {"A_shared": "a_tile", "B_shared": "b_tile", "C_local": "acc", "bx": "col",
               "by": "row", "k": "ko", "i": "r", "j": "c"}
    a, b = gemm().ir, gemm(renamed).ir
    assert buffer_names(b)[3:] == ["a_tile", "b_tile", "acc"]
    assert var_names(b) == ["col", "row", "ko", "r", "c"]
    assert a != b and a.digest == b.digest
    assert gemm(block_K=64).ir.digest != a.digest  # while a semantic edit changes it


def test_a_name_given_with_name_wins():
    @tiled.kernel
    def k(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            s = T.alloc_shared((64,), "float32", name="staging")
            T.copy(A[0:64], s)
            T.copy(s, A[0:64])

    assert buffer_names(k.ir) == ["A", "staging"]


def test_the_innermost_name_wins_and_names_stay_unique():
    """A macro's allocation is named inside the macro (`tmp`), a second call's `tmp_1`; the
    caller's names for them, like any alias, do not rename them."""

    @T.macro
    def stage(src):
        tmp = T.alloc_shared((64,), "float32")
        T.copy(src[0:64], tmp)
        return tmp

    @tiled.kernel
    def k(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            first = stage(A)
            second = stage(A)
            alias = first  # another name for the same buffer: it keeps its own
            T.copy(alias, A[0:64])
            T.copy(second, A[0:64])

    assert buffer_names(k.ir) == ["A", "tmp", "tmp_1"]


def test_tuple_targets_name_each_allocation():
    @tiled.kernel
    def k(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            lo, hi = T.alloc_shared((32,), "float32"), T.alloc_shared((32,), "float32")
            T.copy(A[0:32], lo)
            T.copy(A[32:64], hi)

    assert buffer_names(k.ir) == ["A", "lo", "hi"]


def test_without_source_the_names_are_generated():
    src = ("def k(A: T.Tensor((64,), 'float32')):\n"
           "    with T.Kernel(1, threads=64) as bx:\n"
           "        s = T.alloc_shared((64,), 'float32')\n"
           "        for i in T.Parallel(64):\n"
           "            s[i] = A[i]\n"
           "        T.copy(s, A[0:64])\n")
    env = {"T": T}
    exec(compile(src, "<no source>", "exec"), env)  # linecache knows nothing of it
    p = tiled.kernel(env["k"]).ir
    assert re.fullmatch(r"shared\d+", buffer_names(p)[1])
    assert var_names(p) == ["bx", "i"]


def test_errors_name_the_authors_buffers_and_vars():
    @tiled.kernel
    def k(A: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            row_tile = T.alloc_shared((64,), "float32")
            for col in T.Parallel(64):
                row_tile[col + 64] = A[col]

    with pytest.raises(KernelDefinitionError, match="out of bounds") as info:
        _ = k.ir
    assert "row_tile" in info.value.message
    assert not re.search(r"shared\d|\bb\d+\b", info.value.message)


def test_trace_errors_print_expressions_as_source():
    @tiled.kernel
    def k(A: T.Tensor((64, 64), "float32")):
        with T.Kernel(2, threads=64) as bx:
            T.Pipelined(4, num_stages=bx * 128)

    with pytest.raises(KernelDefinitionError) as info:
        _ = k.ir
    assert info.value.message.endswith("got bx * 128")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
def test_a_cuda_compile_error_names_the_authors_fragment(target):
    pytest.importorskip("tvm")

    @T.prim_func
    def k(A: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            A_shared = T.alloc_shared((64, 64), "float16")
            scores = T.alloc_fragment((64, 64), "float32")
            scores_t = T.alloc_fragment((64, 64), "float32")
            T.copy(A[0, 0], A_shared)
            T.clear(scores)
            T.gemm(A_shared, A_shared, scores)
            for i, j in T.Parallel(64, 64):
                scores_t[i, j] = scores[j, i]  # a gemm accumulator read across threads
            T.copy(scores_t, C[0, 0])

    with pytest.raises(CompileError) as info:
        tiled.compile(k, target, cache=False)
    assert re.search(r"\bscores\b", info.value.message), info.value.message
    assert not re.search(r"frag\d", info.value.message)


def test_loop_vars_in_the_ir_are_the_for_targets():
    @tiled.kernel
    def k(A: T.Tensor((8, 64), "float32"), n: T.int32):
        with T.Kernel(1, threads=64) as blk:
            for row in T.serial(2, 8):
                for col in T.Parallel(64):
                    A[row, col] = A[row - 2, col] + n + blk

    p = k.ir.proto
    assert [v.name for v in p.vars] == ["n", "blk", "row", "col"]
    loop = p.kernel.body.for_
    assert loop.kind == pb.SERIAL and p.vars[loop.var].name == "row"


def test_the_printer_names_loop_vars_by_scope():
    """Two loops over `i` both print `i`; a loop that shadows a name in scope gets a suffix."""
    @tiled.kernel
    def k(A: T.Tensor((4, 64), "float32")):
        with T.Kernel(1, threads=64):
            A_s = T.alloc_shared((4, 64), "float32")
            for i in T.serial(4):
                for j in T.Parallel(64):
                    A_s[i, j] = A[i, j]
            for i in T.serial(4):
                for j in T.Parallel(64):
                    for i in T.serial(1):  # shadows the outer i on purpose
                        A[i, j] = A_s[i, j] * 2

    text = str(k.ir)
    assert text.count("for i in range(4):") == 2
    assert "for i_1 in range(1):" in text and "A[i_1, j] = A_s[i_1, j] * 2.0" in text
    assert not re.search(r"\bv\d+\b|shared\d", text)
