# accordion-bench. Every target builds .venv from pyproject.toml first (once).
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
PYTEST_FLAGS ?=
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

# Sweeps (make reproduce-<sweep>): SCALE=paper|tiny, LAUNCHER=local|simulated|slurm|submitit_local
# (tiny: simulated, each run one process of WORKERS simulated learners, bit for bit what WORKERS
# ranks give; LAUNCHER=local: WORKERS torchrun ranks per run), SEEDS=0,1,2 (default: the sweep's
# own), WORKERS=ranks (or simulated learners) per run, PARALLEL=runs at once (local and simulated;
# tiny: 2), DATA_ROOT=folder of the datasets, ONLY="model=resnet18" (part of a sweep),
# RUNS=results/runs (where the run directories go), OUT=folder (its report, or make
# claim-<name>'s figure and table; default results/<sweep>/, results/claims/<name>/).
SWEEPS := table1 table2 table3 table4 table5 table6 fig9 fig10 adacomp ablation_ef
SCALE ?= paper
LAUNCHER ?= $(if $(filter tiny,$(SCALE)),simulated,local)
SEEDS ?=
WORKERS ?= $(if $(filter tiny,$(SCALE)),2,4)
PARALLEL ?= $(if $(filter simulated,$(LAUNCHER)),2,1)
DATA_ROOT ?=
RUNS ?= results/runs
ONLY ?=
WORKERS_KEY = $(if $(filter local,$(LAUNCHER)),hydra.launcher.nproc_per_node,$(if \
	$(filter simulated,$(LAUNCHER)),trainer.workers,hydra.launcher.tasks_per_node))
LAUNCH_ARGS = launcher=$(LAUNCHER) $(WORKERS_KEY)=$(WORKERS) \
	$(if $(filter local simulated,$(LAUNCHER)),hydra.launcher.parallel=$(PARALLEL))
SEED_ARG = $(if $(SEEDS),seed=$(SEEDS))
RUN_SWEEP = $(if $(DATA_ROOT),DATA_ROOT=$(DATA_ROOT) )$(PY) run.py -m scale=$(SCALE) \
	$(LAUNCH_ARGS) runs_root=$(RUNS) $(SEED_ARG)
# The tables and figures of a sweep's runs (analysis/report.py) -> results/<sweep>/ (or OUT=dir)
REPORT = $(PY) -m analysis.report $(RUNS) --sweep $(1) --scale $(SCALE) $(if $(OUT),--out $(OUT))
# After a sweep: its analysis ($(1)), unless the sweep refused its input before starting anything
# (exit status 2: bad config or missing data, said in one line), then the sweep's exit status.
AFTER_SWEEP = status=$$?; if [ $$status -ne 2 ]; then $(1) && $(DOCS_REFRESH); fi; exit $$status
# Every target that writes a file under results/ ends here: the README's and docs/'s generated
# blocks that embed it are rewritten (tools/docs.py), so the pages keep holding their sources
# (make test checks it) whichever results a clone has regenerated.
DOCS_REFRESH = $(PY) -m tools.docs refresh
# make report / scorecard: SWEEP=, SCALE= (when given), OUT=
ANALYSIS_ARGS = $(if $(SWEEP),--sweep $(SWEEP)) \
	$(if $(filter-out file,$(origin SCALE)),--scale $(SCALE)) $(if $(OUT),--out $(OUT))

