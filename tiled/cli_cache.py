"""`tiled cache stats | verify | gc | export | import | clear`: operate the local disk cache.

Exit codes (docs/cache.md): 0 success; 1 `verify` left problems (found without --repair, or
that --repair could not remove) or `import` refused the bundle (nothing imported); 2 a usage
error or another tiled error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiled import config


class Progress:
    """A one-line progress bar on stderr (only where stderr is a terminal, or when forced)."""

    def __init__(self, label: str, force: bool = False):
        self.label, self.enabled = label, force or sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or (time.monotonic() - self.last < 0.1 and done != total):
            return
        self.last = time.monotonic()
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _tier(args):
    from tiled.cache.disk import DiskTier

    return DiskTier(Path(args.dir) if args.dir else None)


def _toolchain(target: str, options: Mapping[str, Any]) -> str:
    """This host's toolchain digest for compiling for `target` with `options`, as the compile
    path computes it (tiled.compiler.action); ValueError / TiledError for options the backend
    does not take or a target this host does not compile for."""
    from tiled.compiler.registry import check_options, parse_target
    from tiled.compiler.toolchain.digest import toolchain_digest

    tgt = parse_target(target)
    check_options(tgt.backend, dict(options))
    return toolchain_digest(tgt, cuda_compiler=options.get("cuda_compiler"))


def cmd_stats(args) -> int:
    s = _tier(args).stats()
    out = {"dir": str(args.dir or config.get("cache_dir")), **vars(s)}
    print(json.dumps(out, indent=1) if args.json else
          "\n".join(f"{k:16s} {v}" for k, v in out.items()))
    return 0


def cmd_verify(args) -> int:
    problems = _tier(args).verify(repair=args.repair)
    for p in problems:
        print(f"{p.kind:10s} {p.key or '-'} {p.path}: {p.detail}"
              f"{' [removed]' if p.removed else ''}")
    left = sum(not p.removed for p in problems)
    print(f"{len(problems)} problem(s), {len(problems) - left} removed", file=sys.stderr)
    return 1 if left else 0


def cmd_gc(args) -> int:
    print(json.dumps(_tier(args).gc()))
    return 0


def cmd_clear(args) -> int:
    if not args.yes:
        print("tiled cache clear removes every entry; pass --yes", file=sys.stderr)
        return 2
    _tier(args).clear()
    return 0


def cmd_export(args) -> int:
    from tiled.cache.bundle import export_bundle

    keys = None
    if args.keys:
        keys = [k.strip() for k in Path(args.keys).read_text().split() if k.strip()]
    target = args.target
    if target == "cpu":  # entries name the level "cpu" resolved to when they were compiled
        from tiled.runtime.cpu_levels import host_level

        target = f"cpu:{host_level().name}"
    r = export_bundle(_tier(args), Path(args.bundle), keys=keys, target=target,
                      progress=Progress("export"))
    print(f"exported {r.entries} entries ({r.nbytes} bytes) to {args.bundle}")
    return 0


def cmd_import(args) -> int:
    from tiled.cache.bundle import import_bundle
    from tiled.errors import BundleError

    try:
        r = import_bundle(_tier(args), Path(args.bundle), _toolchain,
                          progress=Progress("import"))
    except BundleError as e:
        print(f"tiled cache import: refused: {e}\nnothing was imported", file=sys.stderr)
        return 1
    print(f"imported {r.entries} entries ({r.nbytes} bytes, {r.added} new) from {args.bundle}")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("cache", help="inspect and maintain the local kernel cache")
    c.add_argument("--dir", help="cache directory (default: TILED_CACHE_DIR)")
    cs = c.add_subparsers(dest="cache_cmd", required=True)
    p = cs.add_parser("stats", help="entries, bytes, cap")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_stats)
    p = cs.add_parser("verify", help="check every entry and blob; exit 1 when problems remain",
                      epilog="exit status: 0 nothing wrong (or --repair removed all of it), 1 "
                      "problems remain, 2 usage error. See docs/cache.md.")
    p.add_argument("--repair", action="store_true",
                   help="remove broken entries, corrupt blobs, strays and stale staging")
    p.set_defaults(fn=cmd_verify)
    cs.add_parser("gc", help="sweep stale staging files, enforce the size cap").set_defaults(
        fn=cmd_gc)
    p = cs.add_parser("clear", help="remove every entry")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(fn=cmd_clear)
    p = cs.add_parser("export", help="write entries to a bundle for deploy-time warming")
    p.add_argument("bundle")
    p.add_argument("--target", help="only entries for this target, e.g. cuda:sm_90a, "
                   "cpu:x86-64-v3 (cpu: this host's level)")
    p.add_argument("--keys", help="a file of action keys (whitespace separated)")
    p.set_defaults(fn=cmd_export)
    p = cs.add_parser("import", help="verify a bundle and add its entries (all or none); "
                      "exit 1 when it is refused",
                      epilog="exit status: 0 imported, 1 refused (nothing imported; the message "
                      "names the entry and the problem), 2 usage error. See docs/cache.md.")
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_import)
