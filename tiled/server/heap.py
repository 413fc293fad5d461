"""Handing freed memory back to the OS: glibc's allocator, told not to keep what a large request
leaves behind.

By default glibc raises its mmap threshold to the size of the largest block freed (up to 32 MiB)
and its trim threshold to twice that, and `malloc_trim` never shrinks the top of a thread's
arena. A daemon whose gRPC threads decode one 60 MB request would then keep tens of MB resident
for good. `tune()` fixes both thresholds (large blocks are mapped and unmapped; an arena's free
top past TRIM_BYTES is returned on free), and `trim_soon()` runs `malloc_trim(0)` on a thread of
its own shortly after a large request, for what is left free inside the arenas. Both are no-ops
where the C library is not glibc. Thread-safe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

log = logging.getLogger(__name__)
MMAP_BYTES = 1 << 20  # blocks this large are mmapped, and unmapped when freed
TRIM_BYTES = 128 << 10  # an arena's free top past this goes back on free (glibc's first value)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
DELAY_S = 0.2  # gRPC drops a request's buffers once its handler has returned


def _libc():
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path) if path else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()
_wake = threading.Event()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def tune() -> bool:
    """Fixes glibc's mmap and trim thresholds for this process; False where they are not
    glibc's. Call once at start-up, before the threads that allocate."""
    if _LIBC is None:
        return False
    ok = _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES) == 1
    return _LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1 and ok


def trim_soon() -> None:
    """Returns the heap's free pages to the OS a moment from now (requests arriving together
    share one trim). Never blocks the caller."""
    global _thread
    if _LIBC is None:
        return
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_run, name="tiled-heap-trim", daemon=True)
            _thread.start()
    _wake.set()


def _run() -> None:
    while True:
        _wake.wait()
        _wake.clear()
        time.sleep(DELAY_S)
        _LIBC.malloc_trim(0)
