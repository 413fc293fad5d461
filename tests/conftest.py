"""Every test gets a fresh cache directory and config scope (STYLE.md: tests never share state
through ~/.cache/tiled). Subprocesses inherit it through TILED_CACHE_DIR.

The one thing shared is the memo of TVM library hashes (path, size, mtime -> sha256), which is
a pure function of files outside the cache; hashing the 250 MB compiler library again in every
test's fresh directory would only cost time."""

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


@pytest.fixture(autouse=True)
def fresh_cache_dir(tmp_path_factory, monkeypatch, library_memo):
    root = tmp_path_factory.mktemp("tiled-cache")
    if library_memo is not None:
        root.joinpath(MEMO[0]).mkdir()
        shutil.copy(library_memo, root.joinpath(*MEMO))
    monkeypatch.setenv("TILED_CACHE_DIR", str(root))
    with config.override(cache_dir=root):
        yield root
