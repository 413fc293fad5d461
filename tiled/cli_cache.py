"""`tiled cache stats | verify | gc | export | import | clear`: operate the local disk cache."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

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


def _toolchain(target: str) -> str:
    from tiled.compiler.registry import parse_target
    from tiled.compiler.toolchain.digest import toolchain_digest

    return toolchain_digest(parse_target(target))


def cmd_stats(args) -> int:
    s = _tier(args).stats()
    out = {"dir": str(args.dir or config.get("cache_dir")), **vars(s)}
    print(json.dumps(out, indent=1) if args.json else
          "\n".join(f"{k:16s} {v}" for k, v in out.items()))
    return 0


def cmd_verify(args) -> int:
    problems = _tier(args).verify()
    for p in problems:
        print(f"{p.kind:8s} {p.key or '-'} {p.path}: {p.detail}")
    print(f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


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
    r = export_bundle(_tier(args), Path(args.bundle), _toolchain, keys=keys, target=args.target,
                      progress=Progress("export"))
    print(f"exported {r.entries} entries ({r.nbytes} bytes) to {args.bundle}")
    return 0


def cmd_import(args) -> int:
    from tiled.cache.bundle import import_bundle

    r = import_bundle(_tier(args), Path(args.bundle), _toolchain, progress=Progress("import"))
    print(f"imported {r.entries} entries ({r.nbytes} bytes) from {args.bundle}")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("cache", help="inspect and maintain the local kernel cache")
    c.add_argument("--dir", help="cache directory (default: TILED_CACHE_DIR)")
    cs = c.add_subparsers(dest="cache_cmd", required=True)
    p = cs.add_parser("stats", help="entries, bytes, cap")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_stats)
    cs.add_parser("verify", help="check every entry; exit 1 when one is corrupt").set_defaults(
        fn=cmd_verify)
    cs.add_parser("gc", help="sweep stale staging files, enforce the size cap").set_defaults(
        fn=cmd_gc)
    p = cs.add_parser("clear", help="remove every entry")
    p.add_argument("--yes", action="store_true")
    p.set_defaults(fn=cmd_clear)
    p = cs.add_parser("export", help="write entries to a bundle for deploy-time warming")
    p.add_argument("bundle")
    p.add_argument("--target", help="only entries for this target, e.g. cuda:sm_90a")
    p.add_argument("--keys", help="a file of action keys (whitespace separated)")
    p.set_defaults(fn=cmd_export)
    p = cs.add_parser("import", help="verify a bundle and add its entries")
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_import)
