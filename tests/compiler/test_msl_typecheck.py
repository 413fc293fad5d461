"""tiled's type check of MSL on Linux (toolchain/msl.py): clang over tiled's CPU
<metal_stdlib>, with Metal's address spaces as clang's, accepts MSL and rejects the mistakes
a Metal compiler rejects: a pointer into one address space used as another, `double`, a
function MSL lacks."""

from __future__ import annotations

import pytest

from tiled.compiler.toolchain.msl import cpu_text, type_check
from tiled.errors import CompileError

KERNEL = """#include <metal_stdlib>
using namespace metal;

kernel void k(device float* X [[ buffer(0) ]], device half* Y [[ buffer(1) ]],
              uint tid [[thread_position_in_threadgroup]]) {
  threadgroup float t[64];
  t[tid] = X[tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float4 v = float4(t[tid], 1.0f, exp(t[63 - tid]), simd_sum(t[tid]));
  *(device half4*)(Y + 4 * tid) = ((half4)v);
  %s
}
"""


def test_msl_passes():
    type_check(KERNEL % "", "ok")


@pytest.mark.parametrize(("line", "error"), [
    ("device float* p = t;", r"cannot initialize .*'device float \*' .*address_space\(3\)"),
    ("threadgroup float* q = X;", r"cannot initialize .*'threadgroup float \*'"),
    ("double d = X[0];", "tiled_msl_has_no_double"),
    ("float e = erfcinv(X[0]);", "erfcinv"),
    ("X[0] = simd_sum(t);", "simd_sum"),
])
def test_mistakes_are_compile_errors(line, error):
    with pytest.raises(CompileError, match=error) as e:
        type_check(KERNEL % line, "bad")
    assert "kernel.metal:11:" in str(e.value)  # the line in the MSL as shipped


def test_cpu_text_changes_only_threadgroup_arrays_and_vector_casts():
    text = cpu_text(KERNEL % "")
    assert "  TILED_THREADGROUP_ARRAY(float, t, 64);" in text
    assert "(::tiled_cpu::make<half4>(v))" in text
    assert text.count("\n") == (KERNEL % "").count("\n")
    assert cpu_text("((float4)((half4)(x)) + y)") == \
        "(::tiled_cpu::make<float4>((::tiled_cpu::make<half4>((x))) + y))"
