# hookwatch: `make run` shows the demo live, `make test` runs every test. `make help` lists all.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MAR := model_store/digits.mar
PYTEST_ARGS ?=

.PHONY: help deps venv mar run stop test check lint format unit integration clean eval-drift rules docs bench-scrape bench bench-quick dashboards-check soak

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## install the system parts if missing: Prometheus/promtool, docker-compose (for config checks), Java, curl, Node.js/npm
	@missing=""; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    || { echo "could not install$$missing; install them and retry" >&2; exit 1; }; \
	fi

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# torch first, pinned: the core asks only torch>=2.1, which this build satisfies, so the
	@# install below adds nothing and never pulls a multi-GB build from the index.
	$(BIN)/python -m pip install -q 'torch==2.13.0'
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed ## create .venv and install hookwatch with its dev tools

# The profile is built with the serving hooks, so their feature code is part of the .mar too.
DRIFT_SRC := $(wildcard src/hookwatch/_drift/*.py src/hookwatch/_profile/*.py) src/hookwatch/_stats.py src/hookwatch/_hooks.py src/hookwatch/_config.py
$(MAR): $(BIN)/.installed $(wildcard src/hookwatch/tools/demo/*.py) $(DRIFT_SRC) handlers/hookwatch_handler.py models/digits/model-config.yaml
	$(BIN)/hookwatch build-demo

mar: $(MAR) ## train the demo CNN and archive it into model_store/

# exec: make's only child is hookwatch itself, so a SIGTERM make forwards reaches it (through
# sh it would not, and hookwatch would run on). Ctrl-C reaches both; hookwatch stops everything
# and exits 0, and so does make.
run: deps $(MAR) ## start TorchServe + exporter + Prometheus on loopback, send traffic, show live metrics
	exec $(BIN)/hookwatch run

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

test: deps $(MAR) check dashboards-check ## install into .venv and run every test
	$(BIN)/pytest -m "not gpu" $(PYTEST_ARGS)

# Grafana's published dashboard types (npm @grafana/schema, pinned with TypeScript in
# package-lock.json), installed once per lock file change; the check itself runs offline.
SCHEMA_CHECK := monitoring/grafana/schema-check
$(SCHEMA_CHECK)/node_modules/.installed: $(SCHEMA_CHECK)/package.json $(SCHEMA_CHECK)/package-lock.json
	cd $(SCHEMA_CHECK) && npm ci --no-audit --no-fund --ignore-scripts
	@touch $@

dashboards-check: deps $(SCHEMA_CHECK)/node_modules/.installed ## tsc: type-check monitoring/grafana/dashboards/*.json against Grafana's Dashboard type
	cd $(SCHEMA_CHECK) && node check.mjs

bench: $(MAR) ## overhead bench, full (~20 min): writes docs/bench/results.md (QUICK=1: bench-quick)
	$(BIN)/hookwatch bench $(if $(QUICK),--quick,)

bench-quick: $(MAR) ## overhead bench, quick CI mode (~2 min): writes build/bench-quick/results-quick.md
	$(BIN)/hookwatch bench --quick

rules: deps ## promtool: check and unit-test the alerting rules in monitoring/prometheus/
	promtool check config monitoring/prometheus/prometheus.yml
	cd monitoring/prometheus/tests && promtool test rules *.yml

docs: $(BIN)/.installed ## regenerate docs/metrics.md from src/hookwatch/_catalogue.py
	$(BIN)/hookwatch catalogue > docs/metrics.md

SOAK_SECONDS ?= 600
soak: deps $(MAR) ## soak, 10 min (SOAK_SECONDS): 70 % of capacity, bad requests, a worker killed; writes docs/soak/
	$(BIN)/hookwatch soak --seconds $(SOAK_SECONDS)

bench-scrape: $(MAR) ## exporter scrape time after 100 worker restarts: writes docs/bench/scrape.md
	$(BIN)/python -m hookwatch.tools.bench.scrape --out docs/bench/scrape.md

# Benchmark-only environment: alibi-detect 0.13 pins numpy<2 (BSL 1.1 licence, never a runtime
# dependency). torch is not installed again: a .pth file lends it the one from .venv.
EVAL_VENV := .venv-eval
$(EVAL_VENV)/.installed: $(BIN)/.installed
	@test -x $(EVAL_VENV)/bin/python || $(PYTHON) -m venv $(EVAL_VENV)
	$(EVAL_VENV)/bin/python -m pip install -q --upgrade pip
	$(EVAL_VENV)/bin/python -m pip install -q 'alibi-detect==0.13.0'
	$(BIN)/python -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
	  > "$$($(EVAL_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/zz_hookwatch_torch.pth"
	@touch $@

eval-drift: $(BIN)/.installed $(EVAL_VENV)/.installed ## drift detection vs alibi-detect, 5 draws: writes docs/eval-drift.md and .json (~20 min)
	$(BIN)/python -m hookwatch.tools.evaluation.run --out docs/eval-drift.md

clean: stop ## remove build outputs (keeps .venv)
	rm -rf build .run model_store/*.mar .pytest_cache .mypy_cache .ruff_cache
