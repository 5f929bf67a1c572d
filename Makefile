# Two entry points, each doing its own set-up (a .venv in this folder):
#   make all    the main job: `snakemake all` on the default profile
#   make test   the test suite CI runs: all but the tests marked slow (each a longer variant of one that runs),
#               on TEST_WORKERS (2) pytest-xdist workers
#   make test-all  every test, the slow variants included
SHELL := /bin/bash
VENV := .venv/bin
# DeepSpeed JIT-builds its CPU ops once (~2 min); keep them across runs, in this checkout's venv (a build records
# the venv's paths: clones sharing one folder rebuild each other's ops; superoffload.ds_build.default_extensions_dir)
export TORCH_EXTENSIONS_DIR ?= $(abspath .venv)/torch_extensions

.PHONY: all test test-all setup lint figures ablation nightly report calibrate
all: setup
	$(VENV)/snakemake all

# the other workflow targets (docs/workflow.md)
figures ablation nightly report calibrate: setup
	$(VENV)/snakemake $@

# two pytest-xdist workers, each taking whole groups (a test module, or the modules that share the smoke sweep:
# tests/conftest.py); most tests wait on a subprocess's import and start-up, so two overlap well even on two cores
TEST_WORKERS ?= 2
test: setup
	$(VENV)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadscope --durations=40 tests

test-all: setup
	$(VENV)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope tests

setup:
	@scripts/bootstrap.sh bench,test

lint: setup
	$(VENV)/ruff check .
