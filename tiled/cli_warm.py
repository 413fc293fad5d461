"""`tiled warm MANIFEST`: compile a deployment's kernels on the daemon ahead of time.

A warm manifest (YAML or JSON) lists the kernels a deployment launches (a NAME that is a
`@tiled.autotune` factory sends every config's request, then tunes here, on this host's
device, recording the winner in the kernel cache):

    kernels:
      - kernel: examples/gemm.py:matmul      # FILE.py:NAME, relative to the manifest's folder
        args: {N: 4096, K: 4096, dtype: float16}
        shapes: [{M: 16}, {M: 64}]           # optional: one variant each, merged over args
        targets: [cuda:sm_90a, local]        # default: the top-level `targets`, else [local]
        options: {}                          # optional backend options

NAME is a `@tiled.kernel` (then no args or shapes) or a factory called with the merged
keyword arguments. Every (variant x target) becomes one CompileRequest; they travel in one Warm
call (several when they would exceed WARM_CHUNK_BYTES). Exit codes: 0 all warm, 1 some request
failed (or, with --dry-run, would fail), 2 the manifest is wrong.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from pathlib import Path

from tiled import config
from tiled.errors import TiledError

# The manifest's reading lives in tiled.warm_manifest; its names stay importable from here.
from tiled.warm_manifest import Item, ManifestError, _call, load_manifest, model_items

WARM_CHUNK_BYTES = 48 << 20  # below the daemon's 64 MiB request limit, with headroom


def chunks(items: list[Item], limit: int = WARM_CHUNK_BYTES) -> list[list[Item]]:
    """Items split into runs whose WarmRequest stays below `limit` bytes (a larger single
    request travels alone, and the daemon decides)."""
    out: list[list[Item]] = [[]]
    size = 0
    for item in items:
        n = item.request.ByteSize() + 8  # field tag and length prefix
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return [c for c in out if c]


# -- talking to the daemon -----------------------------------------------------------------------

def daemon_address(server: str | None) -> str:
    """--server, else TILED_SERVER, else the socket `tiled serve` listens on by default."""
    return server or config.get("server") or f"unix://{config.get('socket')}"


def _code_name(code: int) -> str:
    import grpc

    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))


def _error_code(exc: TiledError) -> str:
    """The gRPC code name behind a tiled error from the client (the inverse of its mapping)."""
    import grpc

    from tiled.client.errors import error_for_status

    if type(exc) is not TiledError:
        for code in grpc.StatusCode:
            if type(error_for_status(code, "")) is type(exc):
                return code.name
    head = str(exc).split(":", 1)[0]  # error_for_status spells the other codes "NAME: ..."
    return head if head in grpc.StatusCode.__members__ else "UNKNOWN"


class _Progress:
    """A redrawn bar on a terminal (stderr); one line per result otherwise (stdout)."""

    def __init__(self, total: int, bar: bool):
        self.total, self.bar, self.done = total, bar, 0
        self.counts = {"hit": 0, "compiled": 0, "failed": 0}
        self.last = 0.0

    def __call__(self, item: Item, outcome: str, detail: str = "") -> None:
        self.done += 1
        self.counts[outcome] += 1
        if not self.bar:
            width = len(str(self.total))
            print(f"[{self.done:{width}d}/{self.total}] {outcome:8s} {item.label()}"
                  f"{'  ' + detail if detail else ''}", flush=True)
            return
        if time.monotonic() - self.last < 0.1 and self.done != self.total:
            return
        self.last = time.monotonic()
        filled = 30 * self.done // max(self.total, 1)
        c = self.counts
        sys.stderr.write(f"\rwarm [{'#' * filled}{'.' * (30 - filled)}] {self.done}/"
                         f"{self.total}  {c['hit']} hits, {c['compiled']} compiled, "
                         f"{c['failed']} failed")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _warm(client, items: list[Item], progress: _Progress) -> list[tuple[Item, str, str]]:
    """Sends the items; returns the failures as (item, code name, message)."""
    failures = []
    for run in chunks(items):
        pending = dict(enumerate(run))
        try:
            for result in client.warm([item.request for item in run]):
                item = pending.pop(result.index)
                if result.code:
                    failures.append((item, _code_name(result.code), result.message))
                    progress(item, "failed", _code_name(result.code))
                else:
                    progress(item, "hit" if result.cache_hit else "compiled",
                             result.action_key[:12])
        except TiledError as e:  # the call itself ended: every item without a result failed
            code = _error_code(e)
            for item in pending.values():
                failures.append((item, code, f"no result: {e}"))
                progress(item, "failed", code)
    return failures


def _tune(items: list[Item], address: str) -> list[tuple[Item, str, str]]:
    """Runs the tunings the manifest's autotuned entries ask for, on this host's device,
    compiling through the daemon at `address` (the warm made those compiles hits)."""
    failures = []
    for item in items:
        if item.tune is None:
            continue
        tuner, variant, spec = item.tune
        t0 = time.perf_counter()
        try:
            with config.override(server=address):
                tuned = tuner(**variant)
        except Exception as e:  # the tuning's own error is the message
            failures.append((item, "TUNING", f"{type(e).__name__}: {e}"))
            continue
        how = "recorded before" if tuned.from_record else \
            f"timed {sum(c.us is not None for c in tuned.candidates)} candidates"
        print(f"tuned {_call(item.index, spec, variant)}: config {tuned.config} "
              f"({how}, {time.perf_counter() - t0:.1f} s)", flush=True)
    return failures


def _items(args, address: str) -> list[Item]:
    if (args.manifest is None) == (args.model_config is None):
        raise ManifestError("tiled warm takes a manifest or --model-config CONFIG.json (one)")
    if args.manifest is not None:
        return load_manifest(Path(args.manifest))
    target = args.target
    if target is None:  # the daemon's own: the kernels' launch configs depend on it
        from tiled.client import Client

        with Client(address, timeout_s=args.timeout) as client:
            target = client.capabilities().local_target
    return model_items(Path(args.model_config), target, args.tensor_parallel_size,
                       args.framework)


def cmd_warm(args) -> int:
    from tiled.client import Client

    address = daemon_address(args.server)
    items = _items(args, address)
    if args.dry_run:
        return _dry_run(items, address, args.timeout)
    runs = chunks(items)
    print(f"warming {len(items)} requests on {address} ({len(runs)} Warm call"
          f"{'s' if len(runs) > 1 else ''})", flush=True)
    progress = _Progress(len(items), bar=sys.stderr.isatty())
    with Client(address, timeout_s=args.timeout) as client:
        try:
            failures = _warm(client, items, progress)
        except KeyboardInterrupt:
            print(f"\ninterrupted after {progress.done} of {len(items)} results", file=sys.stderr)
            return 130
    c = progress.counts
    print(f"{len(items)} requests: {c['hit']} cache hits, {c['compiled']} compiled, "
          f"{len(failures)} failed")
    failures += _tune(items, address)
    for item, code, message in failures:
        print(f"FAILED {item.label()}\n  {code}: {message}".replace("\n", "\n  ").rstrip())
    return 1 if failures else 0


def _dry_run(items: list[Item], address: str, timeout: float | None) -> int:
    """Reports what would be sent and, when the daemon answers, what it has cached: a
    cache-only Compile per item (the daemon verifies and keys each request; nothing compiles).
    Action keys cannot be computed here: the toolchain digest is the daemon's."""
    from tiled.client import Client

    runs = chunks(items)
    size = sum(item.request.ByteSize() for item in items)
    print(f"dry run: {len(items)} requests, {size / (1 << 20):.2f} MiB in {len(runs)} Warm "
          f"call{'s' if len(runs) > 1 else ''}")
    states: list[str] = []
    with Client(address, timeout_s=timeout) as client:
        try:
            client.capabilities()
        except TiledError as e:
            print(f"daemon not reachable ({e}); cache state unknown")
            for item in items:
                print(f"  would send {item.label()}")
            return 0

        def probe(item: Item) -> str:
            try:
                hit = client.lookup(item.request)
            except TiledError as e:
                return f"would fail {_error_code(e)}: {e}"
            return "cached" if hit is not None else "to compile"

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            states = list(ex.map(probe, items))
    for item, state in zip(items, states, strict=True):
        print(f"  {state.split(':')[0]:10s} {item.label()}" +
              (f"\n    {state.split(': ', 1)[1]}" if ": " in state else ""))
    cached = states.count("cached")
    failing = sum(s.startswith("would fail") for s in states)
    print(f"{len(items)} requests: {cached} cached, {len(items) - cached - failing} to compile, "
          f"{failing} would fail (daemon at {address})")
    return 1 if failing else 0


