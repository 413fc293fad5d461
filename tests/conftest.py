"""Every test gets a fresh cache directory and config scope (STYLE.md: tests never share state
through ~/.cache/tiled). Subprocesses inherit it through TILED_CACHE_DIR.

Two things are shared, both pure functions of files outside the cache: the memo of TVM library
hashes (path, size, mtime -> sha256), since hashing the 250 MB compiler library again in every
test's fresh directory would only cost time, and the CPU shim's objects for this host's level
(content-addressed by sources, compiler and flags), since compiling them again for every test
that compiles a CPU kernel would too."""

import shutil

import pytest

from tiled import config

MEMO = ("toolchain", "libraries.json")


@pytest.fixture(scope="session")
def library_memo(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiled-toolchain-memo")
    try:
        from tiled.compiler.registry import parse_target
        from tiled.compiler.toolchain.digest import clear_memo, toolchain_digest
    except ImportError:  # no compiler installed: nothing to memoize
        return None
    with config.override(cache_dir=root):
        toolchain_digest(parse_target("cpu"))
        clear_memo()
    memo = root.joinpath(*MEMO)
    return memo if memo.exists() else None


@pytest.fixture(scope="session")
def shim_objects(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiled-shim")
    try:
        from tiled.compiler.targets.cpu.levels import codegen_of, resolve_level
        from tiled.compiler.toolchain.cc import shim_objects
        from tiled.errors import ToolchainError
    except ImportError:  # no compiler installed
        return None
    try:
        with config.override(cache_dir=root):
            shim_objects(codegen_of(resolve_level(None)).cflags)
    except ToolchainError:  # no C compiler: the tests that need one say so themselves
        return None
    return root / "shim"


@pytest.fixture(autouse=True)
def fresh_cache_dir(tmp_path_factory, monkeypatch, library_memo, shim_objects):
    root = tmp_path_factory.mktemp("tiled-cache")
    if library_memo is not None:
        root.joinpath(MEMO[0]).mkdir()
        shutil.copy(library_memo, root.joinpath(*MEMO))
    if shim_objects is not None:
        shutil.copytree(shim_objects, root / "shim")
    monkeypatch.setenv("TILED_CACHE_DIR", str(root))
    with config.override(cache_dir=root):
        yield root
