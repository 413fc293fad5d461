"""The `tiled` command line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from tiled.errors import TiledError


def load_kernel(spec: str):
    """FILE.py:NAME -> the kernel object NAME (a @tiled.kernel, or a zero-argument factory)."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise SystemExit(f"expected FILE.py:NAME, got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"no such file: {path}")
    mod_spec = importlib.util.spec_from_file_location(f"_tiled_user_{file.stem}", file)
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        mod_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    obj = getattr(module, name, None)
    if obj is None:
        raise SystemExit(f"{path} has no attribute {name!r}")
    if not hasattr(obj, "ir") and callable(obj):
        obj = obj()
    if not hasattr(obj, "ir"):
        raise SystemExit(f"{spec} is not a @tiled.kernel (nor a factory returning one)")
    return obj


def cmd_compile(args) -> int:
    import tiled

    kernel = load_kernel(args.kernel)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.no_cache or args.source:  # generated source is not kept in the cache
        compiled, hit = tiled.compile(kernel, target=args.target, cache=False), False
    else:
        from tiled.compiler.cached import compile_cached, default_cache

        compiled, hit = compile_cached(kernel, args.target, default_cache())
    m = compiled.manifest
    ext = {"cubin": "cubin", "so": "so", "hsaco": "hsaco", "msl": "metal"}[m.artifact_format]
    (out / f"{m.name}.{ext}").write_bytes(compiled.artifact)
    (out / f"{m.name}.manifest.json").write_text(m.to_json())
    (out / f"{m.name}.tir.bytes").write_bytes(kernel.ir.to_bytes())
    if args.source and compiled.source and m.backend != "metal":  # (metal: the artifact)
        src_ext = "hip" if m.backend == "rocm" else "cu"
        (out / f"{m.name}.{src_ext}").write_text(compiled.source)
    stages = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in compiled.stages.items())
    how = "cache hit" if hit else ("no cache" if args.no_cache or args.source else "cache miss")
    print(f"{m.name} -> {out}/{m.name}.{ext} ({len(compiled.artifact)} bytes, {m.target}; "
          f"{how}{'; ' + stages if stages and not hit else ''})")
    return 0


def cmd_ir(args) -> int:
    kernel = load_kernel(args.kernel)
    program = kernel.ir
    if args.json:
        from google.protobuf import json_format

        print(json.dumps(json_format.MessageToDict(program.proto), indent=1))
    else:
        print(program)
        print(f"# digest {program.digest}")
    return 0


def cmd_serve(args) -> int:
    from tiled import config
    from tiled.config import _size
    from tiled.server.app import ServeOptions, ServeRefused, serve

    def size(flag: str, text: str) -> int | None:  # "0": no limit
        try:
            n = _size(text)
        except ValueError:
            raise ServeRefused(f"{flag} {text!r} is not a size such as 8G") from None
        return n or None

    if args.timeout is not None and args.timeout <= 0:
        raise ServeRefused("--timeout must be positive (seconds)")
    if args.max_waiting is not None and args.max_waiting < 1:
        raise ServeRefused("--max-waiting must be at least 1")
    defaults = {}  # the limits not given keep ServeOptions' defaults (the pool's, measured)
    if args.timeout is not None:
        defaults["compile_timeout_s"] = args.timeout
    if args.memory_limit is not None:
        defaults["memory_bytes"] = size("--memory-limit", args.memory_limit)
    return serve(ServeOptions(
        socket=args.socket or config.get("socket"), tcp=args.tcp, tls_cert=args.tls_cert,
        tls_key=args.tls_key, token_file=args.token_file,
        insecure_no_auth=args.insecure_no_auth, workers=args.workers,
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr, **defaults,
        queue_limit=args.queue_limit, max_waiting=args.max_waiting,
        max_request_bytes=size("--max-request-size", args.max_request_size) or 64 << 20,
        recycle_bytes=size("--recycle-memory", args.recycle_memory),
        idle_stop_s=args.idle_stop or None))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tiled", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a kernel to an artifact + manifest")
    c.add_argument("kernel", help="FILE.py:NAME")
    c.add_argument("--target", default="cpu",
                   help="cpu, cuda:sm_80, cuda:sm_90a, rocm:gfx942, rocm:gfx90a, metal, "
                   "metal:apple8, metal:apple9")
    c.add_argument("--out", default=".", help="output directory")
    c.add_argument("--source", action="store_true", help="also write generated source")
    c.add_argument("--no-cache", action="store_true", help="compile without the kernel cache")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("ir", help="print a kernel's Tile IR and digest")
    i.add_argument("kernel", help="FILE.py:NAME")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_ir)
    sv = sub.add_parser("serve", help="run the compile daemon")
    sv.add_argument("--socket", help="Unix socket path (default: TILED_SOCKET)")
    sv.add_argument("--tcp", help="also listen on HOST:PORT")
    sv.add_argument("--tls-cert", help="PEM certificate for --tcp")
    sv.add_argument("--tls-key", help="PEM private key for --tcp")
    sv.add_argument("--token-file", help="require this bearer token on --tcp (needs TLS)")
    sv.add_argument("--insecure-no-auth", action="store_true", help="allow --tcp without a "
                    "token file: anyone who can reach the port may compile (logged)")
    sv.add_argument("--workers", type=int, help="compile worker processes (default: CPUs)")
    sv.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    sv.add_argument("--metrics-addr", default="127.0.0.1", help="the address /metrics listens "
                    "on (default 127.0.0.1; 0.0.0.0 in a container scraped from outside)")
    sv.add_argument("--timeout", type=float, help="per-compile time limit, s (default 120: "
                    "tiled.server.pool.DEFAULT_TIMEOUT_S)")
    sv.add_argument("--memory-limit", help="per-worker address-space limit, e.g. 8G; 0: none "
                    "(default 4G: tiled.server.pool.DEFAULT_MEMORY_BYTES)")
    sv.add_argument("--queue-limit", type=int, default=256, help="queued compiles before "
                    "RESOURCE_EXHAUSTED")
    sv.add_argument("--max-waiting", type=int, help="requests that may wait for compiles at "
                    "once before RESOURCE_EXHAUSTED (default: queue limit + workers)")
    sv.add_argument("--max-request-size", default="64M", help="largest request accepted "
                    "(default 64M)")
    sv.add_argument("--idle-stop", type=float, default=300.0, help="stop the compile workers "
                    "(and the compiler they preload) after this many idle seconds; 0: never")
    sv.add_argument("--recycle-memory", default="64M", help="replace a worker whose private "
                    "memory exceeds this after a compile (0: never)")
    sv.set_defaults(fn=cmd_serve)
    from tiled.cli_cache import add_parser as add_cache_parser

    add_cache_parser(sub)
    from tiled.cli_warm import add_parser as add_warm_parser

    add_warm_parser(sub)
    from tiled.cli_status import add_parser as add_status_parser

    add_status_parser(sub)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except TiledError as e:
        print(f"tiled: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
