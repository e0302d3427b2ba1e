"""Sweeps: every paper table's runs and configs, the reference rows they map to, the expansion
rules, and what a relaunch does with each run directory (jobs/runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core import record
from core.errors import ConfigError
from jobs import runs, sweeps
from tests.conftest import CONF, ROOT
from training.config import validate

SCALES = ("paper", "tiny")
REFERENCE = ROOT / "analysis" / "reference" / "reference_results.csv"
CIFAR_PSGD = ("rank2", "rank1", "accordion_rank2_rank1")
BATCH = ("batch512", "batch4096", "accordion_batch512_batch4096")


def _groups(benchmark, models, methods, baseline, variant="ours"):
    return {(benchmark, m, meth, variant, baseline) for m in models for meth in methods}


# Written from the issue and the papers, not from the sweep files: (benchmark, model, method,
# variant, baseline) of every run group.
TOPK10 = ("k0.99", "k0.10", "accordion_k0.99_k0.10")
TOPK25 = ("k0.99", "k0.25", "accordion_k0.99_k0.25")
# Written from the issues and the papers, not from the sweep files: (benchmark, model, method,
# variant, baseline) of every run group. Each table runs ours and, where the authors' code ran
# otherwise (issue 17), their variant: Top-K without error feedback, summed; PowerSGD's Accordion
# restarting Q at a rank change (a fixed rank is the same algorithm); the batch plan.
EXPECTED = {
    "table1": _groups("cifar10", ["resnet18"], CIFAR_PSGD, "rank2")
    | _groups("cifar10", ["senet18", "vgg19bn"], ("rank4", "rank1", "accordion_rank4_rank1"),
              "rank4")
    | _groups("cifar10", ["resnet18"], CIFAR_PSGD[2:], "rank2", "authors")
    | _groups("cifar10", ["senet18", "vgg19bn"], ("accordion_rank4_rank1",), "rank4", "authors"),
    "table2": _groups("cifar100", ["resnet18", "densenet", "senet18"], CIFAR_PSGD, "rank2")
    | _groups("cifar100", ["resnet18", "densenet", "senet18"], CIFAR_PSGD[2:], "rank2",
              "authors"),
    "table3": _groups("cifar10", ["resnet18", "googlenet", "senet18"], TOPK10, "k0.99")
    | _groups("cifar10", ["resnet18", "googlenet", "senet18"], TOPK10, "k0.99", "authors"),
    "table4": _groups("cifar100", ["resnet18", "googlenet", "senet18"], TOPK25,
                      "k0.99")
    | _groups("cifar100", ["resnet18", "googlenet", "senet18"], TOPK25, "k0.99",
              "authors")
    | _groups("wikitext2", ["lstm"], ("k0.99", "k0.02", "accordion_k0.99_k0.02"), "k0.99")
    | _groups("wikitext2", ["lstm"], ("k0.99", "k0.02", "accordion_k0.99_k0.02"), "k0.99",
              "authors"),
    "table5": _groups("cifar10", ["resnet18", "googlenet", "densenet"], BATCH, "batch512")
    | _groups("cifar10", ["resnet18", "googlenet", "densenet"], BATCH[2:], "batch512", "authors"),
    "table6": _groups("cifar100", ["resnet18", "googlenet", "densenet"], BATCH, "batch512")
    | _groups("cifar100", ["resnet18", "googlenet", "densenet"], BATCH[2:], "batch512",
              "authors"),
    "fig9": _groups("cifar100", ["vgg19bn"], ("rank4", "rank1", "accordion_rank4_rank1",
                                              "accordion_rank4_rank2"), "rank4")
    | _groups("cifar100", ["vgg19bn"], ("accordion_rank4_rank1", "accordion_rank4_rank2"),
              "rank4", "authors"),
    "fig10": _groups("cifar10", ["resnet18"], ("batch512", "accordion_batch512_batch16384"),
                     "batch512")
    | _groups("cifar10", ["resnet18"], ("accordion_batch512_batch16384",), "batch512", "authors"),
    "adacomp": _groups("mnist", ["mnist_cnn"], ("none", "adacomp"), "none")
    | _groups("cifar10", ["cifar10_cnn"], ("none", "adacomp"), "none")
    | _groups("imagenet", ["resnet18", "resnet50", "alexnet"], ("none", "adacomp"), "none")
    | _groups("shakespeare", ["char_lstm"], ("none", "adacomp"), "none"),
    # Issue 30: measured endpoints beside the hand-picked ones and a grid of fixed levels.
    "auto_endpoints": _groups("cifar10", ["resnet18"], ("rank4", "rank2", "rank1",
                                                        "accordion_rank2_rank1", "auto_rank",
                                                        "auto_rank_budget"), "rank2")
    | _groups("cifar10", ["resnet18"], ("k0.99", "k0.25", "k0.10", "accordion_k0.99_k0.10",
                                        "auto_topk", "auto_topk_budget"), "k0.99", "authors")
    | _groups("wikitext2", ["lstm"], ("k0.99", "k0.10", "k0.02", "accordion_k0.99_k0.02",
                                      "auto_topk", "auto_topk_budget"), "k0.99", "authors")
    | _groups("cifar100", ["vgg19bn"], ("rank2", "auto_rank"), "rank4")  # the rest: fig9's
    | _groups("cifar10", ["resnet18"], ("batch512", "batch4096", "batch16384",
                                        "accordion_batch512_batch4096",
                                        "accordion_batch512_batch16384", "auto_batch"),
              "batch512"),
    "ablation_ef": {g for v in ("ours", "noef") for g in
                    _groups("cifar10", ["resnet18"], CIFAR_PSGD, "rank2", v)
                    | _groups("wikitext2", ["lstm"], ("k0.99", "k0.02", "accordion_k0.99_k0.02"),
                              "k0.99", v)},
}
NO_TINY = {"imagenet"}  # no tiny stand-in for ImageNet's 224x224 models


def sweep_config(name: str, *overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"sweep={name}", *overrides],
                       return_hydra_config=True)


def jobs(name: str, scale: str, *arguments: str) -> list[list[str]]:
    cfg = sweep_config(name, f"scale={scale}")
    return sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params,
                         [f"sweep={name}", f"scale={scale}", *arguments], scale)


def compose_job(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def run_dir(cfg) -> Path:
    return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


@pytest.fixture(scope="module")
def composed() -> dict[tuple[str, str], list]:
    """Every run of every sweep at both scales, composed as the sweeper composes it (seed 0)."""
    out = {}
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for name in EXPECTED:
            for scale in SCALES:
                cfg = compose("config", overrides=[f"sweep={name}", f"scale={scale}"],
                              return_hydra_config=True)
                todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params,
                                     [f"sweep={name}", f"scale={scale}", "seed=0"], scale)
                out[name, scale] = [compose("config", overrides=j, return_hydra_config=True)
                                    for j in todo]
    return out


def test_every_sweep_file_is_tested():
    # The claim sweeps (claim_*) are tested in tests/unit/test_claims.py, the zoo in
    # tests/unit/test_zoo.py.
    assert sorted(p.stem for p in (CONF / "sweep").glob("*.yaml")
                  if not p.stem.startswith("claim_") and p.stem != "zoo") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("scale", SCALES)
def test_sweep_has_the_tables_runs(composed, name, scale):
    got = [(c.benchmark, c.model.name, c.method, c.variant, c.baseline)
           for c in composed[name, scale]]
    assert len(got) == len(set(got))
    expected = {g for g in EXPECTED[name] if scale == "paper" or g[0] not in NO_TINY}
    assert set(got) == expected
    assert {c.sweep for c in composed[name, scale]} == {name}
    assert {c.scale for c in composed[name, scale]} == {scale}


def test_default_seeds_and_seed_override():
    assert len(jobs("table1", "tiny")) == 3 * (9 + 3)  # 9 of ours, 3 as the authors ran them
    assert {o for j in jobs("table1", "tiny", "seed=4,5") for o in j if o.startswith("seed=")} \
        == {"seed=4", "seed=5"}


@pytest.mark.parametrize("scale", SCALES)
def test_methods_compose_their_compressor_and_scheduler(composed, scale):
    every = [c for runs_ in composed.values() for c in runs_ if c.scale == scale]
    for c in every:
        method, s = c.method, c.scheduler
        if c.compressor.name == "topk":  # issue 17: the authors' Top-K, ours, ours without EF
            assert (c.compressor.error_feedback, c.compressor.reduce) == {
                "authors": (False, "sum"), "ours": (True, "mean"), "noef": (False, "mean")}[
                    c.variant]
        if c.compressor.name == "powersgd":
            assert c.compressor.restart_on_rank_change == (c.variant == "authors")
            assert c.compressor.error_feedback == (c.variant != "noef")
        if method.startswith("rank"):
            assert (c.compressor.name, c.compressor.rank, s.name) == ("powersgd",
                                                                      int(method[4:]), "static")
        elif method.startswith("accordion_rank"):
            low, high = (int(p[4:]) for p in method.split("_")[1:])
            assert (c.compressor.name, s.name, s.low, s.high) == ("powersgd", "accordion", low,
                                                                  high)
            assert s.interval == (10 if scale == "paper" else 2) * (
                0.5 if c.benchmark == "wikitext2" and scale == "paper" else 1)
        elif method.startswith("k"):
            assert (c.compressor.name, c.compressor.ratio, s.name) == ("topk", float(method[1:]),
                                                                       "static")
        elif method.startswith("accordion_k"):
            low, high = (float(p[1:]) for p in method.split("_")[1:])
            assert (c.compressor.name, s.name, s.low, s.high) == ("topk", "accordion", low, high)
        elif method.startswith(("batch", "accordion_batch")):
            _check_batch_method(c, scale)
        elif method.startswith("auto_"):
            _check_auto_method(c, scale)
        else:
            assert (c.compressor.name, s.name) == (method, "static")
            if method == "adacomp":
                assert (c.compressor.conv_bin_size, c.compressor.fc_bin_size) == (50, 500)


def _check_batch_method(c, scale):
    small = 512 if scale == "paper" else 32
    large = {"batch4096": 8 * small, "accordion_batch512_batch4096": 8 * small,
             "batch16384": 32 * small, "accordion_batch512_batch16384": 32 * small,
             "batch512": small}[c.method]
    s = c.scheduler
    assert c.compressor.name == "none"
    if c.method == "batch512":
        assert (s.name, c.trainer.batch_size) == ("static", small)
    elif c.method in ("batch4096", "batch16384"):
        assert (s.name, list(s.batch_sizes), s.base_batch) == ("plan", [large], small)
    elif c.variant == "ours":
        assert (s.name, s.batch_low, s.batch_high) == ("accordion_batch", small, large)
        assert s.interval == (10 if scale == "paper" else 2)
    else:  # the authors' logged runs: small batch for epochs 0-19, large from 20 on
        switch = 20 if scale == "paper" else 4
        assert (s.name, list(s.epochs), list(s.batch_sizes), s.base_batch, s.lr_scaling) == (
            "plan", [0, switch], [small, large], small, "linear")


def _check_auto_method(c, scale):
    """Issue 30's methods: the candidates, the rule, the budget over the run, the interval."""
    s = c.scheduler
    interval = (10 if scale == "paper" else 2) * (
        0.5 if c.benchmark == "wikitext2" and scale == "paper" else 1)
    if c.method == "auto_batch":
        small = 512 if scale == "paper" else 32
        assert (c.compressor.name, s.name, s.batch_low, s.batches) == (
            "none", "accordion_batch_auto", small, None)
        assert s.interval == interval
        return
    family, levels = {"auto_rank": ("powersgd", [4, 2, 1]),
                      "auto_topk": ("topk", [0.99, 0.25, 0.10, 0.02])}[
        c.method.removesuffix("_budget")]
    assert (c.compressor.name, s.name, list(s.levels), s.interval) == (
        family, "accordion_auto", levels, interval)
    first = c.compressor.ratio if family == "topk" else c.compressor.rank
    assert first == levels[0]  # the level epoch 0 runs at: the compressor's own
    if c.method.endswith("_budget"):
        assert (s.rule, s.epochs) == ("budget", c.trainer.epochs) and 0 < s.budget < 2
    else:
        assert (s.rule, s.budget) == ("noise", None)


