"""Every test gets a fresh cache directory and config scope (STYLE.md: tests never share state
through ~/.cache/tiled). Subprocesses inherit it through TILED_CACHE_DIR."""

import pytest

from tiled import config


@pytest.fixture(autouse=True)
def fresh_cache_dir(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("tiled-cache")
    monkeypatch.setenv("TILED_CACHE_DIR", str(root))
    with config.override(cache_dir=root):
        yield root