# The papers' figure-level claims (make claim-<name>): conf/sweep/claim_<name>.yaml at tiny scale,
# then `python -m analysis.claims <name>` (analysis/claims_<name>.py) -> results/claims/<name>/
# (its figure, table.md, table.csv). On 2 CPU ranks:
CLAIMS := residues fig2b overlap batch
# AdaComp's claims on simulated learners: each run one process of trainer.workers learners
# (launcher=simulated):
SIM_CLAIMS := learners minibatch
CLAIM = $(PY) -m analysis.claims $(1) $(RUNS) --scale tiny --out $(or $(OUT),results/claims/$(1))
# How make claim-<name> ($(1)) runs its sweep: 2 CPU ranks, or the simulated learners the sweep
# itself sets, two runs at a time (one thread each: the same bits as one at a time); make plan
# SWEEP=claim_<name> plans the same runs.
CLAIM_SWEEP = $(PY) run.py -m sweep=claim_$(1) $(if $(filter $(SIM_CLAIMS),$(1)), \
	hydra.launcher.parallel=2,scale=tiny launcher=local hydra.launcher.nproc_per_node=2) \
	runs_root=$(RUNS) $(SEED_ARG)

.PHONY: install demo test test-fast lint clean stress mutate report scorecard bench-compressors \
	bench-e2e bench-kernels bench-numerics bench-portable-step bench-test-time bench-tiny-profile bench-tiny-speed bench-tta plan plan-all dashboard reproduce-all reproduce-auto reproduce-zoo \
	zoo-sweep bench-simulated-memory claims smoke-gpu docs machines slurm-up slurm-down test-slurm \
	$(addprefix reproduce-,$(SWEEPS)) $(addprefix claim-,$(CLAIMS) $(SIM_CLAIMS))

install: $(VENV_STAMP) ## create .venv with every dependency (pyproject.toml; uv from pip's sources: tools/install.py)

$(VENV_STAMP): pyproject.toml
	python3.11 -m venv .venv
	$(PY) -m tools.install -e '.[dev]'
	touch $(VENV_STAMP)

demo: $(VENV_STAMP) ## tiny Table 1 in small: ResNet-18, rank 2 / rank 1 / Accordion, 2 simulated learners each, two runs at a time -> results/demo/ (its table printed); then the scorecard of table1's tiny runs (printed, and results/scorecard.*) and this machine's row of results/machines.md
	@$(MAKE) --no-print-directory reproduce-table1 SCALE=tiny SEEDS=0 ONLY=model=resnet18 \
		OUT=results/demo VENV_STAMP=$(VENV_STAMP); status=$$?; \
	$(MAKE) --no-print-directory scorecard SWEEP=table1 SCALE=tiny VENV_STAMP=$(VENV_STAMP); \
	$(MAKE) --no-print-directory machines VENV_STAMP=$(VENV_STAMP); \
	exit $$status

machines: $(VENV_STAMP) ## the demo's numbers per machine fingerprint and commit (rows of other machines kept) -> results/machines.{csv,md}
	$(PY) -m analysis.machines $(RUNS)
	@$(DOCS_REFRESH)

$(addprefix reproduce-,$(SWEEPS)): reproduce-%: $(VENV_STAMP) ## sweep % (conf/sweep/%.yaml), then its report -> results/%/ (or OUT)
	@$(RUN_SWEEP) sweep=$* $(ONLY); $(call AFTER_SWEEP,$(call REPORT,$*))

reproduce-all: $(addprefix reproduce-,$(SWEEPS)) ## every sweep, one after another

# The fig9 runs that the auto sweep's Fig. 9 case reads (analysis/auto_endpoints.py SHARED);
# with ONLY (a part of the sweep) they are left to make reproduce-fig9. A sweep's exit status:
# 1 some runs failed (go on), 2 its input was refused (stop).
AUTO_FIG9 = sweep=fig9 variant=ours method=rank4,rank1,accordion_rank4_rank1,accordion_rank4_rank2
reproduce-auto: $(VENV_STAMP) ## issue 30: measured endpoints vs hand-picked and fixed (conf/sweep/auto_endpoints.yaml, with fig9's VGG runs) -> results/auto/ (or OUT)
	@$(if $(ONLY),,{ $(RUN_SWEEP) $(AUTO_FIG9) || [ $$? -eq 1 ]; } || exit 2;) \
	$(RUN_SWEEP) sweep=auto_endpoints $(ONLY); $(call AFTER_SWEEP,$(PY) -m \
		analysis.auto_endpoints $(RUNS) --scale $(SCALE) --out $(or $(OUT),results/auto))