@pytest.mark.parametrize("scale", SCALES)
def test_scale_picks_data_recipe_and_width(composed, scale):
    for c in (c for runs_ in composed.values() for c in runs_ if c.scale == scale):
        if scale == "paper":
            assert c.dataset.name == c.benchmark
            assert c.trainer.epochs in (20, 30, 90, 300)
        else:
            assert c.dataset.name in ("synthetic", "synthetic_text")
            assert c.trainer.epochs <= 16 and c.trainer.device == "cpu"
            if c.model.name in ("resnet18", "senet18", "vgg19bn", "googlenet"):
                assert c.model.width == 8
            if c.model.name == "vgg19bn":  # the narrow head learns only without dropout
                assert c.model.dropout == 0.0
        if c.benchmark in ("cifar10", "cifar100") and c.model.name != "cifar10_cnn":
            assert c.optimizer.schedule.lag == 1  # the authors' one-epoch LR lag, both scales
        if c.sweep == "fig9" or c.model.name == "vgg19bn" and c.benchmark == "cifar100":
            assert c.model.classifier == "cifar100"


def test_tiny_runs_validate_for_two_ranks(composed, tmp_path):
    for c in (c for runs_ in composed.values() for c in runs_ if c.scale == "tiny"):
        task = OmegaConf.masked_copy(c, [k for k in c if k != "hydra"])
        validate(task, world_size=2, run_dir=tmp_path)


