"""`tiled status`: what an operator asks of a running daemon (version, backends, load, cache,
health). Exit 0 when it is serving, 1 when it is unreachable or not serving.

`tiled status --probe` asks only the gRPC health service (no Capabilities, no retries): the
container HEALTHCHECK and the Kubernetes probes run it every few seconds."""

from __future__ import annotations

import json
import sys
from typing import Any

from tiled.cli_warm import daemon_address
from tiled.errors import TiledError

HEALTH_NAMES = ("", "tiled.v1.Compiler", "tiled.v1.Compiler/cpu", "tiled.v1.Compiler/cuda",
                "tiled.v1.Compiler/rocm", "tiled.v1.Compiler/metal")
# What an operator must know about a backend beyond its archs.
BACKEND_NOTES = {"rocm": "compiled and CPU-emulated here (CompiledKernel.emulate); not yet run "
                         "on an AMD GPU",
                 "metal": "MSL type-checked and CPU-emulated here (CompiledKernel.emulate); "
                          "not yet run on an Apple GPU"}


def _to_dict(message) -> dict:
    """A message as plain JSON values (MessageToDict would write uint64 fields as strings)."""
    out: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        # protobuf 7 dropped FieldDescriptor.label; is_repeated is its replacement
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED
        if f.message_type is not None:
            value = [_to_dict(v) for v in value] if repeated else _to_dict(value)
        elif repeated:
            value = list(value)
        out[f.name] = value
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _duration(s: float) -> str:
    s = int(s)
    d, h, m = s // 86400, s // 3600 % 24, s // 60 % 60
    return (f"{d}d " if d else "") + (f"{h}h " if d or h else "") + f"{m}m {s % 60:02d}s"


def daemon_status(address: str, timeout: float) -> dict:
    """What `tiled status` shows, as a dict: reachable, capabilities fields, health."""
    from tiled.client import Client

    with Client(address, timeout_s=timeout) as client:
        try:
            caps = client.capabilities()
        except TiledError as e:
            return {"address": address, "reachable": False, "error": str(e)}
        health: dict[str, str] = {}
        for name in HEALTH_NAMES:
            try:
                health[name] = client.health(name)
            except ImportError:
                health[name] = "unknown (grpcio-health-checking is not installed here)"
            except TiledError as e:
                health[name] = f"error: {e}"
    return {"address": address, "reachable": True, **_to_dict(caps), "health": health}


def _status_lines(s: dict) -> list[str]:
    live = s["uptime_seconds"] > 0  # an older daemon reports no live numbers
    backends = [f"{b['name']} ({', '.join(b['archs'])}), toolchain {b['toolchain_digest'][:12]}"
                + (f": {BACKEND_NOTES[b['name']]}" if b["name"] in BACKEND_NOTES else "")
                for b in s["backends"]] or ["none"]
    tiers = [f"{t['name']} remote" if t["remote"] else
             f"{t['name']} {_size(t['bytes'])}" + (f" of {_size(t['max_bytes'])}"
                                                   if t["max_bytes"] else "")
             for t in s["cache_tiers"]]
    rows = [("version", f"{s['version']} (Tile IR schema {s['tile_ir_schema_version']})"),
            ("uptime", _duration(s["uptime_seconds"]) if live else "not reported"),
            ("local target", s["local_target"]),
            *[("backends" if i == 0 else "", b) for i, b in enumerate(backends)],
            ("workers", f"{s['workers']}" + (f" ({s['workers_replaced_total']} replaced)"
                                             if live else "")),
            ("queue", (f"{s['queued']} queued, {s['in_flight']} in flight, " if live else "")
             + f"limit {s['queue_limit']}"),
            ("limits", f"request {_size(s['max_request_bytes'])}, inline "
                       f"{_size(s['max_inline_bytes'])}")]
    if live:
        rows += [("compiles", f"{s['compiles_total']} compiled, {s['compile_failures_total']} "
                              f"failed, {s['merged_total']} merged, {s['cache_hits_total']} "
                              "cache hits"),
                 ("cache", "; ".join(tiers) or "not reported")]
    rows += [("health" if i == 0 else "", f"{name or '(server)'}: {state}")
             for i, (name, state) in enumerate(s["health"].items())]
    return [f"  {k:14s}{v}" for k, v in rows]


def probe(address: str, timeout: float) -> tuple[bool, str]:
    """(serving, what to print) from one health check of the whole daemon ("" service)."""
    from tiled.client import Client

    with Client(address, timeout_s=timeout, retries=0) as client:
        try:
            state = client.health("")
        except TiledError as e:
            return False, f"not reachable: {e}"
    return state == "SERVING", state


def cmd_status(args) -> int:
    address = daemon_address(args.server)
    if args.probe:
        serving, state = probe(address, args.timeout)
        print(f"tiled daemon at {address}: {state}", file=sys.stdout if serving else sys.stderr)
        return 0 if serving else 1
    s = daemon_status(address, args.timeout)
    # Without the health package here, a Capabilities answer is the best sign of serving.
    state = s.get("health", {}).get("", "")
    serving = s["reachable"] and (state == "SERVING" or state.startswith("unknown"))
    if args.json:
        print(json.dumps({**s, "serving": serving}, indent=1))
    elif not s["reachable"]:
        print(f"tiled daemon at {address}: not reachable: {s['error']}", file=sys.stderr)
    else:
        print(f"tiled daemon at {address}: {'SERVING' if serving else 'NOT SERVING'}")
        print("\n".join(_status_lines(s)))
    return 0 if serving else 1


def add_parser(sub) -> None:
    st = sub.add_parser("status", help="the daemon's version, backends, load, cache, health")
    st.add_argument("--server", help="daemon address (default: TILED_SERVER, else "
                    "unix://TILED_SOCKET)")
    st.add_argument("--timeout", type=float, default=10.0, help="deadline of each call, s")
    st.add_argument("--json", action="store_true", help="one JSON object")
    st.add_argument("--probe", action="store_true", help="only the gRPC health check, no "
                    "retries (container and Kubernetes probes)")
    st.set_defaults(fn=cmd_status)
