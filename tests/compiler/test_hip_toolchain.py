"""toolchain/hip.py: the ROCm toolchain (clang-22, ld.lld-22, llvm-objcopy-22) and its part of
the toolchain digest: the tool versions and tiled's device headers are in every rocm action
key, so a new clang, lld or header orphans the old entries; a missing tool is a clear error."""

import shutil

import pytest

from tiled import config
from tiled.compiler.toolchain import digest, hip
from tiled.compiler.toolchain.digest import toolchain_digest, toolchain_record
from tiled.errors import ToolchainError


@pytest.fixture(autouse=True)
def _fresh():
    digest.clear_memo()
    yield
    digest.clear_memo()


def test_the_record_names_clang_lld_and_the_headers():
    rec = toolchain_record("rocm:gfx942")
    assert rec["backend"] == "rocm"
    assert "clang version 22" in rec["clang"] and "LLD 22" in rec["lld"]
    assert "22" in rec["llvm_objcopy"]
    assert rec["headers"] == hip.headers_digest()
    assert toolchain_digest("rocm:gfx942") == toolchain_digest("rocm:gfx90a")


def test_a_new_clang_or_header_changes_the_digest(monkeypatch, tmp_path):
    before = toolchain_digest("rocm:gfx942")
    digest.clear_memo()
    real = hip.tool_version
    monkeypatch.setattr(hip, "tool_version",
                        lambda s: "clang version 99" if s == "clang" else real(s))
    assert toolchain_digest("rocm:gfx942") != before
    monkeypatch.setattr(hip, "tool_version", real)
    include = tmp_path / "include"
    shutil.copytree(hip.INCLUDE, include)
    monkeypatch.setattr(hip, "INCLUDE", include)
    digest.clear_memo()
    assert toolchain_digest("rocm:gfx942") == before
    (include / "tiled_hip.h").write_text((include / "tiled_hip.h").read_text() + "\n// x\n")
    digest.clear_memo()
    assert toolchain_digest("rocm:gfx942") != before


def test_a_missing_tool_is_named():
    with config.override(clang="clang-nowhere"), \
            pytest.raises(ToolchainError, match=r"'clang-nowhere' not found.*TILED_CLANG"):
        hip.compile_hsaco('#include "tiled_hip.h"\n', "gfx942")