def test_run_directories_are_deterministic_and_distinct(composed):
    dirs = [run_dir(c) for runs_ in composed.values() for c in runs_]
    assert len(dirs) == len(set(dirs))
    c = next(c for c in composed["table5", "tiny"] if c.variant == "authors")
    assert run_dir(c) == Path("results/runs/table5/tiny/cifar10") / c.model.name / \
        "accordion_batch512_batch4096" / "authors" / "seed0"
    assert c.logger.group == "table5" and c.logger.job_type == c.method
    assert c.logger.run_name == f"{c.model.name}-{c.method}-seed0"
    assert {"tiny", "authors", c.model.name} <= set(c.logger.tags)


# ---- the reference rows ------------------------------------------------------------------------
TABLE_TO_SWEEP = {**{str(t): f"table{t}" for t in range(1, 7)}, "fig9": "fig9",
                  "fig10": "fig10", "adacomp-t2": "adacomp"}


@pytest.mark.parametrize("scale", SCALES)
def test_the_auto_sweep_reads_fig9_runs_of_its_own_settings(scale):
    """analysis/auto_endpoints.py's SHARED runs are fig9 runs (each shared method, variant ours)
    whose overrides are the auto sweep's Fig. 9 group's but for method and sweep, and the
    Makefile's AUTO_FIG9 starts exactly those (caught: a shared list edited in one place)."""
    from analysis.auto_endpoints import SHARED, SHARED_VARIANT

    def settings(job: list[str]) -> frozenset[str]:
        return frozenset(o for o in job if not o.startswith(("method=", "sweep=")))

    auto = {settings(j) for j in jobs("auto_endpoints", scale) if "model=vgg19bn" in j}
    for sweep, methods in SHARED.items():
        for method in methods:
            shared = [j for j in jobs(sweep, scale) if f"method={method}" in j
                      and f"variant={SHARED_VARIANT}" in j]
            assert shared and {settings(j) for j in shared} <= auto, (sweep, method)
        line = next(t for t in (ROOT / "Makefile").read_text().splitlines()
                    if t.startswith("AUTO_FIG9 = "))
        assert line == (f"AUTO_FIG9 = sweep={sweep} variant={SHARED_VARIANT} "
                        f"method={','.join(methods)}")


