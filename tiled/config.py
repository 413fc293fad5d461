"""Every `TILED_*` setting, declared once: name, type, default, meaning.

Read a setting with `config.get("cache_dir")`; override it in a scope (tests) with
`with config.override(cache_dir=path): ...`. No other module reads os.environ for TILED_*.
A value that does not parse raises ConfigError naming the variable.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiled.errors import ConfigError


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G/T suffix (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def _autotune_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ("on", "cached", "off"):
        raise ValueError(f"expected on, cached or off, got {text!r}")
    return mode


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Callable[[], Any]
    doc: str

    @property
    def env(self) -> str:
        return "TILED_" + self.name.upper()


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiled"


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("cache_dir", Path, _default_cache_dir, "root of the local disk cache"),
    Setting("cuda_compiler", str, lambda: "auto",
            "CUDA C++ to cubin driver: 'nvcc', 'nvrtc' or 'auto' (nvcc when on PATH)"),
    Setting("nvcc", str, lambda: "nvcc", "the nvcc executable"),
    Setting("cc", str, lambda: "cc", "the C compiler used to link CPU kernels"),
    Setting("clang", str, lambda: "clang-22",
            "the clang (LLVM 22) that compiles ROCm kernels and their CPU emulation"),
    Setting("lld", str, lambda: "ld.lld-22", "the LLVM 22 ld.lld that links ROCm code objects"),
    Setting("llvm_objcopy", str, lambda: "llvm-objcopy-22",
            "the llvm-objcopy that stores a ROCm kernel's source in its code object"),
    Setting("llvm_objdump", str, lambda: "llvm-objdump-22",
            "the llvm-objdump that disassembles ROCm code objects (structural checks)"),
    Setting("cpu_threads", int, lambda: 0, "threads for CPU kernels; 0 = the CPUs usable"),
    Setting("cpu_spin_us", int, lambda: 200,
            "microseconds a CPU kernel's pool threads spin for the next launch (and the "
            "launching thread for the workers) before they sleep; 0 = sleep at once"),
    Setting("keep_sources", _bool, lambda: False, "keep generated sources next to artifacts"),
    Setting("server", str, lambda: "", "daemon address (unix:///path or host:port); empty: none"),
    Setting("socket", str, lambda: f"/tmp/tiled-{os.getuid()}/tiled.sock",
            "the Unix socket `tiled serve` listens on"),
    Setting("tls_ca", str, lambda: "",
            "TLS for a host:port daemon: a PEM file of the CA to trust, or 'system'; empty: "
            "plaintext (the Unix socket never uses TLS)"),
    Setting("token_file", str, lambda: "",
            "file holding the bearer token sent to a host:port daemon (needs TILED_TLS_CA)"),
    Setting("client_timeout_seconds", float, lambda: 600.0,
            "deadline of each call the client makes to the daemon (a compile included)"),
    Setting("client_retries", int, lambda: 5,
            "retries of a call the daemon answered UNAVAILABLE (backoff with jitter)"),
    Setting("client_backoff_seconds", float, lambda: 0.1,
            "first retry delay; doubles per retry, capped at 5 s, with jitter"),
    Setting("max_shared_bytes", _size, lambda: 227 * 1024,
            "shared memory a block may use (verifier limit)"),
    Setting("max_local_bytes", _size, lambda: 64 * 1024,
            "local memory a thread may use: its LOCAL buffers plus its share of the FRAGMENT "
            "ones (verifier limit)"),
    Setting("max_block_bytes", _size, lambda: 32 << 20,
            "memory a block's SHARED, FRAGMENT and LOCAL buffers may use together (verifier "
            "limit)"),
    Setting("cache_max_bytes", _size, lambda: 10 << 30, "local disk cache size cap"),
    Setting("cache_namespace", str, lambda: "",
            "salt mixed into every action key; change it to disown every cached entry at once"),
    Setting("memory_cache_bytes", _size, lambda: 256 << 20,
            "in-process LRU cache size cap; 0 turns the memory tier off"),
    Setting("redis_url", str, lambda: "",
            "shared Redis tier (redis://host:port/db, rediss://, unix://); empty: none"),
    Setting("redis_ttl_seconds", int, lambda: 7 * 24 * 3600,
            "expiry of Redis cache keys, refreshed on every hit; 0 = never expire"),
    Setting("redis_max_blob_bytes", _size, lambda: 16 << 20,
            "largest blob written to Redis; an entry with a larger blob stays local"),
    Setting("redis_timeout_seconds", float, lambda: 0.1,
            "Redis connect and read timeout; a slow or dead Redis is skipped, never waited on"),
    Setting("ops", str, lambda: "all",
            "the ops the serving plugins (integrations/) replace: 'all', 'none' or a comma "
            "list of rms_norm, silu_and_mul, gelu_and_mul, rotary_embedding"),
    Setting("autotune", _autotune_mode, lambda: "on",
            "tiled.autotune: 'on' (tune on a cache miss), 'cached' (use a recorded winner, "
            "else the first config, never time), 'off' (always the first config)"),
]}

_local = threading.local()


def _overrides() -> list[dict[str, Any]]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def get(name: str) -> Any:
    """The setting's value: innermost override, else the environment, else the default."""
    setting = SETTINGS[name]
    for layer in reversed(_overrides()):
        if name in layer:
            return layer[name]
    raw = os.environ.get(setting.env)
    if raw is None:
        return setting.default()
    try:
        return setting.parse(raw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{setting.env}={raw!r} is not valid: {e}") from None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Overrides settings for the current thread inside the `with` block."""
    for k in values:
        if k not in SETTINGS:
            raise ConfigError(f"unknown setting {k!r}; known: {', '.join(SETTINGS)}")
    _overrides().append(values)
    try:
        yield
    finally:
        _overrides().pop()
