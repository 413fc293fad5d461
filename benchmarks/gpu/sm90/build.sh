#!/usr/bin/env bash
# Build the sm_90a warp-specialised GEMM probe into .gpu/sm90/ (gitignored;
# carried to the GPU machine).  Prints ptxas resource usage and, when a
# cuobjdump is found, the count of the Hopper instructions in the SASS.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
NVCC="${NVCC:-/usr/local/bin/nvcc}"
OUT="$ROOT/.gpu/sm90"
mkdir -p "$OUT"
"$NVCC" -cubin -gencode=arch=compute_90a,code=sm_90a -O3 --use_fast_math -std=c++17 \
  -Xptxas -v -I "$ROOT/tiled/compiler/backends/cuda_include" \
  -o "$OUT/ws_gemm.cubin" "$ROOT/benchmarks/gpu/sm90/ws_gemm.cu" 2>&1 | tee "$OUT/ptxas.txt"
CUOBJDUMP="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
if [ -n "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" -sass "$OUT/ws_gemm.cubin" > "$OUT/ws_gemm.sass"
  for op in HGMMA UTMALDG SYNCS WARPGROUP USETMAXREG LDL STL; do
    printf '%-11s %s\n' "$op" "$(grep -c "\b$op" "$OUT/ws_gemm.sass" || true)"
  done
fi
