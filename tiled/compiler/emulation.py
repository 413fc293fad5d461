"""What every CPU emulation of a GPU backend shares (targets/rocm/emulate.py,
targets/metal/emulate.py): the argument file a child process maps, with each tensor between
red zones, and running that child so that a crash, a deadlock or a timeout is an
EmulationError of the caller, never its crash.

The file holds the tensors' bytes (each after REDZONE bytes of 0xA5 and before as many) and
the scalars' bytes; the child reads and writes it in place and checks the red zones; the
tensors are then copied back into the caller's arrays, as a launch would write them.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import tempfile

import numpy as np

from tiled.errors import EmulationError, LaunchError
from tiled.runtime.args import BoundArgs, bind_args
from tiled.runtime.manifest import Manifest, eval_expr

REDZONE = 256  # bytes of 0xA5 around each tensor in the argument file


class ArgumentFile:
    """The argument file being built; `tensor` and `value` return the child's token for the
    argument ("t:OFFSET:NBYTES", "s:OFFSET")."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self.tensors: list[tuple[object, int, int]] = []  # (array, offset, nbytes)

    def _align(self, n: int) -> None:
        self.blob.extend(b"\0" * (-len(self.blob) % n))

    def tensor(self, arr) -> str:
        data = np.ascontiguousarray(arr).view(np.uint8).reshape(-1).tobytes()
        self._align(REDZONE)
        self.blob.extend(b"\xa5" * REDZONE)
        offset = len(self.blob)
        self.blob.extend(data)
        self.blob.extend(b"\xa5" * REDZONE)
        self.tensors.append((arr, offset, len(data)))
        return f"t:{offset}:{len(data)}"

    def value(self, data: bytes) -> str:
        self._align(16)
        offset = len(self.blob)
        self.blob.extend(data)
        return f"s:{offset}"

    def run(self, argv_before_file: list[str], argv_after_file: list[str], what: str,
            timeout_s: float) -> None:
        """Runs `argv_before_file + [the file] + argv_after_file`, then writes the tensors back
        into their arrays. EmulationError (naming `what`) when the child fails."""
        blob = self.blob + b"\0" * REDZONE
        with tempfile.NamedTemporaryFile(prefix="tiled-emu-args-") as f:
            f.write(blob)
            f.flush()
            argv = [*argv_before_file, f.name, *argv_after_file]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                      check=False)
            except subprocess.TimeoutExpired:
                raise EmulationError(f"{what}: the emulation ran past {timeout_s:.0f} s") \
                    from None
            if proc.returncode != 0:
                why = proc.stderr.strip() or proc.stdout.strip()
                if proc.returncode < 0:
                    name = signal.Signals(-proc.returncode).name
                    why = f"it crashed with {name} (an access outside memory it owns?) {why}"
                raise EmulationError(f"{what} (CPU emulation): {why}")
            f.seek(0)
            result = f.read()
        for arr, offset, n in self.tensors:
            if isinstance(arr, np.ndarray) and n:
                out = np.frombuffer(result, dtype=np.uint8, count=n, offset=offset)
                arr[...] = out.view(arr.dtype).reshape(arr.shape)


def np_dtype(name: str):
    """The numpy dtype of a tiled dtype name (ml_dtypes for bfloat16 and float8)."""
    if name == "bfloat16" or name.startswith("float8"):
        import ml_dtypes

        return getattr(ml_dtypes, {"float8_e4m3": "float8_e4m3fn"}.get(name, name))
    return np.dtype(name)


def as_arrays(args) -> list:
    """The call's arguments with array-likes as numpy arrays (scalars as they are)."""
    return [np.asarray(a) if hasattr(a, "__array_interface__") or hasattr(a, "__array__")
            else a for a in args]


def bind_launch(manifest: Manifest, backend: str,
                args) -> tuple[list, BoundArgs, list[int], list[int]]:
    """(the arguments as arrays, their BoundArgs, grid, block) of an emulated launch of a
    `backend` kernel; LaunchError for another backend's kernel or arguments its manifest
    refuses. The arrays are copied into the argument file, so the kernel's pointer alignment
    holds there whatever the caller's arrays are: it is not checked."""
    if manifest.backend != backend:
        raise LaunchError(f"{manifest.name}: this emulation runs {backend} kernels; this one "
                          f"is for {manifest.target}")
    arrays = as_arrays(args)
    params = [dataclasses.replace(p, align=None) for p in manifest.params]
    bound = bind_args(params, arrays, "cpu")
    return (arrays, bound, [eval_expr(e, bound.dims) for e in manifest.grid],
            [eval_expr(e, bound.dims) for e in manifest.block])