reproduce-zoo: $(VENV_STAMP) ## the zoo (conf/sweep/zoo.yaml: every compressor light / heavy / Accordion), then its leaderboard, recovery answers, Pareto figure -> results/zoo/ [OUT=dir] [KEEP=dir: keep that earlier report's rows of the methods not run here]
	@$(RUN_SWEEP) sweep=zoo $(ONLY); $(call AFTER_SWEEP,$(PY) -m analysis.zoo report $(RUNS) \
		--scale $(SCALE) --out $(or $(OUT),results/zoo) $(if $(KEEP),--keep $(KEEP)))

zoo-sweep: $(VENV_STAMP) ## rewrite conf/sweep/zoo.yaml from the compressor registry (after adding a compressor)
	$(PY) -m analysis.zoo sweep

$(addprefix claim-,$(CLAIMS) $(SIM_CLAIMS)): claim-%: $(VENV_STAMP) ## claim % (conf/sweep/claim_%.yaml at tiny scale: 2 CPU ranks, or for learners and minibatch simulated learners), then its figure and table -> results/claims/%/ [SEEDS=0,1,2]
	@$(call CLAIM_SWEEP,$*) $(ONLY); $(call AFTER_SWEEP,$(call CLAIM,$*))

claims: $(addprefix claim-,$(CLAIMS) $(SIM_CLAIMS)) ## every claim sweep, one after another

plan: $(VENV_STAMP) ## what `make reproduce-$(SWEEP)` (or for SWEEP=claim_<name>, make claim-<name>) would run (runs, complete ones, compute) [SHOW=config|diff: each run's resolved config, or its diff against the defaults]
	@$(if $(filter claim_%,$(SWEEP)),$(call CLAIM_SWEEP,$(SWEEP:claim_%=%)),$(RUN_SWEEP) \
		sweep=$(SWEEP)) $(ONLY) hydra.sweeper.dry_run=true $(if $(SHOW),hydra.sweeper.show=$(SHOW))

plan-all: $(VENV_STAMP) ## every sweep's plan in one table: runs, complete, and the time of the rest and of the whole suite at this machine's measured rates (tiny) [SCALE=tiny] [SEEDS=0,1,2] -> results/plan_$(SCALE).md
	$(PY) -m analysis.suite_plan --scale $(SCALE) --runs $(RUNS) $(if $(SEEDS),--seeds $(SEEDS)) \
		--out results/plan_$(SCALE).md
	@$(DOCS_REFRESH)

dashboard: $(VENV_STAMP) ## build the W&B workspace of SWEEP's runs [SCALE=tiny] (needs WANDB_API_KEY, online)
	@$(PY) -m analysis.dashboard $(SWEEP) $(if $(filter-out file,$(origin SCALE)),--scale $(SCALE)) \
		$(if $(ENTITY),--entity $(ENTITY)) $(if $(PROJECT),--project $(PROJECT))

DOCS_STAMP := .venv/.docs-installed

$(DOCS_STAMP): $(VENV_STAMP) pyproject.toml
	$(PY) -m tools.install -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP) ## the documentation site -> build/site/: regenerates docs/config-reference.md and the results blocks, then mkdocs (strict: a warning fails it)
	$(PY) -m tools.config_reference
	$(PY) -m tools.docs refresh
	$(PY) -m tools.docs stage build/docs-src
	$(PY) -m mkdocs build --strict --quiet

# make test: the in-process tests (tests/unit), then the tests that start ranks, sweeps or make
# (tests/ranks, tests/e2e), each on TEST_WORKERS pytest-xdist workers, a file per worker. Two at a
# time suits the second part too: one such test leaves part of 2 cores idle (process starts,
# rendezvous, waits on peers and timeouts), two keep them busy (make bench-test-time).
TEST_WORKERS ?= 2
# Whole files per worker, in the order tests/conftest.py collects them (slowest first).
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: $(VENV_STAMP) ## the whole test suite (slow tests included), as CI runs it [TEST_WORKERS=2]
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(XDIST) --durations=5 tests/unit $(PYTEST_FLAGS)
	$(PY) -m pytest -q $(XDIST) --durations=15 tests/ranks tests/e2e $(PYTEST_FLAGS)

