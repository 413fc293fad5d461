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
import difflib
import importlib.util
import inspect
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiled import config
from tiled.errors import TiledError

WARM_CHUNK_BYTES = 48 << 20  # below the daemon's 64 MiB request limit, with headroom
ENTRY_KEYS = ("kernel", "args", "shapes", "targets", "options")
TOP_KEYS = ("kernels", "targets", "options")


class ManifestError(TiledError, ValueError):
    """A warm manifest that cannot become requests; the message names the file, the entry
    and what to fix."""


@dataclass
class Item:
    """One request of a manifest: entry `index`, kernel spec, merged args, target."""

    index: int
    kernel: str
    args: dict
    target: str
    options: dict
    request: Any = field(repr=False)  # compile_pb2.CompileRequest
    tune: Any = field(default=None, repr=False)  # (Autotuner, args, spec): tune after warm

    def label(self) -> str:
        return f"{_call(self.index, self.kernel, self.args)} -> {self.target}"


def _call(index: int, kernel: str, args: dict) -> str:
    """`kernels[i] FILE.py:NAME(k=v, ...)`, as the output names an entry's variant."""
    return f"kernels[{index}] {kernel}({', '.join(f'{k}={v}' for k, v in args.items())})"


# -- the manifest ------------------------------------------------------------------------------

def _read(path: Path) -> Any:
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest file")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    if path.suffix not in (".yaml", ".yml"):
        raise ManifestError(f"{path}: a manifest is .yaml, .yml or .json")
    try:
        import yaml
    except ImportError:
        raise ManifestError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); "
                            "or write the manifest as JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ManifestError(f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}") \
            from None


def _unknown_keys(where: str, mapping: dict, known: tuple[str, ...]) -> list[str]:
    problems = []
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            problems.append(f"{where}: unknown key {key!r}{hint}")
    return problems


def _targets(where: str, value: Any) -> list[str]:
    targets = [value] if isinstance(value, str) else value
    if not isinstance(targets, list) or not targets or \
            not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"{where}: `targets` must be a target or a non-empty list of targets "
                         f"such as [cpu, cuda:sm_90a, local], got {value!r}")
    return targets


def _mapping(where: str, key: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where}: `{key}` must be a mapping of names to values, got {value!r}")
    return value


class _Loader:
    """Imports each kernel file once; builds a kernel per variant."""

    def __init__(self, root: Path):
        self.root, self.modules = root, {}

    def attr(self, spec: str):
        path, _, name = spec.rpartition(":")
        if not path or not name:
            raise ValueError(f"`kernel` must be FILE.py:NAME, got {spec!r}")
        file = (self.root / path).resolve()
        if not file.is_file():
            raise ValueError(f"no such file: {file} (paths are relative to the manifest's "
                             "folder)")
        if file not in self.modules:
            mod_spec = importlib.util.spec_from_file_location(
                f"_tiled_warm_{len(self.modules)}_{file.stem}", file)
            module = importlib.util.module_from_spec(mod_spec)
            sys.path.insert(0, str(file.parent))
            try:
                mod_spec.loader.exec_module(module)
            except Exception as e:  # the user's file: whatever it raises is the message
                raise ValueError(f"importing {file} failed: {type(e).__name__}: {e}") from None
            finally:
                sys.path.pop(0)
            self.modules[file] = module
        obj = getattr(self.modules[file], name, None)
        if obj is None:
            raise ValueError(f"{file} has no attribute {name!r}")
        return obj

    @staticmethod
    def build(obj, spec: str, args: dict):
        """The traced kernel of `obj` (a kernel, or a factory called with `args`)."""
        if hasattr(obj, "ir"):
            if args:
                raise ValueError(f"{spec} is a @tiled.kernel, not a factory: it takes no "
                                 "args or shapes")
            kernel = obj
        elif callable(obj):
            try:
                inspect.signature(obj).bind(**args)
            except TypeError as e:
                params = ", ".join(inspect.signature(obj).parameters)
                raise ValueError(f"bad args: {e} (its parameters: {params})") \
                    from None
            except ValueError:  # no signature to check (a builtin): let the call tell
                pass
            kernel = _trace(spec, lambda: obj(**args))
        else:
            raise ValueError(f"{spec} is neither a @tiled.kernel nor a factory")
        if not hasattr(kernel, "ir"):
            raise ValueError(f"{spec}(...) returned {type(kernel).__name__}, not a "
                             "@tiled.kernel")
        return _trace(spec, lambda: kernel.ir)


def _is_autotuned(obj) -> bool:
    from tiled.tuning import Autotuner

    return isinstance(obj, Autotuner)