def test_every_reference_row_maps_to_run_groups(composed):
    groups = {(c.sweep, c.benchmark, c.model.name, c.compressor.name, c.method)
              for runs_ in composed.values() for c in runs_ if c.scale == "paper"}
    reference = pd.read_csv(REFERENCE, dtype=str)
    for row in reference.itertuples():
        if row.dataset != "all":  # one published run: exactly one run group of its sweep
            key = (TABLE_TO_SWEEP[row.table], row.dataset, row.model, row.compressor, row.setting)
            assert sum(g == key for g in groups) == 1, key
        else:  # a headline claim over many runs: at least one group it speaks of
            sweeps_ = [TABLE_TO_SWEEP[row.table]] if isinstance(row.table, str) else None
            matching = [g for g in groups if (sweeps_ is None or g[0] in sweeps_)
                        and g[3] in row.compressor.split("|")
                        and (g[4].startswith(row.setting) or row.table == "adacomp-t2")]
            assert matching, row


# ---- expansion rules ---------------------------------------------------------------------------
GROUPS = [{"model": ["a", "b"], "method": "x,y"}, {"model": "c", "method": ["z"], "scales": ["p"]}]


def test_expand_is_the_union_of_group_products_crossed_with_params():
    got = sweeps.expand(GROUPS, {"seed": "0,1"}, [], "p")
    assert len(got) == (4 + 1) * 2
    assert ["model=a", "method=x", "seed=0"] in got and ["model=c", "method=z", "seed=1"] in got
    assert all(not j[0].startswith("model=c") for j in sweeps.expand(GROUPS, {}, [], "q"))


