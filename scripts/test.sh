#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) plus the test-only extras, then runs the test suite.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
scripts/setup.sh
# The Redis tier's tests run against a real redis-server (they start their own on a free port).
command -v redis-server >/dev/null || { apt-get update -q && apt-get install -y -q redis-server; }
# The Node.js client's tests (tests/clients) run node against a real daemon: Debian's nodejs and
# npm where node is missing, then the client's locked dependencies.
{ command -v node && command -v npm; } >/dev/null || {
  apt-get update -q && apt-get install -y -q nodejs npm; }
(cd clients/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
# --- the C++ client (clients/cpp): its tests (tests/clients/test_cpp_client.py) build it with
# CMake against Debian's gRPC C++, protobuf and nlohmann/json, installed here where missing.
{ command -v cmake && command -v c++ && command -v protoc && command -v grpc_cpp_plugin &&
  pkg-config --exists grpc++ protobuf && [ -f /usr/include/nlohmann/json.hpp ]; } >/dev/null 2>&1 || {
  apt-get update -q && apt-get install -y -q cmake g++ pkg-config libgrpc++-dev libprotobuf-dev \
    protobuf-compiler protobuf-compiler-grpc nlohmann-json3-dev; }
# --- end of the C++ client's block
# --- ROCm backend (issue 16): clang-22, ld.lld-22 and llvm-22 (objcopy, objdump) compile and
# check the rocm:gfx942 / rocm:gfx90a code objects and build their CPU emulation.
{ command -v clang-22 && command -v ld.lld-22 && command -v llvm-objcopy-22 \
    && command -v llvm-objdump-22; } >/dev/null || {
  apt-get update -q && apt-get install -y -q clang-22 lld-22 llvm-22; }
# --- end ROCm backend
# torch, so the runtime's torch-tensor paths run too (a CPU build where the machine's wheel
# store has one, as this project's machines do).
.venv/bin/python -m pip install -q torch==2.13.0
# The serving plugins' tests (tests/integrations) run the real vllm and sglang, each in a venv
# of its own.
for fw in vllm sglang; do
  t0=$SECONDS
  scripts/plugin_venv.sh $fw
  echo "$fw venv ready in $((SECONDS - t0)) s"
done
# --- deploy/ and the Dockerfile (tests/deploy) -------------------------------------------------
# buildah + debootstrap build the daemon image and run the daemon in it (test_image.py, about
# 5 minutes: deploy/image/build.sh); promtool (Debian's prometheus package) checks and
# unit-tests the alert rules; systemd-analyze verifies the systemd unit; kubernetes-validate
# (PyPI; it bundles the Kubernetes JSON schemas, so no network is needed) checks the manifests.
deploy_pkgs=()
command -v buildah >/dev/null || deploy_pkgs+=(buildah)
command -v debootstrap >/dev/null || deploy_pkgs+=(debootstrap)
command -v promtool >/dev/null || deploy_pkgs+=(prometheus)
command -v systemd-analyze >/dev/null || deploy_pkgs+=(systemd)
if ((${#deploy_pkgs[@]})); then apt-get update -q && apt-get install -y -q "${deploy_pkgs[@]}"; fi
.venv/bin/python -m pip install -q kubernetes-validate==1.37.0
# --- end deploy -----------------------------------------------------------------------------------
export TILED_REQUIRE_VLLM=1 TILED_REQUIRE_SGLANG=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
