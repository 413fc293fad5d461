"""TileLang names tiled lacks: aliases answer with tiled's own thing; a feature the Tile IR
cannot express raises a located KernelDefinitionError where it is used; any other name is a
clear AttributeError."""

import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError
from tiled.lang.unsupported import UNSUPPORTED


def test_tilelang_spellings_of_what_tiled_has():
    assert T.Serial is T.serial and T.Unroll is T.unroll and T.Cast is T.cast
    assert T.float == T.float32 and T.half == T.float16 and T.int == T.int32
    assert T.bool is T.bool_ and T.symbolic is T.dynamic


@pytest.mark.parametrize(("use", "name"), [
    (lambda: T.get_thread_binding(0), "get_thread_binding"),
    (lambda: T.WSRole.PRODUCER, "WSRole"),
    (lambda: T.float4_e2m1fn.name, "float4_e2m1fn"),
    (lambda: T.access_ptr[0], "access_ptr"),
])
def test_unsupported_features_raise_where_they_are_used(use, name):
    with pytest.raises(KernelDefinitionError, match=f"TileLang feature T.{name} is not "
                       "supported by tiled: ") as info:
        use()
    assert info.value.file == __file__ and info.value.line


def test_inside_a_kernel_the_error_points_at_the_authors_line():
    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            tx = T.get_thread_binding()  # here
            A[tx] = 0.0

    with pytest.raises(KernelDefinitionError, match=r"T\.Parallel loop") as info:
        _ = k.ir
    assert info.value.source_line.rstrip().endswith("# here")


def test_an_unsupported_dtype_fails_where_it_is_allocated():
    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            packed = T.alloc_fragment([64], T.float4_e2m1fn)  # fp4
            T.copy(A[0:64], packed)

    with pytest.raises(KernelDefinitionError, match=r"T\.float4_e2m1fn is not supported by tiled: "
                       "the Tile IR has no such dtype") as info:
        _ = k.ir
    assert info.value.source_line.rstrip().endswith("# fp4")


def test_a_mention_in_an_untaken_branch_still_traces():
    use_sync = False

    @T.prim_func
    def k(A: T.Tensor([64], T.float32)):
        with T.Kernel(1, threads=64):
            sync = T.sync_threads  # only a name: nothing is used
            if use_sync:
                sync()
            for i in T.Parallel(64):
                A[i] = 1.0

    assert k.ir.proto.kernel.HasField("body")


def test_every_reason_says_what_to_do():
    for name, why in UNSUPPORTED.items():
        assert not hasattr(tiled.lang, "__all__") or name not in tiled.lang.__all__, name
        assert len(why) > 20 and not why.endswith("."), name


def test_unknown_names_are_attribute_errors_with_suggestions():
    with pytest.raises(AttributeError, match=r"has no attribute 'alloc_shard'; did you mean "
                                             r"T.alloc_shared"):
        _ = T.alloc_shard
    assert not hasattr(T, "definitely_not_a_feature")
    with pytest.raises(ImportError):
        from tiled.lang import definitely_not_a_feature  # noqa: F401


def test_a_traced_while_is_refused_with_what_to_write():
    @T.prim_func
    def k(A: T.Tensor([64], T.int32)):
        with T.Kernel(1, threads=64) as bx:
            while bx < 4:  # loop
                A[bx] = 1

    with pytest.raises(KernelDefinitionError, match=r"TileLang feature `while` on a traced "
                       r"condition is not supported by tiled: .*T\.serial") as info:
        _ = k.ir
    assert info.value.source_line.rstrip().endswith("# loop")
