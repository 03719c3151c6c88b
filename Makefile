# diffq: `make demo` runs the whole path on this machine's CPU; `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# torch is pinned for the dev/test install (the CPU build); CUDA images bring their own.
TORCH  ?= torch==2.13.0

.PHONY: install install-test demo test test-long test-soak test-all test-fast test-workers test-compose test-slurm image image-py311 lint docs format clean

# make install: what make demo needs (the venv and redis-server); the test targets add the
# tools only tests use (openssl, chromium, prometheus) through install-test
install: $(VENV)/.installed
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server from Debian's packages"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

install-test: install
	@command -v openssl >/dev/null || { \
	  echo "installing openssl from Debian's packages (the TLS test makes a certificate)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openssl >/dev/null; }
	@command -v chromium >/dev/null || { \
	  echo "installing chromium from Debian's packages (the dashboard test renders its pages)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }
	@command -v prometheus >/dev/null || { \
	  echo "installing prometheus from Debian's packages (the metrics test scrapes a run with it)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq prometheus >/dev/null; }

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "installing python3-venv from Debian's packages"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	@touch $@

demo: install
	@bash examples/demo.sh

# Each tier has a time budget on 2 cores (docs/testing.md); --durations shows a slow test the day it lands.
# make test: everything but the long variants, under 10 minutes; CI runs it, then test-long
test: install-test
	$(BIN)/pytest -q -m "not long" --durations=25

# the long variants and the full fault matrix: what make test leaves out (CI runs it too)
test-long: install-test
	$(BIN)/pytest -q -m "long and not soak" --durations=25

# repeated rounds, scale and the slowest recoveries: before a release and after touching recovery (not in CI)
test-soak: install-test
	$(BIN)/pytest -q -m soak --durations=25

test-all: install-test
	$(BIN)/pytest -q --durations=25

# every module's logic against real Redis and S3, no worker process (docs/testing.md)
test-fast: install-test
	$(BIN)/pytest -q -m "not slow and not worker"

# the end-to-end runs through real worker processes that are not slow
test-workers: install-test
	$(BIN)/pytest -q -m "worker and not slow"

# The shipped image and compose file, built and run on a real Docker engine on this host's CPU
# (tests/compose). Starts the engine with the shared script when `docker info` fails; the image
# takes torch from the default index (TORCH_INDEX_URL empty) where PyTorch's own is unreachable.
CONTAINER_ENGINE ?= ../shared/tools/container-engine.sh
IMAGE_ARGS ?= --build-arg TORCH_INDEX_URL=

image:
	@if [ -f "$(CONTAINER_ENGINE)" ]; then bash "$(CONTAINER_ENGINE)"; \
	 elif ! docker info >/dev/null 2>&1; then echo "no Docker engine answers (docker info) and no $(CONTAINER_ENGINE) to start one"; exit 1; fi
	@start=$$(date +%s); docker build -q $(IMAGE_ARGS) -t diffq:0.1.0 . >/dev/null && \
	 echo "image diffq:0.1.0 built in $$(( $$(date +%s) - start )) s, $$(docker image inspect -f '{{.Size}}' diffq:0.1.0 | awk '{printf "%.2f GB", $$1/1e9}')"
	@docker image prune -f --filter label=org.opencontainers.image.title=diffq >/dev/null  # the untagged previous build

# the same image on Python 3.11 (Debian 12), the oldest Python pyproject.toml allows: the
# constraints must resolve there too
PY311_BASE ?= localhost/debian-py311:bookworm
image-py311: image
	@BASE_RELEASE=bookworm bash "$(CONTAINER_ENGINE)" base $(PY311_BASE)
	@start=$$(date +%s); docker build -q $(IMAGE_ARGS) --build-arg BASE_IMAGE=$(PY311_BASE) -t diffq:py311 . >/dev/null && \
	 echo "image diffq:py311 built in $$(( $$(date +%s) - start )) s: $$(docker run --rm --entrypoint python3 diffq:py311 --version)"
	@docker image prune -f --filter label=org.opencontainers.image.title=diffq >/dev/null  # its untagged previous build

test-compose: install-test image
	$(BIN)/pytest -q tests/compose

# Workers as Slurm jobs on a real slurmctld + slurmd + munged started on this machine (one node,
# CPUs only; tests/slurm). Installs Debian's Slurm and munge when they are missing.
test-slurm: install-test
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null || { \
	  echo "installing slurmctld, slurmd, slurm-client and munge from Debian's packages"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	    slurmctld slurmd slurm-client munge >/dev/null; }
	$(BIN)/pytest -q -s tests/slurm

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile
	$(BIN)/python tests/docs_check.py
	$(BIN)/python bench/figures.py --check

# the measured figures in README and docs, rewritten from bench/results (bench/figures.py)
docs: install
	$(BIN)/python bench/figures.py --write

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache *.egg-info
