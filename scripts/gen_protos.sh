#!/usr/bin/env bash
# Regenerates tiled/v1/*_pb2*.py from proto/tiled/v1/*.proto.
# The generator is pinned to grpcio-tools 1.75.1 (protobuf gencode 6.31.1): gencode of that version
# imports under protobuf 6.31+ and 7.x runtimes, which covers the daemon hosts and the GPU image.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TILED_PROTOC_VENV:-/tmp/tiled-protoc-venv}
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q grpcio-tools==1.75.1; }
"$venv/bin/python" -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/tiled/v1/*.proto
# grpc_python_out writes a stub for every file; drop the empty ones (files with no service).
for f in tiled/v1/*_pb2_grpc.py; do grep -q "class .*Stub" "$f" || rm -f "$f"; done
