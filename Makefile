# All set-up happens here: `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= agentwake.toml

.PHONY: run run-webhook test lint typecheck unit bench clean browser postgres

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# No PATH set-up: the bundled config's `command = "agentwake-demo"` is found next to .venv's Python.
run: $(STAMP)
	LITELLM_LOCAL_MODEL_COST_MAP=True $(BIN)/agentwake run -c $(CONFIG)

# Webhook delivery on this machine: the demo server over HTTPS callbacks to agentwake's receiver.
run-webhook: $(STAMP)
	$(BIN)/python -m examples.webhook_demo

lint: $(STAMP)
	$(BIN)/ruff check agentwake examples tests bench
	$(BIN)/ruff format --check agentwake examples tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# One worker per core, at most 4 (pytest-xdist): most tests wait on subprocesses and sockets.
# `make unit PYTEST_WORKERS=0` runs them in this process, one after another.
PYTEST_WORKERS ?= auto
unit: $(STAMP) browser postgres
	LITELLM_LOCAL_MODEL_COST_MAP=True $(BIN)/pytest -n $(PYTEST_WORKERS) --maxprocesses 4

# tests/test_approvals_page.py drives Debian's chromium through playwright (installed with '.[dev]'):
# playwright's own browser download cannot work here. Installed once when root; otherwise the test skips.
CHROMIUM := /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for tests/test_approvals_page.py"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: could not install chromium: tests/test_approvals_page.py will be skipped" >&2; \
	else \
		echo "note: no $(CHROMIUM) and not root to apt-get it: tests/test_approvals_page.py will be skipped" >&2; \
	fi

# tests/_postgres.py starts a throwaway server from Debian's binaries (newest /usr/lib/postgresql/*/bin)
# for the PostgreSQL half of tests/test_store_contract.py. Installed once when root; otherwise those tests fail.
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql (apt-get) for the PostgreSQL store tests"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
		echo "warning: could not install postgresql: the PostgreSQL store tests will fail" >&2; \
	else \
		echo "note: no /usr/lib/postgresql/*/bin/initdb and not root to apt-get it: the PostgreSQL store tests will fail" >&2; \
	fi

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/poll_drain.py
	$(BIN)/python bench/push_latency.py
	$(BIN)/python bench/pipeline_overhead.py
	$(BIN)/python bench/webhook_ingest.py
	$(BIN)/python bench/cli_startup.py
	$(BIN)/python bench/authority_check.py
	$(BIN)/python bench/soak.py --seconds 30
	$(BIN)/python bench/scale_out.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
