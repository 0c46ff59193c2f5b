# Two commands matter: `make run` and `make test`. Each installs what is missing.
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test unit venv prepare bench clean

run: venv
	$(PY) scripts/stack.py

test: venv prepare
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

# llama-server and the model, cached outside the clone (scripts/prepare.py).
prepare:
	@$(PYTHON) scripts/prepare.py model >/dev/null
	@$(PYTHON) scripts/prepare.py llama-server >/dev/null

bench: venv prepare
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache
