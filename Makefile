# Two commands matter: `make run` and `make test`. Each installs what is missing.
# `make run` installs only requirements/runtime.lock (what the proxy and the single image
# run); `make test`, `check`, `unit`, `bench`, `results` and `slow-model` install
# requirements/dev.lock (runtime plus the tools and test extras). Both locks are pinned
# and hash-checked, and `make lock` regenerates both from pyproject.toml (see the `lock`
# target below).
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
RUNTIME_LOCK := requirements/runtime.lock
DEV_LOCK     := requirements/dev.lock

.PHONY: run test test-containers unit check venv venv-runtime lock prepare slow-model test-models browser crd bench \
	results clean

run: venv-runtime
	$(PY) scripts/stack.py

test: venv check prepare test-models browser crd
	$(PY) -m pytest $(PYTEST_ARGS)

# The container suite (tests/containers; docs/operations.md, "The container suite"): the
# images built from the project's own Dockerfiles and run as users run them (compose, the
# single image as SageMaker runs it, two containers). Needs a Docker engine: it skips
# without one, unless CI=true or SEMIF_CONTAINERS_INSTALL=1 lets it install and start one.
test-containers: venv prepare
	$(PY) -m pytest tests/containers --containers $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The static checks, first in `test` (seconds, before any download): ruff's lint and its
# formatter in check mode over the paths [tool.ruff] includes, and mypy, strict on the
# files [tool.mypy] names (all three configured in pyproject.toml).
check: venv
	$(PY) -m ruff check
	$(PY) -m ruff format --check
	$(PY) -m mypy

# The development install (`venv`, what test, unit, bench and results need) and the
# runtime-only one (`venv-runtime`, for run), in the same $(VENV). dev.lock holds every
# runtime.lock pin at the same version and hash, so a dev install satisfies run as well.
venv: $(VENV)/.dev
venv-runtime: $(VENV)/.runtime

# $(1): the lock, $(2): what it is for. pip skips what is already installed.
define install_lock
	@echo "[make] installing $(1) into $(VENV), pinned and hash-checked ($(2))"
	@start=$$(date +%s); \
	{ [ -x $(PY) ] || $(PYTHON) -m venv $(VENV); } && \
	$(PY) -m pip install --progress-bar on --require-hashes -r $(1) \
		| { grep -v -e '^Requirement already' -e '^WARNING: Location' || true; } && \
	echo "[make] $(VENV) ready in $$(( $$(date +%s) - start ))s"
	@$(PY) -c "import aiohttp, pydantic, orjson, prometheus_client, uvloop"
endef

$(VENV)/.runtime: $(RUNTIME_LOCK)
	$(call install_lock,$(RUNTIME_LOCK),runtime only: about 15 s)
	@touch $@

$(VENV)/.dev: $(DEV_LOCK)
	$(call install_lock,$(DEV_LOCK),runtime plus the tools and test extras: about a minute)
	@$(PY) -c "import pytest, httpx, matplotlib" && touch $@ $(VENV)/.runtime

# Regenerate both locks from pyproject.toml with pip-compile (pip-tools, installed into a
# throwaway venv): runtime.lock is [project.dependencies] plus the `image` extra
# (supervisor); dev.lock adds the tools and test extras, constrained to runtime.lock
# so both agree on every shared package. Pins already in a lock are kept; to move them,
# edit pyproject.toml or pass LOCK_ARGS=--upgrade (or --upgrade-package NAME).
# Needs Python 3.11 as $(PYTHON) (pyproject's requires-python).
PIP_TOOLS := pip-tools==7.6.2
LOCK_ARGS ?=
COMPILE := --quiet --generate-hashes --no-emit-find-links --no-emit-index-url --strip-extras
lock:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp" && \
	"$$tmp/bin/pip" install --quiet $(PIP_TOOLS) 2>&1 | { grep -v '^WARNING: Location' || true; } && \
	export CUSTOM_COMPILE_COMMAND="make lock" && \
	"$$tmp/bin/pip-compile" $(COMPILE) $(LOCK_ARGS) --extra=image \
		--output-file=$(RUNTIME_LOCK) pyproject.toml && \
	"$$tmp/bin/pip-compile" $(COMPILE) $(LOCK_ARGS) --extra=image --extra=tools --extra=test \
		--constraint=$(RUNTIME_LOCK) --output-file=$(DEV_LOCK) pyproject.toml && \
	echo "[make] $(RUNTIME_LOCK) and $(DEV_LOCK) written"

# llama-server and the model, cached outside the clone (scripts/prepare.py); for the
# tests also Debian's chromium (the playground's browser test).
prepare:
	@$(PYTHON) scripts/prepare.py model >/dev/null
	@$(PYTHON) scripts/prepare.py llama-server >/dev/null

browser:
	@$(PYTHON) scripts/prepare.py browser >/dev/null

# The slow model: the default model with its blocks run SLOW_BLOCKS times and its answers
# unchanged (scripts/slow_model.py, docs/slow-model.md), cached outside the clone; prints
# its path (the default model is fetched if missing). `test` makes the ones its tests read:
# K = 2 (tests/integration/test_slow_model.py), SLOW_BLOCKS (tests/realspeed) and K = 2
# without zeroing (garbage answers: tests/realspeed's widening reads).
SLOW_BLOCKS ?= 8
slow-model: venv
	@$(PY) scripts/slow_model.py --blocks $(SLOW_BLOCKS)

test-models: venv
	@$(PY) scripts/slow_model.py --blocks 2 $(SLOW_BLOCKS) >/dev/null
	@$(PY) scripts/slow_model.py --blocks 2 --no-zero >/dev/null

# The published schemas of the Kubernetes custom resources (ServiceMonitor, ScaledObject)
# in deploy/kubernetes, for tests/deploy/test_deploy_kubernetes.py; npm's cache is ~/.npm.
CRD := tests/deploy/crd
crd: $(CRD)/node_modules/.installed

$(CRD)/node_modules/.installed: $(CRD)/package-lock.json
	@cd $(CRD) && npm ci --no-audit --no-fund --loglevel=error >/dev/null && touch node_modules/.installed

bench: venv prepare
	$(PY) bench/overhead.py

# Every figure in bench/RESULTS.md, from the code as it is (about 22 minutes on 2 cores).
SOAK_S ?= 600
OUTDIR := bench/out
results: venv prepare
	mkdir -p $(OUTDIR)
	$(PY) bench/load.py
	$(PY) bench/load.py --concurrency 64 --duration 5 --out load_backpressure.json \
		--proxy-args '--max-active-decisions 4 --max-queued-decisions 8'
	$(PY) bench/load.py --soak $(SOAK_S)
	for b in overhead cpu shared_state; do \
		{ echo "$$ .venv/bin/python bench/$$b.py"; $(PY) bench/$$b.py; } > $(OUTDIR)/$$b.txt || exit 1; \
	done
	$(PY) bench/report.py

clean:
	rm -rf $(VENV) .pytest_cache $(CRD)/node_modules
