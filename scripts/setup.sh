#!/usr/bin/env bash
# Creates .venv with tiled (thin side + compiler + test tools) installed in editable mode.
# Idempotent: a second run only re-checks the install.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[server,dev]'
echo "tiled installed in $(pwd)/.venv"
