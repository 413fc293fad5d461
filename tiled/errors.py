"""The error hierarchy. Every tiled error derives from `TiledError`; each also inherits the
builtin it resembles, so callers may catch either. All of them pickle across process boundaries
(plain constructor arguments only)."""

from __future__ import annotations


class TiledError(Exception):
    """Base of every error raised by tiled."""


class KernelDefinitionError(TiledError, SyntaxError):
    """A mistake in a `@tiled.kernel` definition, located at the author's file and line."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 column: int | None = None, source_line: str | None = None):
        self.message, self.file, self.line, self.column = message, file, line, column
        self.source_line = source_line
        Exception.__init__(self, message, file, line, column, source_line)
        # The traceback module (pytest, IDEs) prints a SyntaxError from its `msg` attribute,
        # "<no detail available>" when that is unset: give it the whole located text.
        self.msg = str(self)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file and self.line else (self.file or "<kernel>")
        text = f"{where}: {self.message}"
        if self.source_line:
            text += f"\n    {self.source_line.rstrip()}"
            if self.column:
                text += "\n    " + " " * (self.column - 1) + "^"
        return text


class IRDecodeError(TiledError, ValueError):
    """Bytes that are not a Tile IR program of a known schema version."""


class VerifyError(TiledError, ValueError):
    """A Tile IR program that breaks a rule of the IR. `path` locates the node in the program
    (for example `kernel.body.seq.stmts[2].copy.src.offsets[0]`); `loc` is the author's source
    location when the program carries one."""

    def __init__(self, message: str, path: str = "", loc: str = ""):
        self.message, self.path, self.loc = message, path, loc
        Exception.__init__(self, message, path, loc)

    def __str__(self) -> str:
        where = " ".join(p for p in (self.loc, f"at {self.path}" if self.path else "") if p)
        return f"{where}: {self.message}" if where else self.message


class UnsupportedTarget(TiledError, NotImplementedError):
    """A target no registered backend compiles for."""


class CompileError(TiledError, RuntimeError):
    """Lowering or the toolchain failed for a valid program. `loc` names the author's source."""

    def __init__(self, message: str, loc: str = ""):
        self.message, self.loc = message, loc
        Exception.__init__(self, message, loc)

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}" if self.loc else self.message


class ToolchainError(CompileError):
    """An external tool (nvcc, NVRTC, the C compiler) failed; the message carries its output."""


class CompileTimeout(TiledError, TimeoutError):
    """A compile ran past its time limit."""


class LaunchError(TiledError, ValueError):
    """Arguments that do not match a compiled kernel's manifest, or a failed launch."""


class EmulationError(TiledError, RuntimeError):
    """A kernel failed under the CPU emulation of its target (a deadlock at a barrier, a write
    outside a tensor argument, a crash): the message says which."""


class ConfigError(TiledError, ValueError):
    """A `TILED_*` setting that does not parse; the message names the variable."""


class CacheError(TiledError, OSError):
    """A cache operation that failed for a reason the caller should see (a full disk, a
    refused bundle). Reads never raise it: a failed read is a counted miss."""


class CacheWriteError(CacheError):
    """An entry could not be stored (disk full, permissions, over the size cap); nothing
    already stored was lost."""


class BundleError(CacheError, ValueError):
    """A bundle that does not verify or does not match this toolchain."""


class QueueFull(TiledError, RuntimeError):
    """The compile queue is at its limit; retry later (gRPC RESOURCE_EXHAUSTED)."""


class WorkerCrashed(TiledError, RuntimeError):
    """The worker process running a compile died or ran out of memory; only that compile fails."""
