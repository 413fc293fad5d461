"""Imported once by the compile pool's fork server (`CompilePool(preload=...)`): loads the
compiler backends, and with them TVM, before any worker is forked. Every worker then starts with
the compiler ready (no second of imports on its first compile, or after a replacement) and
shares those pages with its siblings until it writes to them.

A backend that cannot load here (no LLVM, no CUDA toolchain) is skipped: the worker that needs
it loads it on first use and reports the real error there, with the request that needed it."""

from __future__ import annotations

import gc


def _load() -> None:
    import importlib

    # tiled.server.worker: the worker's main loop (tiled.server.worker.serve), which makes each
    # forked worker the leader of its own process group before it runs anything.
    for module in ("tiled.server.worker", "tvm", "tiled.compiler.targets.cpu.lower",
                   "tiled.compiler.targets.cuda.lower"):
        try:
            importlib.import_module(module)
        except Exception:  # reported by the compile that needs this backend
            pass


_load()
# Everything loaded so far lives as long as the fork server: moving it out of the collector's
# reach keeps a worker's garbage collections from writing to (and so copying) these pages.
gc.freeze()