test-fast: $(VENV_STAMP) ## tests without the slow ones
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests/unit $(PYTEST_FLAGS)
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests/ranks tests/e2e $(PYTEST_FLAGS)

slurm-up: ## a single-node Slurm on this machine (root, Debian's packages; docs/slurm.md): for launcher=slurm_local and make test-slurm
	@slurm/up.sh

slurm-down: ## stop make slurm-up's Slurm (its jobs are cancelled)
	@slurm/down.sh

test-slurm: $(VENV_STAMP) ## the tests against a real Slurm (make slurm-up first) and two nodes as network namespaces (root)
	$(PY) -m pytest -q --durations=0 --slurm -m slurm $(PYTEST_FLAGS)

mutate: $(VENV_STAMP) ## mutation testing of the glue modules (mutmut) [GROUPS="hook lr ..."] -> results/mutation/
	$(PY) -m tools.mutate $(GROUPS)
	@$(DOCS_REFRESH)

lint: $(VENV_STAMP) ## ruff
	$(PY) -m ruff check .

clean: ## remove ad-hoc run outputs (keeps .venv and the sweeps' results/runs)
	rm -rf outputs multirun wandb .pytest_cache

bench-simulated-memory: $(VENV_STAMP) ## peak RSS of simulated learners, W = 1/8/32/128 x every compressor -> results/bench/simulated_memory.{csv,md}
	$(PY) -m benchmarks.simulated_memory
	@$(DOCS_REFRESH)

bench-numerics: $(VENV_STAMP) ## portable vs native numerics, the demo's rank-2 run side by side [ARGS="--repeats 2 --epochs 16"] -> results/bench/numerics.{csv,md}
	$(PY) -m benchmarks.numerics $(ARGS)
	@$(DOCS_REFRESH)

bench-portable-step: $(VENV_STAMP) ## where a tiny training step's time goes under portable numerics (ResNet-18 and GoogLeNet), op by op, beside ATen's own loops (without core/exact_ops.py: the same bits) and the other CPU settings, their processes side by side in rounds of rotating order [ARGS="--steps 8 --rounds 5"] -> results/bench/portable_step.{csv,md}
	$(PY) -m benchmarks.portable_step $(ARGS)
	@$(DOCS_REFRESH)

bench-tiny-profile: $(VENV_STAMP) ## where one 2-worker tiny run's time goes (phases), per compressor, as 2 torchrun ranks and as 2 simulated learners [ARGS="--epochs 4"] -> results/bench/tiny_profile.{csv,md}
	$(PY) -m benchmarks.tiny_profile $(ARGS)
	@$(DOCS_REFRESH)

bench-test-time: $(VENV_STAMP) ## make test's two pytest parts timed at 2 and 1 xdist workers, with the machine's busy fraction [ARGS="--runs unit:2 slow:2 slow:1 --baseline DIR"] -> results/bench/test_time.{csv,md} (~40 min)
	$(PY) -m benchmarks.test_time $(ARGS)
	@$(DOCS_REFRESH)

bench-tiny-speed: $(VENV_STAMP) ## a tiny sweep slice (Table 1 ResNet-18, seed 0) the torchrun way and the fast way side by side [ARGS="--repeats 2"] -> results/bench/tiny_speed.{csv,md}; ARGS="--baseline REF": the fast way by commit REF's code and by this checkout, with the runs whose metrics are the same -> results/bench/tiny_speed_baseline_<sweep>.{csv,md}
	$(PY) -m benchmarks.tiny_speed $(ARGS)
	@$(DOCS_REFRESH)

