# accordion-bench. Every target builds .venv from pyproject.toml first (once).
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_FLAGS ?=
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

# Sweeps (make reproduce-<sweep>): SCALE=paper|tiny, LAUNCHER=local|slurm|slurm_local|submitit_local,
# SEEDS=0,1,2 (default: the sweep's own), WORKERS=ranks per run, DATA_ROOT=folder of the datasets,
# ONLY="model=resnet18" (part of a sweep), RUNS=results/runs (where the run directories go),
# OUT=folder (make claim-<name>: its figure and table; default results/claims/<name>).
SWEEPS := table1 table2 table3 table4 table5 table6 fig9 fig10 adacomp ablation_ef
SCALE ?= paper
LAUNCHER ?= local
SEEDS ?=
WORKERS ?= $(if $(filter tiny,$(SCALE)),2,4)
DATA_ROOT ?=
RUNS ?= results/runs
ONLY ?=
WORKERS_KEY = $(if $(filter local,$(LAUNCHER)),nproc_per_node,tasks_per_node)
RUN_SWEEP = $(if $(DATA_ROOT),DATA_ROOT=$(DATA_ROOT) )$(PY) run.py -m scale=$(SCALE) \
	launcher=$(LAUNCHER) hydra.launcher.$(WORKERS_KEY)=$(WORKERS) runs_root=$(RUNS) \
	$(if $(SEEDS),seed=$(SEEDS))
# The tables and figures of a sweep's runs (analysis/report.py) -> results/<sweep>/
REPORT = $(PY) -m analysis.report $(RUNS) --sweep $(1) --scale $(SCALE)

# The papers' figure-level claims (make claim-<name>): conf/sweep/claim_<name>.yaml at tiny scale.
# On 2 CPU ranks, then analysis/claims_<name>.py -> results/claims/<name>/{<name>.png,table.md}:
CLAIMS := residues fig2b overlap batch
# AdaComp's claims on simulated learners: each run one process of trainer.workers learners
# (launcher=simulated); figure and table -> results/claims/<name>/ (analysis/claims.py):
SIM_CLAIMS := learners minibatch

.PHONY: install demo test test-fast lint clean stress mutate report bench-compressors bench-e2e \
	bench-tta plan dashboard reproduce-all bench-simulated-memory claims slurm-up slurm-down \
	test-slurm \
	$(addprefix reproduce-,$(SWEEPS)) $(addprefix claim-,$(CLAIMS) $(SIM_CLAIMS))

install: $(VENV_STAMP) ## create .venv with every dependency (pyproject.toml)

$(VENV_STAMP): pyproject.toml
	python3.11 -m venv .venv
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(VENV_STAMP)

demo: $(VENV_STAMP) ## tiny Table 1 in small: ResNet-18, rank 2 / rank 1 / Accordion, 2 CPU ranks each
	$(MAKE) --no-print-directory reproduce-table1 SCALE=tiny SEEDS=0 ONLY=model=resnet18 \
		VENV_STAMP=$(VENV_STAMP)

$(addprefix reproduce-,$(SWEEPS)): reproduce-%: $(VENV_STAMP) ## sweep % (conf/sweep/%.yaml), then its report
	@$(RUN_SWEEP) sweep=$* $(ONLY); status=$$?; $(call REPORT,$*); exit $$status

reproduce-all: $(addprefix reproduce-,$(SWEEPS)) ## every sweep, one after another

$(addprefix claim-,$(CLAIMS)): claim-%: $(VENV_STAMP) ## claim % (conf/sweep/claim_%.yaml, tiny, 2 ranks), then its figure -> results/claims/%/
	@$(PY) run.py -m sweep=claim_$* scale=tiny launcher=local hydra.launcher.nproc_per_node=2 \
		runs_root=$(RUNS) $(ONLY); status=$$?; $(PY) -m analysis.claims_$* $(RUNS) --scale tiny \
		--out $(or $(OUT),results/claims/$*); \
		exit $$status

claims: $(addprefix claim-,$(CLAIMS) $(SIM_CLAIMS)) ## every claim sweep, one after another

