"""deploy/systemd/tiled.service: `systemd-analyze verify` accepts it with no warning (its
ExecStart pointed at this checkout's tiled), and it runs the daemon as the daemon requires: a
socket directory of its own that others cannot write, the flags `tiled serve` takes, no
restart loop on a refused configuration (exit 2)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_util import serve_refused

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "tiled.service"


def service() -> dict[str, list[str]]:
    """[Service] as {key: [values]} (a key may repeat, as Environment= does)."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_systemd_analyze_verify_accepts_it_without_warnings(tmp_path):
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze missing (Debian's systemd package)"
    tiled = Path(sys.executable).parent / "tiled"
    unit = tmp_path / "tiled.service"
    unit.write_text(UNIT.read_text().replace("/opt/tiled/bin/tiled", str(tiled)))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_it_runs_the_daemon_as_the_daemon_requires(capsys):
    s = service()
    env = dict(e.split("=", 1) for e in s["Environment"])
    socket = Path(env["TILED_SOCKET"])
    assert socket.parent == Path("/run") / s["RuntimeDirectory"][0]
    assert int(s["RuntimeDirectoryMode"][0], 8) & 0o022 == 0  # else the daemon refuses it
    assert Path(env["TILED_CACHE_DIR"]) == Path("/var/cache") / s["CacheDirectory"][0]
    argv = s["ExecStart"][0].split()
    assert argv[:2] == ["/opt/tiled/bin/tiled", "serve"]
    from tiled.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    known = set(re.findall(r"--[a-z-]+", capsys.readouterr().out))
    assert {a for a in argv if a.startswith("--")} <= known
    assert s["User"] == ["tiled"] and s["NoNewPrivileges"] == ["yes"]


def test_a_refused_configuration_exits_2_which_the_unit_does_not_restart(tmp_path):
    assert service()["RestartPreventExitStatus"] == ["2"]
    line = serve_refused("--socket", str(tmp_path / "s.sock"), "--tcp", "127.0.0.1:0")
    assert "--token-file" in line
