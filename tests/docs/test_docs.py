"""The project's docs (README.md, docs/*.md) as tests: every python and bash block runs, as the
mark before it says (tests/docs/blocks.py); the DSL reference covers every public `T.*` name
with a runnable example; links and repository paths in the docs point at files of this repo.

Python blocks run in this process (TVM is imported once, which keeps the whole file within a
few minutes on two cores), each in a fresh namespace, a fresh working directory and a fresh
TILED_CACHE_DIR (tests/conftest.py), from a file of their own so that tracing can read their
source. Bash blocks run in a fresh shell with the venv's `tiled` first on PATH, in a fresh
directory where `examples/` is the repo's."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import tiled.lang as T
from tests.daemon_util import running_daemon
from tests.docs.blocks import ROOT, Block, all_blocks, blocks_of, markdown_files
from tiled import config

PYTHON_BLOCKS = all_blocks("python")
BASH_BLOCKS = all_blocks("bash")
DSL = ROOT / "docs" / "dsl.md"
LINKED_DIRS = ("examples",)  # what a bash block may name relative to its working directory

_namespaces: dict[Path, dict] = {}  # per file: what its last python block left (continues)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, library_memo):
    """One real `tiled serve` for the blocks marked daemon; started on first use."""
    with running_daemon(tmp_path_factory.mktemp("docs-daemon"), library_memo, workers=1) as d:
        yield d


def _daemon_address(block: Block, request, monkeypatch) -> str:
    if "daemon" not in block.flags:
        return ""
    address = request.getfixturevalue("daemon")["address"]
    monkeypatch.setenv("TILED_SERVER", address)
    return address


def _cuda_kernels(namespace: dict) -> list:
    return [v for v in namespace.values()
            if getattr(getattr(v, "manifest", None), "backend", None) == "cuda"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_python_block(block: Block, request, tmp_path, monkeypatch):
    if block.skip:
        pytest.skip(block.skip)
    address = _daemon_address(block, request, monkeypatch)
    if "continues" in block.flags:
        namespace = _namespaces.get(block.path)
        assert namespace is not None, (
            f"{block.id} continues the previous python block of {block.path.name}, which did "
            "not run (run the whole file)")
    else:
        namespace = {"__name__": "__doc_block__"}
    _namespaces.pop(block.path, None)
    source = tmp_path / f"{block.path.stem}_{block.line}.py"
    source.write_text(block.code)
    namespace["__file__"] = str(source)
    monkeypatch.chdir(tmp_path)
    with config.override(server=address):
        exec(compile(block.code, str(source), "exec"), namespace)
    _namespaces[block.path] = namespace
    if "compile-only" in block.flags:
        assert _cuda_kernels(namespace), (
            f"{block.id} is marked compile-only but left no compiled cuda kernel")


@pytest.mark.parametrize("block", BASH_BLOCKS, ids=lambda b: b.id)
def test_bash_block(block: Block, request, tmp_path, monkeypatch, fresh_cache_dir):
    if block.skip:
        pytest.skip(block.skip)
    for name in LINKED_DIRS:
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "TILED_CACHE_DIR": str(fresh_cache_dir)}
    address = _daemon_address(block, request, monkeypatch)
    if address:
        env["TILED_SERVER"] = address
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{block.id} exited {r.returncode}\n{r.stdout}\n{r.stderr}"


def test_marks_parse_and_skips_say_why(capsys):
    """Every mark parses (blocks_of raises otherwise) and marks a python or bash block; a
    skipped block names its reason. Prints the count of each kind of block."""
    counts: dict[str, int] = {}
    for path in markdown_files():
        for b in blocks_of(path):
            if b.language not in ("python", "bash"):
                continue
            kind = "skipped" if b.skip else ("compile-only" if "compile-only" in b.flags
                                             else "run")
            counts[f"{b.language} {kind}"] = counts.get(f"{b.language} {kind}", 0) + 1
            if b.skip:
                assert len(b.skip.split()) >= 3, f"{b.id}: say why it is skipped: {b.skip!r}"
    with capsys.disabled():
        print("\ndoc blocks:", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    assert counts.get("python run", 0) > 0


def _public_names() -> set[str]:
    public = set(T.__all__)
    public |= {n for n in dir(T) if not n.startswith("_")
               and not isinstance(getattr(T, n), types.ModuleType)}
    return public


def _reference_rows() -> dict[str, str]:
    """{name: first cell} of the reference tables of docs/dsl.md: rows `| `T.name...` | ...`."""
    rows: dict[str, str] = {}
    for cell, name in re.findall(r"^\| `(T\.(\w+)[^`]*)` \|", DSL.read_text(), re.M):
        assert name not in rows, f"docs/dsl.md documents T.{name} twice"
        rows[name] = cell
    return rows


def test_dsl_reference_covers_every_public_name():
    rows = _reference_rows()
    public = _public_names()
    assert not public - set(rows), f"docs/dsl.md lacks rows for {sorted(public - set(rows))}"
    assert not set(rows) - public, f"docs/dsl.md documents non-public {sorted(set(rows) - public)}"


def test_dsl_signatures_match_the_code():
    """A row's parameters are the callable's, in its order, and include every required one."""
    for name, cell in _reference_rows().items():
        obj = getattr(T, name)
        m = re.fullmatch(rf"T\.{name}\((.*)\)", cell)
        if m is None or not callable(obj):
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        written = [p.split("=")[0].strip().lstrip("*") for p in m.group(1).split(",") if p.strip()]
        actual = [p.name for p in sig.parameters.values()]
        assert all(w in actual for w in written), f"T.{name}: {written} vs {actual}"
        assert written == sorted(written, key=actual.index), f"T.{name}: order of {written}"
        required = [p.name for p in sig.parameters.values() if p.default is p.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert set(required) <= set(written), f"T.{name}: {cell} omits {required}"


def test_every_public_name_has_a_runnable_example():
    runnable = "".join(b.code for b in blocks_of(DSL) if b.language == "python" and not b.skip)
    missing = sorted(n for n in _public_names() if not re.search(rf"\bT\.{n}\b", runnable))
    assert not missing, f"no runnable block of docs/dsl.md uses {missing}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(r"`((?:benchmarks|clients|deploy|docs|examples|integrations|proto|"
                        r"scripts|tests|tiled)/[\w./-]*[\w/])`")
_RESULTS_FILE = re.compile(r"`([\w.-]+_h200[\w.-]*\.json)`")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_links_stay_inside_the_repo(path: Path):
    """Docs point at files of this repo only: relative links that exist, no URLs, nothing of
    the workspace around it (../shared, /work)."""
    text = path.read_text()
    for bad in ("../shared", "/work/", "ARCHITECTURE.md", "STYLE.md"):
        assert bad not in text, f"{path.name} mentions {bad}, which is not in the repo"
    for target in _LINK.findall(text):
        assert not re.match(r"[a-z]+://", target), f"{path.name} links outside the repo: {target}"
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        assert resolved.is_relative_to(ROOT) and resolved.exists(), (
            f"{path.name} links to {target}, which is not a file of the repo")
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{path.name} links to {target}: no such heading"


def _anchors(path: Path) -> set[str]:
    """The anchors a markdown renderer gives `path`'s headings (GitHub's rule: lower case,
    punctuation other than - and _ dropped, spaces as -)."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_named_files_exist(path: Path):
    """A repository path in backticks (`benchmarks/results/x.json`, `tiled/server/status.py`)
    and a results file named alone (`tl_attention_h200.json`) exist."""
    text = path.read_text()
    missing = [name for name in _REPO_PATH.findall(text)
               if not any(c in name for c in "*<>") and not (ROOT / name).exists()]
    missing += [name for name in _RESULTS_FILE.findall(text)
                if not (ROOT / "benchmarks" / "results" / name).exists()]
    assert not missing, f"{path.name} names files the repo lacks: {missing}"


def test_every_public_name_has_an_example_in_its_docstring():
    """STYLE.md: each public `T.*` has a short example in its docstring (a `>>>` line, or a
    backticked snippet that uses it)."""
    bare = []
    for name in sorted(_public_names()):
        doc = inspect.getdoc(getattr(T, name)) or ""
        if ">>>" not in doc and not re.search(rf"`[^`]*\bT\.{name}\b[^`]*`", doc):
            bare.append(name)
    assert not bare, f"T.* without an example in the docstring: {bare}"
