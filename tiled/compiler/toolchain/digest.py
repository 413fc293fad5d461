"""The toolchain digest: everything besides the program, target and options that decides the
bytes of an artifact. It is part of every action key (tiled.cache.keys), so a new tiled, TVM,
compiler file, nvcc, ptxas, NVRTC, header or C compiler orphans the old entries instead of
serving kernels built by another toolchain.

The record (see `toolchain_record`) holds versions and content hashes, never paths alone or
mtimes alone. The TVM libraries (hundreds of MB) are hashed once per machine: their digests are
remembered in `<cache_dir>/toolchain/libraries.json` per (path, size, mtime_ns). Everything is
memoized per process, since a running process keeps the toolchain it started with; tests call
`clear_memo()`. Thread-safe (two racing first calls compute the same value).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tiled import config

log = logging.getLogger("tiled.cache")

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding tiled/
SOURCE_SUFFIXES = (".py", ".h", ".c")
# Besides tiled/compiler: the files that decide what a program means (its digest, and which
# programs verify). intervals / ops / dtypes are the verifier's own helpers.
IR_FILES = ("tiled/ir/canonical.py", "tiled/ir/verifier.py", "tiled/ir/verify_access.py",
            "tiled/ir/verify_arith.py", "tiled/ir/verify_base.py", "tiled/ir/verify_exprs.py",
            "tiled/ir/verify_guards.py", "tiled/ir/verify_limits.py",
            "tiled/ir/verify_params.py", "tiled/ir/verify_tiles.py", "tiled/ir/verify_ws.py",
            "tiled/ir/intervals.py", "tiled/ir/ops.py", "tiled/ir/dtypes.py")
CUDA_TOOLKIT_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp",
                        "cuda_fp8.h", "cuda_fp8.hpp")

_memo: dict[tuple, tuple[dict[str, Any], str]] = {}


def clear_memo() -> None:
    """Forgets every memoized record (tests; a process whose toolchain was replaced)."""
    _memo.clear()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def source_tree_digest(root: Path | None = None) -> str:
    """sha256 over every *.py / *.h / *.c under `root`/tiled/compiler plus IR_FILES, in order
    of relative path, each as path NUL size NUL bytes: editing, adding, removing or renaming
    any of them changes it. `root` (the directory holding tiled/) defaults to this install."""
    root = Path(root) if root is not None else PACKAGE_ROOT
    files = [p for p in (root / "tiled" / "compiler").rglob("*")
             if p.suffix in SOURCE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    files += [root / f for f in IR_FILES if (root / f).is_file()]
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in set(files)):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def tvm_libraries() -> list[Path]:
    """Every lib*.so* in the installed `tvm` package's lib/ folder (what `import tvm` loads),
    found without importing tvm: a process that only computes keys (the daemon's front end)
    never maps TVM's 250 MB."""
    import importlib.util

    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        return []
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return sorted({p.resolve() for p in lib.glob("lib*.so*")})


def _memo_file() -> Path:
    return Path(config.get("cache_dir")) / "toolchain" / "libraries.json"


def library_digests(paths: list[Path], memo_file: Path | None = None) -> dict[str, str]:
    """{file name: sha256 of its bytes}. A digest is reused from `memo_file` (default
    <cache_dir>/toolchain/libraries.json) while the file's (path, size, mtime_ns) is unchanged,
    so each library is read once per machine. An unreadable or broken memo file means
    rehashing; failing to write it is logged, never raised."""
    memo_file = memo_file or _memo_file()
    try:
        memo = json.loads(memo_file.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    out, changed = {}, False
    for path in paths:
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        known = memo.get(str(path))
        if isinstance(known, dict) and known.get("stamp") == stamp and \
                isinstance(known.get("sha256"), str):
            digest = known["sha256"]
        else:
            digest = _sha256_file(path)
            memo[str(path)] = {"stamp": stamp, "sha256": digest}
            changed = True
        out[path.name] = digest
    if changed:
        _write_memo(memo_file, memo)
    return out


def _write_memo(memo_file: Path, memo: dict) -> None:
    """Atomic replace: a racing process's file is as good as ours (both hold true digests)."""
    tmp = None
    try:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".libraries-", dir=memo_file.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f, sort_keys=True, indent=0)
        os.replace(tmp, memo_file)
        tmp = None
    except OSError as e:
        log.warning("cannot remember TVM library digests in %s: %s", memo_file, e)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def _tool_version(exe: str) -> str:
    """The last line of `<exe> --version`, "none" when it cannot run."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    return out.splitlines()[-1] if out else "unknown"


def _cuda_home() -> Path | None:
    """The CUDA toolkit nvcc belongs to, found as tiled.compiler.toolchain.nvcc finds headers:
    next to the (resolved) nvcc, else /usr/local/cuda."""
    nvcc = shutil.which(config.get("nvcc"))
    homes = [Path(nvcc).resolve().parent.parent] if nvcc else []
    homes.append(Path("/usr/local/cuda"))
    return next((h for h in homes if (h / "include" / "cuda_fp16.h").is_file()), None)


def _headers_digest(root: Path) -> str:
    inc = root / "tiled" / "compiler" / "targets" / "cuda" / "include"
    files = {f"tiled/{p.name}": p for p in inc.glob("*.h")}
    home = _cuda_home()
    for name in CUDA_TOOLKIT_HEADERS if home else ():
        p = home / "include" / name  # type: ignore[operator]
        if p.is_file():
            files[f"cuda/{name}"] = p
    h = hashlib.sha256()
    for name, path in sorted(files.items()):
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return "none"
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}" if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else "unknown"


def _backend_record(backend: str, compiler: str | None, root: Path) -> dict[str, Any]:
    if backend == "cuda":
        from tiled.compiler.toolchain import nvcc as nv

        # nvcc runs the ptxas of its own bin/ folder; a wrapper script's folder is second best.
        nvcc_path = shutil.which(config.get("nvcc"))
        beside = [Path(nvcc_path).resolve().parent, Path(nvcc_path).parent] if nvcc_path else []
        ptxas = next((str(d / "ptxas") for d in beside if (d / "ptxas").is_file()), "ptxas")
        return {"compiler": compiler,
                "nvcc": nv.nvcc_version(),
                "ptxas": _tool_version(ptxas),
                "nvrtc": _nvrtc_version() if compiler == "nvrtc" else None,
                "headers": _headers_digest(root)}
    if backend == "cpu":
        from tiled.compiler.toolchain import hip
        from tiled.compiler.toolchain.cc import cc_version, shim_digest

        # clang compiles the IR of levels that convert to bfloat16 by instruction, and its
        # absence makes them round in integers (targets/cpu/native_bf16.py).
        return {"cc": cc_version(), "shim": shim_digest(), "machine": platform.machine(),
                "clang": hip.optional_tool_version("clang")}
    if backend == "rocm":
        from tiled.compiler.toolchain import hip

        return {"clang": hip.tool_version("clang"), "lld": hip.tool_version("lld"),
                "llvm_objcopy": hip.tool_version("llvm_objcopy"),
                "headers": hip.headers_digest()}
    if backend == "metal":
        from tiled.compiler.toolchain import hip, msl

        # clang type-checks every kernel (and builds its emulation); no Metal compiler here.
        return {"clang": hip.tool_version("clang"), "headers": msl.headers_digest()}
    return {}  # a backend without an external toolchain (yet)


def _memo_key(target: Any, cuda_compiler: str | None, compiler_root: Path | None) -> tuple:
    backend = target.partition(":")[0] if isinstance(target, str) else target.backend
    compiler = None
    if backend == "cuda":
        from tiled.compiler.toolchain.nvcc import which_compiler

        compiler = which_compiler(cuda_compiler)
    root = Path(compiler_root) if compiler_root is not None else PACKAGE_ROOT
    # The configured tools are part of the key: a scoped override names another toolchain.
    return (backend, compiler, root, config.get("nvcc"), config.get("cc"),
            config.get("clang"), config.get("lld"))


def _memoized(target: Any, cuda_compiler: str | None,
              compiler_root: Path | None) -> tuple[dict[str, Any], str]:
    key = _memo_key(target, cuda_compiler, compiler_root)
    hit = _memo.get(key)
    if hit is None:
        import tiled

        backend, compiler, root = key[:3]
        record = {"tiled": tiled.__version__, "sources": source_tree_digest(root),
                  "tvm": _dist_version("apache-tvm"), "tvm_ffi": _dist_version("apache-tvm-ffi"),
                  "tvm_libraries": library_digests(tvm_libraries()), "backend": backend,
                  **_backend_record(backend, compiler, root)}
        text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        hit = _memo[key] = (record, hashlib.sha256(text.encode()).hexdigest())
    return hit


def toolchain_record(target: Any, cuda_compiler: str | None = None,
                     compiler_root: Path | None = None) -> dict[str, Any]:
    """The toolchain record for `target` ("cpu", "cuda:sm_90a" or a Target):

        {"tiled": __version__, "sources": <source_tree_digest>, "tvm": <apache-tvm version>,
         "tvm_ffi": <apache-tvm-ffi version>, "tvm_libraries": {name: sha256},
         "backend": <name>, <backend fields>}

    cuda adds compiler (nvcc | nvrtc, as `cuda_compiler` or TILED_CUDA_COMPILER resolve),
    nvcc and ptxas version lines, nvrtc (its version when compiling with NVRTC, else None) and
    headers (a hash of tiled_cuda.h and the toolkit's cuda_fp16 / cuda_bf16 headers); cpu adds
    cc (the C compiler's version), shim (its digest), machine (the host arch) and clang (its
    version line, None when absent: native_bf16); rocm adds
    the version lines of clang, ld.lld and llvm-objcopy (TILED_CLANG, TILED_LLD,
    TILED_LLVM_OBJCOPY) and headers (a hash of tiled's ROCm device headers, toolchain.hip);
    metal adds clang's version line (its type check) and headers (a hash of tiled_metal.h and
    the CPU <metal_stdlib>, toolchain.msl).
    `compiler_root` (tests) is a copy of the directory holding tiled/ whose sources are hashed
    instead of this install's. The cache namespace is not here: it salts the action key.
    Memoized per process: returns a copy. Raises ToolchainError when a required tool (the C
    compiler for cpu) is missing."""
    return dict(_memoized(target, cuda_compiler, compiler_root)[0])


def toolchain_digest(target: Any, cuda_compiler: str | None = None,
                     compiler_root: Path | None = None) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no whitespace) of toolchain_record with
    the same arguments. Memoized per process: microseconds after the first call."""
    return _memoized(target, cuda_compiler, compiler_root)[1]


__all__ = ["clear_memo", "library_digests", "source_tree_digest", "toolchain_digest",
           "toolchain_record", "tvm_libraries"]
