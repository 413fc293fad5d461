#!/usr/bin/env bash
# The C++ loader on a CUDA GPU, with cubins the daemon compiled elsewhere.
#
#   bash clients/cpp/gpu_check.sh prepare .gpu/cpp   # here (no GPU): start a daemon, compile
#                                                    # with tiled-compile for cuda:sm_90a
#   bash clients/cpp/gpu_check.sh run .gpu/cpp       # there (carry .gpu): build the loader
#                                                    # with cmake, launch, check numerics
#
# prepare builds tiled-compile (build/cpp-client), starts `tiled serve` on a private socket,
# and writes one folder per kernel (NAME.cubin + NAME.manifest.json, as `tiled-compile --out`
# writes them) for the committed vadd.tir and rows_axpb.tir and two GEMMs of
# examples/gemm.py (4096^3 float16, and a symbolic M with N = K = 1024), plus a copy of
# nlohmann/json.hpp so the loader builds where it is not installed. TARGET overrides
# cuda:sm_90a.
#
# run needs cmake and a C++17 compiler, no gRPC: it builds tiled_loader, tiled_loader_test and
# tiled-launch (-DTILED_CPP_CLIENT=OFF), runs tiled_loader_test, then tiled-launch on each
# folder (random inputs; outputs compared with references computed in C++). One JSON line per
# kernel; exit status 1 when any check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
out=${2:-}
[ -n "$mode" ] && [ -n "$out" ] || { sed -n '2,20p' "$0"; exit 2; }

prepare() {
  local target=${TARGET:-cuda:sm_90a} py=.venv/bin/python
  cmake -S clients/cpp -B build/cpp-client >/dev/null
  cmake --build build/cpp-client -j2 --target tiled-compile >/dev/null
  mkdir -p "$out/include" "$out/programs"
  cp -r /usr/include/nlohmann "$out/include/"
  PYTHONPATH=. $py - "$out/programs" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "examples")
import gemm
import tiled.lang as T
out = Path(sys.argv[1])
out.joinpath("gemm4096.tir").write_bytes(gemm.matmul().ir.to_bytes())
out.joinpath("gemm_dyn.tir").write_bytes(gemm.matmul(M=T.dyn("M"), N=1024, K=1024).ir.to_bytes())
PY
  local base
  base=$(mktemp -d /tmp/tiled-gpu-check-XXXXXX)
  PYTHONPATH=. TILED_CACHE_DIR="$base/cache" $py -m tiled.cli serve --socket "$base/tiled.sock" \
    --workers 2 --metrics-port 0 >"$base/daemon.log" 2>&1 &
  local daemon=$!
  trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$base"' RETURN
  local compile=(build/cpp-client/tiled-compile --server "unix://$base/tiled.sock" --retries 40
                 --backoff 0.5 --timeout 600 --target "$target")
  "${compile[@]}" --out "$out/vadd" clients/cpp/testdata/vadd.tir
  "${compile[@]}" --out "$out/rows_axpb" clients/cpp/testdata/rows_axpb.tir
  "${compile[@]}" --out "$out/gemm4096" "$out/programs/gemm4096.tir"
  "${compile[@]}" --out "$out/gemm_dyn" "$out/programs/gemm_dyn.tir"
  echo "prepared $out for $target"
}

run() {
  local build=/tmp/tiled-cpp-loader
  cmake -S clients/cpp -B $build -DTILED_CPP_CLIENT=OFF -DTILED_JSON_INCLUDE_DIR="$PWD/$out/include" \
    >/dev/null
  cmake --build $build -j8 --target tiled-launch tiled_loader_test >/dev/null
  $build/tiled_loader_test
  local failed=0
  for args in "vadd" "vadd --dim N=1" "rows_axpb --dim M=1001" "rows_axpb --dim M=3" \
              "gemm4096" "gemm_dyn --dim M=1000" "gemm_dyn --dim M=4096" "gemm_dyn --dim M=1"; do
    set -- $args
    $build/tiled-launch "$out/$1" "${@:2}" || failed=1
  done
  return $failed
}

case $mode in
  prepare) prepare ;;
  run) run ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
