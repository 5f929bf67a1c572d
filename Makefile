# Two entry points, each doing its own set-up (a .venv in this folder):
#   make all    the main job: `snakemake all` on the default profile
#   make test   the test suite CI runs: all but the tests marked slow (each a longer variant of one that runs)
#   make test-all  every test, the slow variants included
SHELL := /bin/bash
VENV := .venv/bin
# DeepSpeed JIT-builds its CPU ops once (~2 min); keep them across runs and clones
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/superoffload/torch_extensions

.PHONY: all test test-all setup lint figures ablation nightly report calibrate
all: setup
	$(VENV)/snakemake all

# the other workflow targets (docs/workflow.md)
figures ablation nightly report calibrate: setup
	$(VENV)/snakemake $@

test: setup
	$(VENV)/python -m pytest -q -m "not slow" --durations=40 tests

test-all: setup
	$(VENV)/python -m pytest -q tests

setup:
	@scripts/bootstrap.sh bench,test

lint: setup
	$(VENV)/ruff check .
