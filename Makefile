# hookwatch: `make run` shows the demo live, `make test` runs every test. `make help` lists all.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MAR := model_store/digits.mar
PYTEST_ARGS ?=

.PHONY: help deps venv mar run stop test check lint format unit integration clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## install the system parts if missing: Prometheus/promtool, docker-compose (for config checks), Java
	@missing=""; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    || { echo "could not install$$missing; install them and retry" >&2; exit 1; }; \
	fi

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed ## create .venv and install hookwatch with its dev tools

$(MAR): $(BIN)/.installed $(wildcard src/hookwatch/demo/*.py) handlers/hookwatch_handler.py models/digits/model-config.yaml
	$(BIN)/hookwatch build-demo

mar: $(MAR) ## train the demo CNN and archive it into model_store/

run: deps $(MAR) ## start TorchServe + exporter + Prometheus on loopback, send traffic, show live metrics
	$(BIN)/hookwatch run

stop: ## stop everything `make run` started (by recorded pid)
	@if [ -x $(BIN)/hookwatch ]; then $(BIN)/hookwatch stop; else echo "nothing to stop"; fi

lint: $(BIN)/.installed ## ruff lint + format check
	$(BIN)/ruff check src tests handlers
	$(BIN)/ruff format --check src tests handlers

format: $(BIN)/.installed ## apply ruff formatting and safe fixes
	$(BIN)/ruff format src tests handlers
	$(BIN)/ruff check --fix src tests handlers

check: lint ## lint + mypy strict on the package
	$(BIN)/mypy

unit: $(BIN)/.installed ## unit tests only (no Java, no Prometheus)
	$(BIN)/pytest -m "not integration and not gpu" $(PYTEST_ARGS)

integration: deps $(MAR) ## integration tests against real TorchServe, Prometheus and promtool
	$(BIN)/pytest -m "integration" $(PYTEST_ARGS)

test: deps $(MAR) check ## install into .venv and run every test
	$(BIN)/pytest -m "not gpu" $(PYTEST_ARGS)

clean: stop ## remove build outputs (keeps .venv)
	rm -rf build .run model_store/*.mar .pytest_cache .mypy_cache .ruff_cache
