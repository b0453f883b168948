# Two commands for a fresh clone: `make translate` (or `make serve`) and `make test`.
# Each creates .venv and installs what it needs; nothing is installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= models/fr-en

.PHONY: translate test test-slow test-all lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The full developer install: serving, torch (export extra) and test tools.
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[export,dev]'
	touch $@

## Translate stdin (one sentence a line) with the committed model, in order, to stdout.
translate: $(VENV)/.dev-installed
	@$(BIN)/nmt translate --checkpoint $(MODEL) --beam-size 4

## The fast test suite (the default).
test: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

## Tests marked slow (minutes): whole test sets, real servers. CI runs them too.
test-slow: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -q -m slow || [ $$? -eq 5 ]  # 5: no test is marked slow

test-all: test test-slow

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