$(addprefix claim-,$(SIM_CLAIMS)): claim-%: $(VENV_STAMP) ## AdaComp claim % on simulated learners (conf/sweep/claim_%.yaml), then its figure and table -> results/claims/%/
	@$(PY) run.py -m sweep=claim_$* runs_root=$(RUNS) $(ONLY); status=$$?; \
	$(PY) -m analysis.claims $* $(RUNS)/claim_$*/tiny --out $(or $(OUT),results/claims/$*); \
	exit $$status

plan: $(VENV_STAMP) ## what `make reproduce-$(SWEEP)` would run (runs, complete ones, compute)
	@$(RUN_SWEEP) sweep=$(SWEEP) $(ONLY) hydra.sweeper.dry_run=true

dashboard: $(VENV_STAMP) ## build the W&B workspace of SWEEP's runs (needs WANDB_API_KEY, online)
	$(PY) -m analysis.dashboard $(SWEEP) $(if $(ENTITY),--entity $(ENTITY)) $(if $(PROJECT),--project $(PROJECT))

test: $(VENV_STAMP) ## the whole test suite (slow tests included), as CI runs it
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(PYTEST_FLAGS)

test-fast: $(VENV_STAMP) ## tests without the slow ones
	$(PY) -m pytest -q -m "not slow" $(PYTEST_FLAGS)

slurm-up: ## a single-node Slurm on this machine (root, Debian's packages; docs/slurm.md): for launcher=slurm_local and make test-slurm
	@slurm/up.sh

slurm-down: ## stop make slurm-up's Slurm (its jobs are cancelled)
	@slurm/down.sh

test-slurm: $(VENV_STAMP) ## the tests against a real Slurm (make slurm-up first) and two nodes as network namespaces (root)
	$(PY) -m pytest -q --slurm -m slurm $(PYTEST_FLAGS)

mutate: $(VENV_STAMP) ## mutation testing of the glue modules (mutmut) [GROUPS="hook lr ..."] -> results/mutation/
	$(PY) -m tests.mutate $(GROUPS)

lint: $(VENV_STAMP) ## ruff
	$(PY) -m ruff check .

clean: ## remove ad-hoc run outputs (keeps .venv and the sweeps' results/runs)
	rm -rf outputs multirun wandb .pytest_cache

bench-simulated-memory: $(VENV_STAMP) ## peak RSS of simulated learners, W = 1/8/32/128 x every compressor -> results/bench/simulated_memory.{csv,md}
	$(PY) -m benchmarks.simulated_memory

bench-compressors: $(VENV_STAMP) ## compressor speed on ResNet-18 gradients -> results/bench/compressors.{csv,md}
	$(PY) -m benchmarks.compressors

report: $(VENV_STAMP) ## tables, figures, report of the runs below RUNS [SWEEP=table1] [SCALE=tiny] [OUT=dir] -> results/<sweep>/
	$(PY) -m analysis.report $(RUNS) $(if $(SWEEP),--sweep $(SWEEP)) $(if $(filter-out file,$(origin SCALE)),--scale $(SCALE)) $(if $(OUT),--out $(OUT))

bench-e2e: $(VENV_STAMP) ## DDP steps over a rate-limited link (root: ip netns) -> results/bench/e2e.*, projection.*
	$(PY) -m benchmarks.e2e
	$(PY) -m benchmarks.projection

bench-tta: $(VENV_STAMP) ## time to accuracy of run.py jobs over the link at ratio 4 (JOBS=file.yaml) -> results/bench/tta.*
	$(PY) -m benchmarks.tta $(if $(JOBS),--jobs $(JOBS))

stress: $(VENV_STAMP) ## 50 back-to-back 2-rank runs over every compressor x scheduler -> results/bench/stress.{csv,md}; every test marked stress (faults, preemption, simulated learners for every compressor); the config fuzz with fresh random examples
	$(PY) -m benchmarks.stress
	$(PY) -m pytest -q --stress -m stress tests $(PYTEST_FLAGS)
	HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q tests/test_config_fuzz.py $(PYTEST_FLAGS)