def add_parser(sub) -> None:
    w = sub.add_parser("warm", help="compile a manifest's kernels on the daemon (deploy time)",
                       description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("manifest", nargs="?", help="a .yaml, .yml or .json warm manifest")
    w.add_argument("--model-config", metavar="CONFIG.json", help="instead of a manifest: the "
                   "tiled.ops kernels a serving plugin compiles for this Hugging Face model "
                   "config (norms, gated activation, rotary)")
    w.add_argument("--tensor-parallel-size", type=int, default=1, help="with --model-config: "
                   "the ranks the heads and the MLP are split over (default 1)")
    w.add_argument("--framework", choices=("vllm", "sglang"), default="vllm",
                   help="with --model-config: the serving plugin whose kernels to compile "
                   "(default vllm; they differ in the rotary cache's dtype on GPUs)")
    w.add_argument("--target", help="with --model-config: the target to compile for "
                   "(default: the daemon's local target)")
    w.add_argument("--server", help="daemon address (default: TILED_SERVER, else "
                   "unix://TILED_SOCKET)")
    w.add_argument("--timeout", type=float, help="deadline of each Warm call, s (default: "
                   "TILED_CLIENT_TIMEOUT_SECONDS)")
    w.add_argument("--dry-run", action="store_true", help="trace and report what would be "
                   "sent, and which requests the daemon already holds; compile nothing")
    w.set_defaults(fn=cmd_warm)
