# diffq worker / producer / dashboard image: CUDA runtime, pinned Python packages, non-root.
#   docker build -t diffq .      (compose.yaml builds it for you)
# Model weights are never baked in: they download at run time into the /cache volume, with
# HF_TOKEN passed through the environment (compose takes it from .env).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc and the Python headers: torch.compile (the default speed levers on CUDA) builds Triton's
# kernel launcher with them at run time; without them a worker runs eagerly and says so
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/diffq
ENV PATH=/opt/diffq/bin:$PATH
RUN pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128

WORKDIR /app
COPY pyproject.toml README.md ./
COPY docker/constraints.txt docker/constraints.txt
COPY common common
COPY producer producer
COPY worker worker
RUN pip install -c docker/constraints.txt ".[dashboard,group,s3]"

RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin diffq \
    && mkdir -p /cache /data \
    && chown diffq:diffq /cache /data
USER diffq
ENV DIFFQ_CACHE=/cache/diffq \
    HF_HOME=/cache/huggingface \
    DIFFQ_OUTPUT=/data/out
VOLUME ["/cache"]

# one worker that leases a free GPU of this host (compose --scale worker=N spreads them)
CMD ["worker", "run", "--gpu-lease", "all"]
