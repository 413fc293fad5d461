"""Warm manifests: what `tiled warm` (tiled.cli_warm) compiles, as one `Item` per request.

`load_manifest` reads a YAML or JSON manifest (its format is tiled.cli_warm's docstring, also
`tiled warm --help`), imports each entry's kernel file and traces one CompileRequest per
(variant x target), or one per config of an autotuned factory; `model_items` builds the
requests of tiled.ops' kernels for a Hugging Face config.json. Both raise ManifestError naming
the file and what to fix. The command (sending the items to the daemon in chunks, progress,
dry run, tuning after the warm) stays in tiled.cli_warm: what to compile is one concept, how it
travels another.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiled.errors import TiledError

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
        for n, (i, cfg, program) in enumerate(programs):
            options = tuner.options_of(cfg)
            items.append(Item(index, f"{spec}[config {i}]", variant, t, options,
                              compile_request(program, t, options),
                              tune=(tuner, variant, spec) if n == 0 and t == targets[0] else None))
    return items


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
