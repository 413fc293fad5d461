"""float32 -> bfloat16 by the CPU's own instruction on levels that have one (AVX512-BF16's
vcvtneps2bf16: cpu:x86-64-v4+bf16), which TVM cannot emit: its LLVM codegen refuses bfloat16
casts, and the cpu lowering keeps bfloat16 values as their bits (tiled.compiler.bf16), rounding
them with 8 integer instructions per vector.

The lowering writes such a conversion as a call of MARKER; TVM builds the module's LLVM IR
without optimizing it (its `opt-level` 0); `define_marker` turns the marker's declaration into a
definition (an `fptrunc` to bfloat) and clang compiles the IR at -O3, inlining it into the
loops it then vectorizes, one instruction per 16 values. clang must be of TVM's LLVM major
version (22 for TVM 0.27: clang-22) to read its IR; another one counts as missing.

The instruction rounds to nearest even and quiets NaN as the integer rounding does, but treats
float32 subnormal inputs as zero: values below 2^-126 in magnitude become +-0 where the exact
rounding gives a bfloat16 subnormal (probed on a Zen 4). That is this level's documented
difference (docs/cpu.md); cpu:x86-64-v4 keeps the exact conversion. Where clang is missing the
level compiles with the integer rounding (the toolchain record says which: digest.py).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from tvm import tirx

from tiled.errors import ToolchainError

MARKER = "tiled_f32_to_bf16"
_DECLARATION = re.compile(r"^declare\b[^\n]*@" + MARKER + r"\(float[^\n]*$", re.MULTILINE)
_DEFINITION = f"""define internal i16 @{MARKER}(float %x) alwaysinline {{
  %b = fptrunc float %x to bfloat
  %i = bitcast bfloat %b to i16
  ret i16 %i
}}"""
# -force-vector-width=16: LLVM's cost model has no cost for a vector fptrunc to bfloat and
# picks 4 lanes for loops that hold one (tiled.ops' bf16 RMSNorm ran 0.89x its x86-64-v4
# build that way); 16 float32 lanes are the level's vector register.
VECTOR_FLAGS = ("-mllvm", "-force-vector-width=16")
CLANG_FLAGS = ("-x", "ir", "-c", "-O3", "-fPIC", "-Wno-override-module", *VECTOR_FLAGS)
# TVM's codegen lets the backend fuse any multiply and add into an FMA (AllowFPOpFusion=Fast);
# clang compiling IR does not take -ffp-contract, so the IR's own float multiplies, adds and
# subtracts carry LLVM's `contract` flag instead: the same fusions, the same float32 results.
_FP_OP = re.compile(r"= (fmul|fadd|fsub) (?!contract)")


def clang() -> str | None:
    """The clang (TILED_CLANG) that compiles the IR, or None when there is none or it is of
    another LLVM major version than TVM's (it would not read TVM's IR)."""
    from tvm.target import codegen

    from tiled.compiler.toolchain.hip import tool, tool_version

    try:
        path = tool("clang")
    except ToolchainError:
        return None
    major = re.search(r"version (\d+)\.", tool_version("clang"))
    return path if major and int(major.group(1)) == codegen.llvm_version_major() else None


def to_bits(value: tirx.PrimExpr) -> tirx.PrimExpr:
    """The bits (uint16) of float32 `value` rounded to bfloat16 by the instruction."""
    return tirx.call_pure_extern("uint16", MARKER, value)


ATTR = "tiled.native_bf16"  # set on a lowered module that converts through MARKER


def uses_marker(mod) -> bool:
    """Whether the lowered TIR module converts through MARKER (lower_cpu says so)."""
    return bool(mod.attrs is not None and mod.attrs.get(ATTR, False))


def define_marker(ll: str) -> str:
    """TVM's LLVM IR with the marker's declaration replaced by its definition (none when
    TVM's simplifications left no conversion), its float arithmetic marked contractible."""
    out, n = _DECLARATION.subn(_DEFINITION, _FP_OP.sub(r"= \1 contract ", ll), count=1)
    if n != 1 and f"@{MARKER}(" in ll:
        raise ToolchainError(f"native bfloat16: @{MARKER} is called but not declared as "
                             "expected in TVM's LLVM IR")
    return out


def compile_ir(ll: str, obj: Path, level_flags: tuple[str, ...], exe: str) -> None:
    """Compiles LLVM IR text `ll` to the object file `obj` with clang `exe` (clang()) at -O3."""
    with tempfile.TemporaryDirectory(prefix="tiled-cpu-ir-") as tmp:
        src = Path(tmp) / "kernel.ll"
        src.write_text(ll)
        run_clang([exe, *CLANG_FLAGS, *level_flags, str(src), "-o", str(obj)])


def run_clang(argv: list[str]) -> None:
    """Runs clang's command line `argv`; a ToolchainError with its output if it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolchainError(f"compiling the CPU kernel's IR failed (exit {proc.returncode}): "
                             f"{' '.join(argv)}\n{(proc.stdout + proc.stderr).strip()}")
