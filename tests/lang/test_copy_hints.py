"""TileLang's T.copy hints (coalesced_width=, disable_tma=, eviction_policy=): accepted,
checked, and dropped, so the traced program is the same as without them."""

import pytest

import tiled
import tiled.lang as T
from tiled.errors import KernelDefinitionError


def _kernel(**hints):
    @tiled.kernel
    def copy(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((64, 64), "float16")
            T.copy(A[0, 0], a, **hints)
            T.copy(a, B[0, 0], **hints)
    return copy


def test_hints_leave_the_program_as_it_was():
    plain = _kernel().ir.digest
    for hints in ({"disable_tma": True}, {"coalesced_width": 8},
                  {"eviction_policy": "evict_first"},
                  {"coalesced_width": 4, "disable_tma": False, "eviction_policy": None}):
        assert _kernel(**hints).ir.digest == plain


@pytest.mark.parametrize(("hints", "message"), [
    ({"disable_tma": 1}, "disable_tma must be True or False"),
    ({"coalesced_width": 0}, "coalesced_width must be a positive int"),
    ({"eviction_policy": "evict_sometimes"}, "eviction_policy must be one of"),
])
def test_bad_hints_fail_where_written(hints, message):
    with pytest.raises(KernelDefinitionError, match=message):
        _ = _kernel(**hints).ir