def test_command_line_filters_group_keys_and_sets_the_rest():
    got = sweeps.expand(GROUPS, {"seed": "0,1"}, ["model=b,c", "seed=7", "trainer.epochs=3"], "p")
    assert got == [["model=b", "method=x", "seed=7", "trainer.epochs=3"],
                   ["model=b", "method=y", "seed=7", "trainer.epochs=3"],
                   ["model=c", "method=z", "seed=7", "trainer.epochs=3"]]
    with pytest.raises(ConfigError, match=r"^sweep: no run matches model=d"):
        sweeps.expand(GROUPS, {}, ["model=d"], "p")


def test_a_filter_ignores_the_plus_hydra_needs_for_a_key_the_defaults_lack():
    groups = [{"model": "a", "compressor.bin": [50, 500]}]
    assert sweeps.expand(groups, {}, ["+compressor.bin=500"]) == [["model=a", "compressor.bin=500"]]
    assert sweeps.expand(groups, {}, ["+trainer.extra=1"]) == [
        ["model=a", "compressor.bin=50", "+trainer.extra=1"],
        ["model=a", "compressor.bin=500", "+trainer.extra=1"]]
    assert sweeps.expand(groups, {}, ["+compressor.bin=50", "~dataset.noise"]) == [
        ["model=a", "compressor.bin=50", "~dataset.noise"]]


def test_group_keys_win_over_params():
    got = sweeps.expand([{"m": "a"}, {"m": "b", "variant": "authors"}], {"variant": "ours"}, [])
    assert got == [["m=a", "variant=ours"], ["m=b", "variant=authors"]]


# ---- run directories: what a relaunch does -----------------------------------------------------
def write_record(path: Path, cfg, status: str | None, epochs: int = 2, checkpoint: bool = True):
    path.mkdir(parents=True, exist_ok=True)
    runs.prepare(cfg, path, runs.Action.START)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n"
                                                for e in range(epochs)))
    if checkpoint:
        torch.save({"epoch": epochs}, path / "checkpoint.pt")
    if status is not None:
        (path / "summary.json").write_text(json.dumps({"status": status}))


@pytest.fixture
def run_cfg(compose_cfg):
    return compose_cfg("sweep=table1", "benchmark=cifar10", "scale=tiny", "model=resnet18",
                       "method=rank2", "baseline=rank2")


