# Two commands for a fresh clone: `make serve` and `make test`.
# Each creates .venv and installs what it needs; nothing is installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= models/fr-en
BUNDLES ?= build/models
BUNDLE := $(BUNDLES)/$(notdir $(MODEL))

.PHONY: serve translate bundle distill gpu-round-inputs test test-slow test-all bench clean loadtest

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The full developer install: serving, torch (export), test tools, and the baselines (bench).
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[export,dev,bench]'
	touch $@

# The ONNX bundle is a build product: exported from the committed checkpoint when missing or
# older than the checkpoint or the exporter (a new bundle format needs a new export).
$(BUNDLE)/bundle.json: $(MODEL)/model.safetensors $(MODEL)/config.json $(VENV)/.dev-installed \
		export/onnx_export.py export/fused_step.py export/shortlist.py $(wildcard export/model/*.py) $(wildcard $(MODEL)/description.txt) \
		$(wildcard $(MODEL)/shortlist.npz) $(wildcard $(MODEL)/confidence.json)
	$(BIN)/nmt export --checkpoint $(MODEL) --out $(BUNDLE) --int8

bundle: $(BUNDLE)/bundle.json

## Serve translations over HTTP from the committed model (http://127.0.0.1:8000, docs at /docs).
serve: $(BUNDLE)/bundle.json
	NMT_MODEL_DIR=$(BUNDLES) $(BIN)/nmt serve

## Translate stdin (one sentence a line) to stdout, in order, on the ONNX engine.
translate: $(BUNDLE)/bundle.json
	@$(BIN)/nmt translate --model-dir $(BUNDLE) --beam-size 4

## The fast test suite (the default).
test: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

## Tests marked slow (minutes): whole test sets, real servers. CI runs them too.
test-slow: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -q -m slow || [ $$? -eq 5 ]  # 5: no test is marked slow

test-all: test test-slow

# Locust into the same venv, but only ever run as its own process (loadtest/run.py).
$(VENV)/.loadtest-installed: pyproject.toml | $(VENV)/.dev-installed
	$(BIN)/pip install --quiet -e '.[loadtest]'
	touch $@

## Load test: a local server, Locust headless for LOADTEST_TIME, reports under reports/loadtest/
## (CSV, HTML, summary); fails on any failed request. LOADTEST_ARGS adds run.py options.
LOADTEST_TIME ?= 30s
LOADTEST_USERS ?= 8
loadtest: $(BUNDLE)/bundle.json $(VENV)/.loadtest-installed
	$(BIN)/python loadtest/run.py --model-dir $(BUNDLES) --users $(LOADTEST_USERS) \
		--run-time $(LOADTEST_TIME) $(LOADTEST_ARGS)

## Ours vs CTranslate2 vs transformers on the same weights (minutes; writes docs/benchmarks.md).
## bench/ is not installed: it runs from the repository root. BENCH_ARGS adds its options.
bench: $(VENV)/.dev-installed
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

## Sequence-level distillation: the committed model's beam-4 translations of Multi30k's training
## sources, a student's training targets (docs/training.md), with the real val set to validate
## on. Written outside the repository, like the data: nmt train --data-dir $(DISTILLED).
## TEACHERS="models/fr-en build/teachers/A ...": those models (sharing one tokenizer) decode as
## an ensemble in torch instead (the mean of their probabilities; slower than the bundle).
MULTI30K ?= ../shared/data/multi30k
DISTILLED ?= ../distilled/fr-en
TEACHERS ?=
TEACHER_COMMAND = $(if $(strip $(TEACHERS)),--checkpoint $(TEACHERS) --device cpu,--model-dir $(BUNDLE))
distill: $(if $(strip $(TEACHERS)),$(VENV)/.dev-installed,$(BUNDLE)/bundle.json)
	mkdir -p $(DISTILLED)
	$(BIN)/nmt translate $(TEACHER_COMMAND) --beam-size 4 --batch-size 64 \
		< $(MULTI30K)/train.fr > $(DISTILLED)/train.en.partial
	mv $(DISTILLED)/train.en.partial $(DISTILLED)/train.en
	cp $(MULTI30K)/train.fr $(MULTI30K)/val.fr $(MULTI30K)/val.en $(DISTILLED)/

## What the rounds for a lent GPU machine read there (export/distill_round.py,
## export/jackknife_round.py), to carry: Multi30k, the committed model's translations of its
## training sources, and the wheels that machine's image lacks. The command to run there is in
## export/jackknife_round.py's docstring.
gpu-round-inputs: $(VENV)/.dev-installed
	$(MAKE) distill DISTILLED=build/distilled/fr-en
	mkdir -p build/multi30k
	cp $(MULTI30K)/*.fr $(MULTI30K)/*.en build/multi30k/
	$(BIN)/python -m export.jackknife_round wheels --into .whl

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
