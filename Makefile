# Two commands matter: `make run` and `make test`. Each installs what is missing.
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test unit venv prepare browser crd bench results clean

run: venv
	$(PY) scripts/stack.py

test: venv prepare browser crd
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.lock
	@echo "[make] creating $(VENV) with the pinned, hash-checked dependencies (about a minute)"
	@start=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	$(PY) -m pip install --progress-bar on --require-hashes -r requirements.lock \
		| grep -v -e '^Requirement already' -e '^WARNING: Location' && \
	echo "[make] $(VENV) ready in $$(( $$(date +%s) - start ))s"
	@$(PY) -c "import aiohttp, pydantic, orjson, prometheus_client" && touch $@

# llama-server and the model, cached outside the clone (scripts/prepare.py); for the
# tests also Debian's chromium (the playground's browser test).
prepare:
	@$(PYTHON) scripts/prepare.py model >/dev/null
	@$(PYTHON) scripts/prepare.py llama-server >/dev/null

browser:
	@$(PYTHON) scripts/prepare.py browser >/dev/null

# The published schemas of the Kubernetes custom resources (ServiceMonitor, ScaledObject)
# in deploy/kubernetes, for tests/deploy/test_deploy_kubernetes.py; npm's cache is ~/.npm.
CRD := tests/deploy/crd
crd: $(CRD)/node_modules/.installed

$(CRD)/node_modules/.installed: $(CRD)/package-lock.json
	@cd $(CRD) && npm ci --no-audit --no-fund --loglevel=error >/dev/null && touch node_modules/.installed

bench: venv prepare
	$(PY) bench/overhead.py

# Every figure in bench/RESULTS.md, from the code as it is (about 35 minutes on 2 cores).
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