@pytest.mark.parametrize(("status", "checkpoint", "state", "action"), [
    (None, False, runs.State.NEW, runs.Action.START),
    ("completed", True, runs.State.COMPLETED, runs.Action.SKIP),
    ("diverged", True, runs.State.COMPLETED, runs.Action.SKIP),
    (None, True, runs.State.INTERRUPTED, runs.Action.RESUME),         # killed: no summary
    ("failed: SystemExit: 143", True, runs.State.INTERRUPTED, runs.Action.RESUME),
    ("preempted: SIGUSR1 at epoch 1, step 3", True, runs.State.INTERRUPTED, runs.Action.RESUME),
    ("failed: SystemExit: 144", False, runs.State.INTERRUPTED, runs.Action.START),
    (f"{runs.LOST_JOB} (Slurm job 7_1: OUT_OF_MEMORY)", True, runs.State.INTERRUPTED,
     runs.Action.RESUME),
    ("failed: RuntimeError: boom", True, runs.State.FAILED, runs.Action.RERUN),
])
def test_auto_resume_decides_by_the_record(tmp_path, run_cfg, status, checkpoint, state, action):
    if status is not None or checkpoint:
        write_record(tmp_path, run_cfg, status, checkpoint=checkpoint)
    assert runs.inspect(tmp_path).state is state
    assert runs.decide(run_cfg, tmp_path) is action
    run_cfg.resume = False
    assert runs.decide(run_cfg, tmp_path) is runs.Action.START


def test_a_failed_job_leaves_the_run_s_own_status_or_says_it_ended_without_one(tmp_path,
                                                                             run_cfg):
    # The job wrote how its run ended (a lost rank, a preemption): that stays, word for word.
    write_record(tmp_path, run_cfg, "completed")
    before = runs.summary_stamp(tmp_path)
    write_record(tmp_path, run_cfg, "failed: lost rank 1 (no word from it)")
    assert runs.record_failed_job(tmp_path, "exit status 1", before) == \
        "failed: lost rank 1 (no word from it)"
    assert runs.inspect(tmp_path).status == "failed: lost rank 1 (no word from it)"
    # It did not (SIGKILL): the summary from before the launch is not this job's; the record
    # now says so, and a relaunch resumes it from its checkpoint like any interruption.
    write_record(tmp_path, run_cfg, "preempted: SIGUSR1 at epoch 1, step 3")
    before = runs.summary_stamp(tmp_path)
    status = runs.record_failed_job(tmp_path, "killed by SIGKILL", before)
    assert status == f"{runs.LOST_JOB} (killed by SIGKILL)"
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "status": status, "epochs_completed": 2}
    assert runs.decide(run_cfg, tmp_path) is runs.Action.RESUME
    # No summary before nor after (rerun moved it aside, then the job was killed).
    (tmp_path / "summary.json").unlink()
    assert runs.record_failed_job(tmp_path, "exit status 2", None).endswith("(exit status 2)")
    # A run directory the job never made: nothing to write, the line still says how.
    assert runs.record_failed_job(tmp_path / "never", "exit status 2", None) == \
        f"{runs.LOST_JOB} (exit status 2)"
    assert not (tmp_path / "never").exists()


def test_rerun_moves_the_failed_record_aside(tmp_path, run_cfg):
    write_record(tmp_path, run_cfg, "failed: RuntimeError: boom")
    runs.prepare(run_cfg, tmp_path, runs.Action.RERUN)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert json.loads((tmp_path / "failed/0/summary.json").read_text())["status"].endswith("boom")
    write_record(tmp_path, run_cfg, "failed: RuntimeError: again")
    runs.prepare(run_cfg, tmp_path, runs.Action.RERUN)
    assert (tmp_path / "failed/1/metrics.jsonl").exists() and runs.inspect(tmp_path).state is \
        runs.State.INTERRUPTED  # config.yaml written: started, no progress yet


