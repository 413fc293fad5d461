"""What the serving plugins' tests share: the framework venv they run their checks in
(scripts/plugin_venv.sh builds it) and running one mode of a checks script there, its result
the JSON of its last `RESULT ` line."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def framework_python(name: str) -> Path:
    """The venv python of framework `name` (TILED_<NAME>_PYTHON, default
    .venvs/<name>/bin/python). Without it the test skips, saying so, unless
    TILED_REQUIRE_<NAME>=1 (scripts/test.sh sets it): then it fails."""
    upper = name.upper()
    python = Path(os.environ.get(f"TILED_{upper}_PYTHON", ROOT / ".venvs" / name / "bin" /
                                 "python"))
    if not python.exists():
        build = f"scripts/plugin_venv.sh {name} builds it"
        if os.environ.get(f"TILED_REQUIRE_{upper}") == "1":
            pytest.fail(f"the {name} venv is missing ({python}): {build}")
        pytest.skip(f"no {name} venv at {python} ({build})")
    return python


def run_checks(python: Path, checks: Path, mode: str, env: dict) -> dict:
    r = subprocess.run([str(python), str(checks), mode], env={**os.environ, **env},
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"{checks.name} {mode} failed:\n{r.stdout}\n{r.stderr}"
    out = json.loads(lines[-1][len("RESULT "):])
    out["log"] = r.stderr
    return out
