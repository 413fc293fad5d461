"""The toolchain digest: stable within and across processes, changed by any compiler file, tool
version or header, and cheap after the first call (the TVM libraries are hashed once)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiled import config
from tiled.compiler.toolchain import cc, digest
from tiled.compiler.toolchain import nvcc as nv
from tiled.compiler.toolchain.digest import (
    library_digests,
    source_tree_digest,
    toolchain_digest,
    toolchain_record,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def _fresh(tmp_path):
    digest.clear_memo()
    with config.override(cache_dir=tmp_path / "cache"):
        yield
    digest.clear_memo()


@pytest.fixture
def fake_tvm(tmp_path, monkeypatch):
    """Small stand-ins for the TVM libraries (the real ones are 260 MB), and a count of the
    files hashed."""
    lib = tmp_path / "lib" / "libtvm_compiler.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF fake compiler" * 1000)
    monkeypatch.setattr(digest, "tvm_libraries", lambda: [lib])
    hashed = []
    real = digest._sha256_file
    monkeypatch.setattr(digest, "_sha256_file", lambda p: hashed.append(p) or real(p))
    return lib, hashed


def copy_tree(dst: Path) -> Path:
    """A copy of the files the source digest reads, laid out as under ROOT."""
    shutil.copytree(ROOT / "tiled" / "compiler", dst / "tiled" / "compiler",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in digest.IR_FILES:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst / f)
    return dst


def test_every_verifier_module_is_in_the_source_digest():
    """A rule moved into a new tiled/ir/verify_*.py module must still key the cache."""
    verifier = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tiled" / "ir").glob("verif*.py")}
    assert verifier <= set(digest.IR_FILES), verifier - set(digest.IR_FILES)


def test_records_name_the_toolchain(fake_tvm):
    cpu = toolchain_record("cpu")
    assert cpu["backend"] == "cpu" and cpu["cc"] == cc.cc_version()
    assert cpu["shim"] == cc.shim_digest() and cpu["machine"]
    assert cpu["tvm"] and cpu["tvm_ffi"] and cpu["tiled"]
    assert list(cpu["tvm_libraries"]) == ["libtvm_compiler.so"]
    cuda = toolchain_record("cuda:sm_90a", cuda_compiler="nvcc")
    assert cuda["compiler"] == "nvcc" and cuda["nvcc"] == nv.nvcc_version()
    assert cuda["nvrtc"] is None and {"ptxas", "headers"} <= set(cuda)
    assert "namespace" not in cpu and "namespace" not in cuda
    for t, rec in (("cpu", cpu), ("cuda:sm_90a", cuda)):
        text = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
        assert toolchain_digest(t, cuda_compiler="nvcc") == hashlib.sha256(text).hexdigest()
    assert toolchain_digest("cpu") != toolchain_digest("cuda:sm_90a", cuda_compiler="nvcc")


def test_real_tvm_libraries_are_found():
    names = {p.name for p in digest.tvm_libraries()}
    assert "libtvm_compiler.so" in names or "libtvm_runtime.so" in names


def test_stable_and_memoized(fake_tvm, monkeypatch):
    first = toolchain_digest("cpu")
    record = toolchain_record("cpu")
    record["tiled"] = "mutated"  # a copy: the memo is not the caller's to edit

    def no_more(*a, **k):
        raise AssertionError("the toolchain was inspected again")

    monkeypatch.setattr(subprocess, "run", no_more)
    monkeypatch.setattr(digest, "source_tree_digest", no_more)
    monkeypatch.setattr(digest, "library_digests", no_more)
    assert toolchain_digest("cpu") == first
    assert toolchain_record("cpu")["tiled"] != "mutated"


def test_stable_across_processes(tmp_path):
    ours = {t: toolchain_digest(t) for t in ("cpu", "cuda:sm_90a")}
    code = ("from tiled.compiler.toolchain.digest import toolchain_digest as d; "
            "print(d('cpu'), d('cuda:sm_90a'))")
    env = {**os.environ, "TILED_CACHE_DIR": str(tmp_path / "cache")}  # shares the memo file
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=env, check=True).stdout.split()
    assert out == [ours["cpu"], ours["cuda:sm_90a"]]


def test_source_digest_follows_every_compiler_file(tmp_path, fake_tvm):
    tree = copy_tree(tmp_path / "copy")
    real = source_tree_digest()
    assert source_tree_digest(tree) == real  # content and relative paths, not location
    assert toolchain_digest("cpu", compiler_root=tree) == toolchain_digest("cpu")
    seen = {real}

    def changed():
        d = source_tree_digest(tree)
        assert d not in seen
        seen.add(d)

    backend = tree / "tiled" / "compiler" / "targets" / "cpu" / "backend.py"
    backend.write_text(backend.read_text() + "\n# a comment is an edit too\n")
    changed()
    header = tree / "tiled" / "compiler" / "targets" / "cuda" / "include" / "tiled_cuda.h"
    header.write_bytes(header.read_bytes().replace(b"\n", b"\r\n", 1))
    changed()
    (tree / "tiled" / "compiler" / "targets" / "cpu" / "new_shim.c").write_text("int x;\n")
    changed()
    (tree / "tiled" / "compiler" / "registry.py").rename(tree / "tiled" / "compiler" / "reg.py")
    changed()
    (tree / "tiled" / "ir" / "verifier.py").write_text("# stricter\n")
    changed()
    # Files that cannot change an artifact do not count.
    (tree / "tiled" / "compiler" / "NOTES.txt").write_text("notes")
    (tree / "tiled" / "compiler" / "__pycache__").mkdir()
    (tree / "tiled" / "compiler" / "__pycache__" / "x.py").write_text("stale")
    assert source_tree_digest(tree) in seen
    digest.clear_memo()  # a process keeps the toolchain it started with; a new one sees edits
    assert toolchain_digest("cpu", compiler_root=tree) != toolchain_digest("cpu")
    assert toolchain_digest("cuda:sm_90a", compiler_root=tree) != toolchain_digest("cuda:sm_90a")


def test_tool_versions_change_it(fake_tvm, monkeypatch):
    cuda, cpu = toolchain_digest("cuda:sm_90a", "nvcc"), toolchain_digest("cpu")
    digest.clear_memo()
    monkeypatch.setattr(nv, "nvcc_version", lambda: "Cuda compilation tools, release 99.9")
    assert toolchain_digest("cuda:sm_90a", "nvcc") != cuda
    assert toolchain_digest("cpu") == cpu
    digest.clear_memo()
    monkeypatch.setattr(digest, "_tool_version", lambda exe: "ptxas 99")
    assert toolchain_record("cuda:sm_90a", "nvcc")["ptxas"] == "ptxas 99"
    digest.clear_memo()
    monkeypatch.setattr(cc, "cc_version", lambda: "cc 99")
    assert toolchain_digest("cpu") != cpu


def test_compiler_choice_and_headers_change_it(fake_tvm, monkeypatch, tmp_path):
    nvcc_digest = toolchain_digest("cuda:sm_90a", cuda_compiler="nvcc")
    rec = toolchain_record("cuda:sm_90a", cuda_compiler="nvrtc")
    assert rec["compiler"] == "nvrtc" and rec["nvrtc"]  # a version, or "none" without NVRTC
    assert toolchain_digest("cuda:sm_90a", cuda_compiler="nvrtc") != nvcc_digest
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda_fp16.h").write_text("// fp16 v1\n")
    monkeypatch.setattr(digest, "_cuda_home", lambda: home)
    digest.clear_memo()
    v1 = toolchain_digest("cuda:sm_90a", cuda_compiler="nvcc")
    (home / "include" / "cuda_bf16.h").write_text("// bf16\n")
    digest.clear_memo()
    assert toolchain_digest("cuda:sm_90a", cuda_compiler="nvcc") not in (v1, nvcc_digest)


def test_namespace_is_not_part_of_it(fake_tvm):
    before = toolchain_digest("cpu")
    digest.clear_memo()
    with config.override(cache_namespace="disown-everything"):
        assert toolchain_digest("cpu") == before


def test_tvm_libraries_hashed_once_per_machine(fake_tvm, tmp_path):
    lib, hashed = fake_tvm
    first = toolchain_digest("cpu")
    assert hashed == [lib]
    memo = tmp_path / "cache" / "toolchain" / "libraries.json"
    entry = json.loads(memo.read_text())[str(lib)]
    assert entry["sha256"] == toolchain_record("cpu")["tvm_libraries"]["libtvm_compiler.so"]
    digest.clear_memo()  # as a new process would: the memo file serves the digest
    assert toolchain_digest("cpu") == first and hashed == [lib]
    lib.write_bytes(b"\x7fELF another build")  # size and mtime change: hashed again
    digest.clear_memo()
    assert toolchain_digest("cpu") != first and hashed == [lib, lib]


def test_library_memo_file_problems_are_not_errors(tmp_path, caplog):
    lib = tmp_path / "libtvm.so"
    lib.write_bytes(b"bytes")
    memo = tmp_path / "memo.json"
    memo.write_text("{ not json")
    want = library_digests([lib], memo)
    assert json.loads(memo.read_text())[str(lib)]["sha256"] == want["libtvm.so"]
    memo.write_text(json.dumps({str(lib): {"stamp": "garbage"}}))
    assert library_digests([lib], memo) == want
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the memo's folder should be
    assert library_digests([lib], blocked / "memo.json") == want
    assert "cannot remember" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "libtvm.so", "memo.json"]