ROUNDS ?= 3
bench-compressors: $(VENV_STAMP) ## compressor speed on ResNet-18 gradients, ROUNDS=3 rounds one after another (each method's median round, its goal met in how many) [BASELINE=<git ref>: side by side with that commit's compressors] [DEVICE=cuda] -> results/bench/compressors{,_cuda}.{csv,md}; on the CPU then each kernel pass of issue 27's methods -> results/bench/compressors_profile.{csv,md}
	$(PY) -m benchmarks.compressors --rounds $(ROUNDS) $(if $(BASELINE),--baseline $(BASELINE)) $(if $(DEVICE),--device $(DEVICE))
	$(if $(DEVICE),,$(PY) -m benchmarks.compressor_profile)
	@$(DOCS_REFRESH)

bench-kernels: $(VENV_STAMP) ## Top-K's, AdaComp's and PowerSGD's C kernel passes alone, inputs from memory, side by side with BASELINE=<git ref>'s, with a check that both give the same bits [PASSES=topk|adacomp|powersgd] -> results/bench/kernels.{csv,md}
	$(PY) -m benchmarks.kernel_ab --baseline "$(BASELINE)" --only "$(PASSES)"
	@$(DOCS_REFRESH)

smoke-gpu: $(VENV_STAMP) ## on a GPU machine (~10 min): every compressor through NCCL, a resume, host syncs per step, NCCL vs gloo -> results/bench/smoke_gpu.md (skips without a GPU)
	$(PY) -m benchmarks.smoke_gpu
	@$(DOCS_REFRESH)

report: $(VENV_STAMP) ## tables, figures, report of the runs below RUNS [SWEEP=table1] [SCALE=tiny] [OUT=dir] -> results/<sweep>/
	$(PY) -m analysis.report $(RUNS) $(ANALYSIS_ARGS)
	@$(DOCS_REFRESH)

scorecard: $(VENV_STAMP) ## verdicts on the papers' claims (analysis/claims.yaml) from the runs below RUNS [SWEEP=table1] [SCALE=tiny] [OUT=dir] -> results/scorecard.{md,html,csv}
	$(PY) -m analysis.scorecard $(RUNS) $(ANALYSIS_ARGS)
	@$(DOCS_REFRESH)

E2E_OUT = results/bench$(if $(filter cuda,$(DEVICE)),/cuda)
bench-e2e: $(VENV_STAMP) ## DDP steps over a rate-limited link (root: ip netns) [DEVICE=cuda: 2 GPUs, NCCL] -> results/bench/e2e.*, projection.* (cuda: results/bench/cuda/)
	$(PY) -m benchmarks.e2e --out $(E2E_OUT) $(if $(DEVICE),--device $(DEVICE))
	@if ls $(E2E_OUT)/raw/e2e/*-*.json >/dev/null 2>&1; then \
		$(PY) -m benchmarks.projection --raw $(E2E_OUT)/raw/e2e --out $(E2E_OUT); \
	else echo "bench-e2e: no records in $(E2E_OUT)/raw/e2e, no projection"; fi
	@$(DOCS_REFRESH)

bench-tta: $(VENV_STAMP) ## time to accuracy of run.py jobs over the link at ratio 4 (JOBS=file.yaml) -> results/bench/tta.*
	$(PY) -m benchmarks.tta $(if $(JOBS),--jobs $(JOBS))
	@$(DOCS_REFRESH)

stress: $(VENV_STAMP) ## 50 back-to-back 2-rank runs over every compressor x scheduler -> results/bench/stress.{csv,md}; every test marked stress (faults, preemption, simulated learners for every compressor); the config fuzz with fresh random examples
	$(PY) -m benchmarks.stress
	@$(DOCS_REFRESH)
	$(PY) -m pytest -q --stress -m stress tests $(PYTEST_FLAGS)
	HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q tests/unit/test_config_fuzz.py $(PYTEST_FLAGS)
