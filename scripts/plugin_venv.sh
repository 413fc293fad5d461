#!/usr/bin/env bash
# scripts/plugin_venv.sh vllm|sglang: builds .venvs/NAME, the venv a serving plugin's tests run
# in (tests/integrations): the CPU torch 2.13.0, the real framework (vllm 0.33.0 / sglang
# 0.5.23) and every other package pinned in integrations/NAME/constraints.txt, all --no-deps
# (the frameworks pin a CUDA torch 2.14 and an apache-tvm-ffi tiled's compiler cannot use),
# then the thin tiled and the plugin (tiled-NAME), editable. Skips the work when the venv
# already matches the constraints file.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: scripts/plugin_venv.sh vllm|sglang}
CONSTRAINTS=integrations/$NAME/constraints.txt
[ -f "$CONSTRAINTS" ] || { echo "no $CONSTRAINTS" >&2; exit 2; }
VENV=.venvs/$NAME
STAMP=$VENV/.constraints.sha256
want=$(sha256sum "$CONSTRAINTS" | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x $VENV/bin/python ]; then
  exit 0
fi
rm -rf $VENV
python3 -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
$VENV/bin/python -m pip install -q torch==2.13.0
$VENV/bin/python -m pip install -q --no-deps -r "$CONSTRAINTS"
$VENV/bin/python -m pip install -q --no-deps -e . -e integrations/$NAME
echo "$want" > "$STAMP"
