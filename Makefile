# accordion-bench. Every target builds .venv from pyproject.toml first (once).
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
RUNS ?= results/runs
PYTEST_FLAGS ?=
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

.PHONY: install demo test test-fast lint clean report mutate

install: $(VENV_STAMP) ## create .venv with every dependency (pyproject.toml)

$(VENV_STAMP): pyproject.toml
	python3.11 -m venv .venv
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(VENV_STAMP)

demo: $(VENV_STAMP) ## 2-process DDP ResNet-18 on the embedded digits data, CPU (a few minutes)
	$(PY) -m torch.distributed.run --standalone --nproc-per-node 2 run.py experiment=demo

test: $(VENV_STAMP) ## the whole test suite (slow tests included), as CI runs it
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(PYTEST_FLAGS)

test-fast: $(VENV_STAMP) ## tests without the slow ones
	$(PY) -m pytest -q -m "not slow" $(PYTEST_FLAGS)

mutate: $(VENV_STAMP) ## mutation testing of the glue modules (mutmut) [GROUPS="hook lr ..."] -> results/mutation/
	$(PY) -m tests.mutate $(GROUPS)

lint: $(VENV_STAMP) ## ruff
	$(PY) -m ruff check .

clean: ## remove run outputs (keeps .venv)
	rm -rf outputs multirun wandb .pytest_cache

bench-compressors: $(VENV_STAMP) ## compressor speed on ResNet-18 gradients -> results/bench/compressors.{csv,md}
	$(PY) -m benchmarks.compressors

report: $(VENV_STAMP) ## tables, figures, report of the runs below RUNS [SWEEP=table1] [SCALE=tiny] [OUT=dir] -> results/<sweep>/
	$(PY) -m analysis.report $(RUNS) $(if $(SWEEP),--sweep $(SWEEP)) $(if $(SCALE),--scale $(SCALE)) $(if $(OUT),--out $(OUT))
