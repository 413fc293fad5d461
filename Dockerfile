# The tiled compile daemon (`tiled serve`). docs/operations.md says how to build, run and deploy
# it; deploy/image/build.sh builds it without a Docker engine (debootstrap + buildah).
#
#   docker build -t tiled:0.1.0 .        (BuildKit, Docker's default builder since 23.0)
#   install -d -o 10001 -g 10001 -m 0755 /run/tiled     (the socket's host directory)
#   docker run -v /run/tiled:/run/tiled -v tiled-cache:/var/cache/tiled -p 9464:9464 tiled:0.1.0
#
# Stage 1 builds the tiled wheel and installs it with the compiler extra into a virtual
# environment; stage 2 copies that environment onto a base with only what the daemon runs:
# python3, and gcc (+ libc headers) to link CPU kernels. CUDA kernels compile through NVRTC
# (pip wheels), so no CUDA toolkit is installed: see docs/operations.md, "What the image
# compiles". Nothing secret is copied in (.dockerignore); tokens and TLS keys are mounted.

ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/tiled
COPY pyproject.toml README.md /src/
COPY tiled /src/tiled
COPY deploy/image/constraints.txt /src/constraints.txt
# The versions the image was tested with are pinned in constraints.txt (apache-tvm is pinned
# by pyproject.toml itself). nvidia-cuda-nvrtc compiles CUDA C++ to cubins; the kernels'
# headers come from nvidia-cuda-runtime (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h) and
# nvidia-cuda-cccl (libcu++: cuda/std/*).
# A network that reaches PyPI through a TLS-inspecting proxy passes its CA bundle as the build
# secret pip_ca (`--secret id=pip_ca,src=FILE`): mounted for this step only, in no layer.
RUN --mount=type=secret,id=pip_ca \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && /opt/tiled/bin/pip wheel --no-deps --wheel-dir /wheels /src \
 && /opt/tiled/bin/pip install --constraint /src/constraints.txt \
      "$(ls /wheels/tiled-*.whl)[server,cuda]" \
      nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-cccl \
 && /opt/tiled/bin/python -c "import tiled.compiler, tiled.server.app"

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tiled" \
      org.opencontainers.image.description="tiled compile daemon: Tile IR over gRPC to cubins and CPU shared libraries" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/operations.md"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man
# A fixed uid, so that hostPath directories can be prepared for it and serving processes can
# run as it: the socket is mode 0600, and clients trust only a socket of their own uid or root.
RUN groupadd --system --gid 10001 tiled \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tiled --create-home \
      --shell /usr/sbin/nologin tiled \
 && install -d -o 10001 -g 10001 -m 0755 /run/tiled /var/cache/tiled
COPY --from=build /opt/tiled /opt/tiled
# NVRTC looks for headers under <CUDA home>/include and include/cccl (tiled.compiler.toolchain
# .nvcc); the runtime and cccl wheels' shared tree (nvidia/cu13) is that home here.
RUN ln -s "$(/opt/tiled/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13" /usr/local/cuda
ENV PATH=/opt/tiled/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    TILED_SOCKET=/run/tiled/tiled.sock \
    TILED_CACHE_DIR=/var/cache/tiled \
    TILED_CUDA_COMPILER=nvrtc
VOLUME ["/run/tiled", "/var/cache/tiled"]
USER 10001:10001
WORKDIR /var/lib/tiled
# 9464: Prometheus /metrics. 50051: the optional --tcp listener (TLS + token).
EXPOSE 9464 50051
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD ["tiled", "status", "--probe", "--timeout", "5"]
ENTRYPOINT ["tiled", "serve"]
CMD ["--metrics-port", "9464", "--metrics-addr", "0.0.0.0"]