def _tuning_items(index: int, spec: str, tuner, variant: dict, targets: list[str]) -> list[Item]:
    """One request per config of an autotuned factory and target (the daemon compiles them
    all ahead); the first carries the tuning that runs here after the warm."""
    from tiled.client.client import compile_request

    try:
        programs = tuner.candidate_programs(**variant)
    except TypeError as e:
        raise ValueError(f"bad args: {e}") from None
    if not programs:
        raise ValueError("no config of the autotuned factory builds for these args")
    items = []
    for t in targets:
        for n, (i, _, program) in enumerate(programs):
            items.append(Item(index, f"{spec}[config {i}]", variant, t, tuner.options,
                              compile_request(program, t, tuner.options),
                              tune=(tuner, variant, spec) if n == 0 and t == targets[0] else None))
    return items


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


def _trace(spec: str, fn):
    try:
        return fn()
    except Exception as e:  # the user's kernel code: a KernelDefinitionError is located
        raise ValueError(f"fails to trace: {type(e).__name__}: {e}") from None


def load_manifest(path: Path) -> list[Item]:
    """Every request the manifest at `path` asks for, in manifest order. Raises ManifestError
    listing every problem found (file, entry index, what to fix)."""
    from tiled.client.client import compile_request

    doc = _read(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("kernels"), list):
        raise ManifestError(f"{path}: expected a mapping with a `kernels:` list of entries "
                            "(kernel: FILE.py:NAME, args, shapes, targets, options)")
    problems = _unknown_keys(str(path), doc, TOP_KEYS)
    try:
        default_targets = _targets(str(path), doc.get("targets", ["local"]))
        default_options = _mapping(str(path), "options", doc.get("options"))
    except ValueError as e:
        problems.append(str(e))
        default_targets, default_options = ["local"], {}
    loader, items = _Loader(path.parent), []
    if not doc["kernels"]:
        problems.append(f"{path}: `kernels` is empty")
    for i, entry in enumerate(doc["kernels"]):
        where = f"{path}: kernels[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping with `kernel: FILE.py:NAME`, got "
                            f"{entry!r}")
            continue
        spec = entry.get("kernel")
        if isinstance(spec, str):
            where += f" ({spec})"
        unknown = _unknown_keys(where, entry, ENTRY_KEYS)
        if unknown:
            problems += unknown
            continue
        try:
            if not isinstance(spec, str):
                raise ValueError(f"{where}: `kernel: FILE.py:NAME` is required")
            args = _mapping(where, "args", entry.get("args"))
            shapes = entry.get("shapes", [{}])
            if not isinstance(shapes, list) or not shapes:
                raise ValueError(f"{where}: `shapes` must be a non-empty list of mappings")
            targets = _targets(where, entry.get("targets", default_targets))
            options = {**default_options,
                       **_mapping(where, "options", entry.get("options"))}
            obj = loader.attr(spec)
            for j, shape in enumerate(shapes):
                variant = {**args, **_mapping(f"{where} shapes[{j}]", "shape", shape)}
                if _is_autotuned(obj):
                    if "options" in entry:
                        raise ValueError(f"{where}: an autotuned factory's compile options "
                                         "come from its @tiled.autotune, not `options`")
                    items += _tuning_items(i, spec, obj, variant, targets)
                    continue
                try:
                    program = loader.build(obj, spec, variant)
                except ValueError as e:
                    suffix = f" shapes[{j}]" if "shapes" in entry else ""
                    raise ValueError(f"{where}{suffix}: {e}") from None
                items += [Item(i, spec, variant, t, options, compile_request(program, t, options))
                          for t in targets]
        except ValueError as e:
            text = str(e)
            problems.append(text if text.startswith(str(path)) else f"{where}: {text}")
    if problems:
        raise ManifestError("\n".join(["bad warm manifest:", *problems]))
    return items


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


def model_items(path: Path, target: str, tensor_parallel_size: int = 1,
                framework: str = "vllm") -> list[Item]:
    """The requests of tiled.ops' kernels for the model whose Hugging Face config.json is at
    `path` (tiled.ops.model_warm), for `target`. Raises ManifestError."""
    from tiled.client.client import compile_request
    from tiled.ops import kernel_factory
    from tiled.ops.model_warm import ModelConfigError, warm_set

    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: not a readable JSON config.json: {e}") from None
    try:
        ops = warm_set(config, tensor_parallel_size, framework, target)
    except ModelConfigError as e:
        raise ManifestError(f"{path}: {e}") from None
    return [Item(i, f"tiled.ops:{op}", params, target, {},
                 compile_request(kernel_factory(op, target, **params), target, {}))
            for i, (op, params) in enumerate(ops)]


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
