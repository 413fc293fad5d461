#!/usr/bin/env bash
# Builds .venvs/vllm, the venv the vLLM plugin's tests run in (tests/integrations): the CPU
# torch 2.13.0, the real vllm 0.33.0 and every other package pinned in
# integrations/vllm/constraints.txt, all --no-deps (vllm's own pins ask for a CUDA torch 2.14
# and an apache-tvm-ffi tiled's compiler cannot use), then the thin tiled and tiled-vllm,
# editable. Skips the work when the venv already matches the constraints file.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venvs/vllm
STAMP=$VENV/.constraints.sha256
want=$(sha256sum integrations/vllm/constraints.txt | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x $VENV/bin/python ]; then
  exit 0
fi
rm -rf $VENV
python3 -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
$VENV/bin/python -m pip install -q torch==2.13.0
$VENV/bin/python -m pip install -q --no-deps -r integrations/vllm/constraints.txt
$VENV/bin/python -m pip install -q --no-deps -e . -e integrations/vllm
echo "$want" > "$STAMP"
