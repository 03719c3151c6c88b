# diffq worker / producer / dashboard image: CUDA runtime, pinned Python packages, runs as a
# non-root user (the entrypoint drops to it).
#   docker build -t diffq:0.1.0 .                  (compose.yaml builds it for you)
# Both build arguments keep today's GPU image by default; a host that cannot reach PyTorch's
# own index builds with TORCH_INDEX_URL= (empty: the default index, e.g. PyPI's CUDA build).
# Model weights are never baked in: they download at run time into the /cache volume, with
# HF_TOKEN passed through the environment (compose takes it from .env).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}
# what `make image` prunes by: a rebuild leaves the previous diffq:0.1.0 untagged (5.8 GB)
LABEL org.opencontainers.image.title=diffq

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc and the Python headers: torch.compile (the default speed levers on CUDA) builds Triton's
# kernel launcher with them at run time; without them a worker runs eagerly and says so.
# setpriv (util-linux) lets the entrypoint drop from root to the image's user.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# the distribution's packages follow the pinned base image's release (no per-package pins)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
       ca-certificates util-linux \
    && rm -rf /var/lib/apt/lists/*

# ubuntu:24.04 (and so nvidia/cuda:*-ubuntu24.04) already has user `ubuntu` with uid 1000: take
# that uid over under our name, or make it where the base has none (Debian)
RUN if getent passwd 1000 >/dev/null; then \
        old=$(getent passwd 1000 | cut -d: -f1); \
        groupmod -n diffq "$(id -gn "$old")" && usermod -l diffq -d /home/diffq -m -s /usr/sbin/nologin "$old"; \
    else \
        useradd --create-home --uid 1000 --user-group --shell /usr/sbin/nologin diffq; \
    fi \
    && mkdir -p /cache /data \
    && chown diffq:diffq /cache /data

# one pip on every base: Debian 12's venv brings pip 23.0, whose resolver backtracked for over
# 25 minutes on these constraints (measured on a Debian 12 stand-in) where 25.1 resolves at once
RUN python3 -m venv /opt/diffq && /opt/diffq/bin/pip install --no-cache-dir "pip==25.1.1"
ENV PATH=/opt/diffq/bin:$PATH
# torch first, alone: its layer (several GB) stays cached while the project's code changes
# (pinned: TORCH_VERSION; hadolint cannot read a pin through a build argument).
# Cut in the same layer, nothing that runs uses them: Triton's static CUPTI libraries (74 MB,
# for linking Triton itself; its profiler loads the shared ones) and test suites of sympy,
# networkx and numpy (tests are never imported).
# hadolint ignore=DL3013
RUN pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    && find /opt/diffq -path '*/triton/backends/nvidia/lib/cupti/*_static.a' -delete \
    && find /opt/diffq -type d -name tests \( -path '*/sympy/*' -o -path '*/networkx/*' -o -path '*/numpy/*' \) \
       -prune -exec rm -rf {} +

WORKDIR /app
COPY docker/constraints.txt docker/constraints.txt
COPY pyproject.toml README.md ./
COPY common common
COPY producer producer
COPY worker worker
RUN pip install -c docker/constraints.txt ".[dashboard,group,s3]" \
    && find /opt/diffq -type d -name tests \( -path '*/sympy/*' -o -path '*/networkx/*' -o -path '*/numpy/*' \) \
       -prune -exec rm -rf {} +
COPY docker/entrypoint.sh /usr/local/bin/diffq-entrypoint

ENV DIFFQ_CACHE=/cache/diffq \
    HF_HOME=/cache/huggingface \
    DIFFQ_OUTPUT=/data/out
VOLUME ["/cache"]

# starts as root only to hand /data and /cache to user diffq, then runs the command as diffq
ENTRYPOINT ["diffq-entrypoint"]
# one worker that leases a free GPU of this host (compose --scale worker=N spreads them)
CMD ["worker", "run", "--gpu-lease", "all"]