def test_a_directory_of_another_config_is_refused(tmp_path, run_cfg):
    write_record(tmp_path, run_cfg, "completed")
    other = run_cfg.copy()
    other.optimizer.lr = 0.5
    with pytest.raises(ConfigError, match=r"^hydra\.run\.dir: .* holds a run of another config "
                                          r"\(optimizer\.lr: 0\.1 there, 0\.5 now\)"):
        runs.decide(other, tmp_path)
    # settings that do not change results may differ; a longer run may resume (resume=true)
    same = run_cfg.copy()
    same.trainer.progress, same.dataset.root, same.logger.mode = True, "/elsewhere", "online"
    assert runs.decide(same, tmp_path) is runs.Action.SKIP
    longer = run_cfg.copy()
    longer.trainer.epochs = 40
    with pytest.raises(ConfigError, match=r"trainer\.epochs: 16 there, 40 now"):
        runs.decide(longer, tmp_path)
    longer.resume = True
    assert runs.decide(longer, tmp_path) is runs.Action.RESUME


def test_ranks_and_simulated_learners_are_one_run_of_one_world_size(tmp_path, run_cfg):
    # W ranks (trainer.workers null) and W simulated learners train bit for bit alike: either
    # may continue or skip the other's run; the world size is compared instead.
    write_record(tmp_path, run_cfg, "completed")
    record.record_start(tmp_path, {"world_size": 2}, 0, fresh=True)  # as run.py records it
    learners = run_cfg.copy()
    learners.trainer.workers = 2
    assert runs.decide(learners, tmp_path, world_size=2) is runs.Action.SKIP
    assert runs.decide(run_cfg, tmp_path, world_size=2) is runs.Action.SKIP
    assert runs.decide(run_cfg, tmp_path) is runs.Action.SKIP  # the world size not known
    with pytest.raises(ConfigError, match=r"^hydra\.run\.dir: .* holds a run of 2 workers, not "
                                          r"4; choose another runs_root"):
        runs.decide(run_cfg, tmp_path, world_size=4)
    # learners recorded: their count, whatever the starts say
    write_record(tmp_path, learners, "completed")
    assert runs.recorded_world_size(OmegaConf.to_container(learners), tmp_path) == 2
    with pytest.raises(ConfigError, match="holds a run of 2 workers, not 8"):
        runs.decide(run_cfg, tmp_path, world_size=8)


def test_prepare_writes_the_resolved_config(tmp_path, run_cfg):
    (tmp_path / ".hydra").mkdir()
    runs.prepare(run_cfg, tmp_path, runs.Action.START)
    for path in (tmp_path / "config.yaml", tmp_path / ".hydra" / "config.yaml"):
        saved = OmegaConf.load(path)
        assert saved.model.num_classes == 10 and "${" not in path.read_text()
        assert (saved.sweep, saved.scale, saved.method, saved.variant, saved.baseline) == (
            "table1", "tiny", "rank2", "ours", "rank2")


def test_plan_counts_and_refuses_a_foreign_directory(tmp_path):
    arguments = ["sweep=table1", "scale=tiny", f"runs_root={tmp_path}", "model=resnet18", "seed=0",
                 "variant=ours"]
    cfg = sweep_config("table1", "scale=tiny", f"runs_root={tmp_path}")
    todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params, arguments, "tiny")
    plan = sweeps.make_plan("table1", "tiny", 2, todo, compose_job)
    assert [j.action for j in plan.jobs] == [runs.Action.START] * 3
    first, second = plan.jobs[0], plan.jobs[1]
    write_record(first.run_dir, first.cfg, "completed")
    write_record(second.run_dir, second.cfg, None)
    plan = sweeps.make_plan("table1", "tiny", 2, todo, compose_job)
    assert "3 runs: 1 complete, 1 to resume, 0 failed to rerun, 1 to start" in plan.describe()
    assert len(plan.todo()) == 2 and plan.todo()[0].flops > 0
    sweeps.check_directories(plan)
    foreign = OmegaConf.load(first.run_dir / "config.yaml")
    foreign.seed = 99
    OmegaConf.save(foreign, first.run_dir / "config.yaml")
    plan = sweeps.make_plan("table1", "tiny", 2, todo, compose_job)
    with pytest.raises(ConfigError, match=r"^hydra\.run\.dir: .*seed: 99 there, 0 now"):
        sweeps.check_directories(plan)


