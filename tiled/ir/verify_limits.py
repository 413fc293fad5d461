"""Verifier rules of a kernel's memory, a mixin of `_Verifier` (tiled.ir.verifier): the
buffers' totals against Limits. Shared memory (SHARED buffers and barriers) against
max_shared_bytes; per thread, LOCAL buffers plus FRAGMENT buffers spread over the block's
threads against max_local_bytes; per block, every non-GLOBAL buffer against max_block_bytes.
The defaults of the three are settings (TILED_MAX_SHARED_BYTES, TILED_MAX_LOCAL_BYTES,
TILED_MAX_BLOCK_BYTES; tiled.config). A message names the total, the limit, the largest buffers
and the one that crosses the limit, located at that buffer's declaration.
"""

from __future__ import annotations

from tiled.ir.dtypes import nbytes
from tiled.ir.verify_base import Rules, _loc_str
from tiled.v1 import tile_ir_pb2 as pb


class LimitRules(Rules):
    """The memory totals of Limits (module docstring)."""

    def shared_memory(self) -> None:
        """The shared memory total (Limits.max_shared_bytes); runs after the buffer table."""
        p, lim = self.p, self.limits
        shared: list[tuple[int, str, int]] = []  # (bytes, name, index in the table)
        for i, b in enumerate(p.buffers):
            if b.scope in (pb.SHARED, pb.BARRIER):  # barriers are 8 bytes each, in shared memory
                shared.append((self.elements(b) * nbytes(b.dtype), self.bname(b.id), i))
        total = sum(n for n, _, _ in shared)
        if total > lim.max_shared_bytes:
            biggest = ", ".join(f"{name} {_kib(n)}" for n, name, _ in sorted(shared)[::-1][:3])
            running, (_, crossing, i) = 0, shared[-1]
            for n, name, j in shared:  # the allocation that crosses the limit
                running += n
                if running > lim.max_shared_bytes:
                    crossing, i = name, j
                    break
            self.loc = _loc_str(p.buffers[i].loc)
            self.fail(f"kernel allocates {_kib(total)} of shared memory, the limit is "
                      f"{_kib(lim.max_shared_bytes)}: reduce block sizes or num_stages "
                      f"(largest: {biggest}; {crossing} crosses the limit)",
                      (None, f"buffers[{i}]"))

    def memory(self, threads: int) -> None:
        """The per-thread and per-block totals of Limits (max_local_bytes, max_block_bytes)."""
        lim, buffers = self.limits, self.p.buffers
        per_thread: list[tuple[int, int]] = []  # (bytes, index in the table)
        per_block: list[tuple[int, int]] = []
        for i, b in enumerate(buffers):
            if b.scope == pb.GLOBAL:
                continue
            n = self.elements(b) * nbytes(b.dtype)
            per_block.append((n, i))
            if b.scope == pb.LOCAL:
                per_thread.append((n, i))
            elif b.scope == pb.FRAGMENT:
                per_thread.append((-(-n // threads), i))
        for sizes, limit, what, knob in (
                (per_thread, lim.max_local_bytes, "local memory per thread (LOCAL buffers, and "
                 f"FRAGMENT buffers spread over the block's {threads} threads)",
                 "max_local_bytes"),
                (per_block, lim.max_block_bytes, "memory per block (SHARED, FRAGMENT and LOCAL "
                 "buffers together)", "max_block_bytes")):
            total = sum(n for n, _ in sizes)
            if total <= limit:
                continue
            running, i = 0, sizes[-1][1]
            for n, j in sizes:  # the allocation that crosses the limit
                running += n
                if running > limit:
                    i = j
                    break
            biggest = ", ".join(f"{self.bname(buffers[j].id)} {_size(n)}"
                                for n, j in sorted(sizes, key=lambda s: (-s[0], s[1]))[:3])
            self.loc = _loc_str(buffers[i].loc) or self.loc
            self.fail(f"kernel allocates {_size(total)} of {what}, the limit is {_size(limit)} "
                      f"(Limits.{knob}): use fewer or smaller buffers (largest: {biggest}; "
                      f"{self.bname(buffers[i].id)} crosses the limit)", (None, f"buffers[{i}]"))


def _size(n: int) -> str:
    """Bytes for a message: KiB or MiB, exact."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            whole = n / (1 << shift)
            return f"{whole:g} {unit}" if whole == int(whole) else f"{whole:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{-(-n // 1024)} KiB ({n} bytes)"