def test_a_tiny_plan_is_timed_again_at_the_rates_this_machine_measured(tmp_path):
    arguments = ["sweep=table1", "scale=tiny", f"runs_root={tmp_path}", "model=resnet18", "seed=0",
                 "variant=ours"]
    cfg = sweep_config("table1", "scale=tiny", f"runs_root={tmp_path}")
    todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params, arguments, "tiny")
    jobs = sweeps.make_plan("table1", "tiny", 1, todo, compose_job).jobs
    here, other = "CPU (AVX2) x2, portable", "CPU (AVX2) x2, native"

    def done(job, seconds: float, machine: str = here, launcher: str = "simulated",
             status: str = "completed", name: str = "") -> None:
        path = job.run_dir.with_name(job.run_dir.name + name)
        write_record(path, job.cfg, status)
        start = {"machine": machine, "launcher": launcher, "world_size": 2}
        (path / "summary.json").write_text(json.dumps(
            {"status": status, "total_time_s": seconds, "starts": [start]}))

    flops = sweeps.run_flops(jobs[0].cfg)
    done(jobs[0], 6000.0)                         # one process: flops / 6000 per core
    done(jobs[0], 1500.0, launcher="local", name="_ranks")  # 2 ranks: flops / 3000 per core
    done(jobs[0], 1.0, machine=other, name="_other")  # another machine's or numerics' runs,
    done(jobs[0], 1.0, status="diverged", name="_diverged")  # incomplete ones: not read
    rates = sweeps.measured_rates(tmp_path, here)
    rate = (flops / 6000 + flops / 3000) / 2
    assert rates.per_model == {"resnet18": (pytest.approx(rate), 2)} and rates.overall == \
        pytest.approx(rate)
    plan = sweeps.make_plan("table1", "tiny", 1, todo, compose_job, parallel=2, measured=rates)
    left = plan.todo()
    assert len(left) == 2  # the first run is complete
    minutes = (sum(j.flops for j in left) / rate + 2 * sweeps.START_S) / 60 / 2
    line = plan.describe().splitlines()[-1]
    assert line.startswith(f"  at the rates measured here ({here}; ")
    assert line.endswith(f"resnet18 {rate / 1e9:.1f} (2 runs)): about {minutes:.0f} min on 2 "
                         "cores"), line
    ranks = sweeps.make_plan("table1", "tiny", 2, todo, compose_job, measured=rates)  # torchrun
    minutes = (sum(j.flops for j in left) / rate + 2 * sweeps.START_S * 2) / 60 / 2
    assert ranks.describe().endswith(f"about {minutes:.0f} min on 2 cores")
    alone = sweeps.make_plan("table1", "tiny", 1, todo, compose_job, measured=rates)
    assert alone.describe().endswith(" min on 1 core") and "min on 1 core;" in alone.describe()
    assert sweeps.measured_rates(tmp_path / "none", here).per_model == {}
    other_model = sweeps.make_plan("table1", "tiny", 1, todo, compose_job,
                                   measured=sweeps.Rates(here, tmp_path, {"vgg19bn": (1e9, 3)}))
    assert "at the rates measured here" not in other_model.describe()  # none of its models


def test_variant_without_an_implementation_is_refused(compose_cfg, tmp_path):
    cfg = compose_cfg("sweep=table1", "benchmark=cifar10", "scale=tiny", "method=batch512",
                      "variant=noef")
    with pytest.raises(ConfigError, match=r"^variant: batch512 has no 'noef' implementation"):
        validate(cfg, world_size=2, run_dir=tmp_path)


def test_the_entry_point_pickles_for_submitit():
    # The Slurm launcher ships run.py's task function by value (cloudpickle, as __main__ is):
    # every function it reaches, and every module cloudpickle takes along, must pickle.
    import cloudpickle

    import run

    cloudpickle.register_pickle_by_value(run)
    try:
        assert cloudpickle.loads(cloudpickle.dumps(run.main)).__name__ == "main"
    finally:
        cloudpickle.unregister_pickle_by_value(run)
