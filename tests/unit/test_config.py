"""Config composition and the one-line errors for bad input."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf

import compression
from core.errors import ConfigError
from tests.conftest import CONF, TINY, run_cli
from training.config import validate

GROUPS = ("model", "dataset", "compressor", "scheduler", "optimizer", "trainer", "logger",
          "launcher")


def options(group: str) -> list[str]:
    """Every option file of a config group."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes(compose_cfg, group):
    for option in options(group):
        cfg = compose_cfg(f"{group}={option}")
        assert group == "launcher" or cfg[group] is not None  # launchers are _global_ presets
        assert cfg.trainer.epochs >= 1 and cfg.trainer.batch_size >= 1
        assert "seed" in cfg and "resume" in cfg and "subset" in cfg.dataset


def test_every_compressor_scheduler_pair_composes_and_validates(compose_cfg, tmp_path):
    for comp, sched in itertools.product(options("compressor"), options("scheduler")):
        cfg = compose_cfg(f"compressor={comp}", f"scheduler={sched}", "dataset=digits")
        # The measured endpoints need >= 2 workers to measure the noise between.
        world = 2 if sched.endswith("_auto") else 1
        fixed = compression.create(cfg.compressor.name).accordion_levels is None
        if fixed and sched in ("accordion", "accordion_joint", "accordion_auto"):
            # No levels to switch (none, the casts, signs, C_nat): a clear error, not a no-op.
            with pytest.raises(ConfigError, match=r"^scheduler\.(low|levels): "):
                validate(cfg, world_size=world, run_dir=tmp_path)
        else:
            validate(cfg, world_size=world, run_dir=tmp_path)


def test_experiments_compose_and_win_over_defaults(compose_cfg):
    assert options("experiment")
    for experiment in options("experiment"):
        cfg = compose_cfg(f"experiment={experiment}")
        preset = OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml")
        if "name" in preset:
            assert cfg.name == preset.name  # an experiment overrides config.yaml's own keys
        if "trainer" in preset and "epochs" in preset.trainer:
            assert cfg.trainer.epochs == preset.trainer.epochs


def test_defaults_validate(compose_cfg, tmp_path):
    validate(compose_cfg(), world_size=2, run_dir=tmp_path)


@pytest.mark.parametrize(("override", "field"), [
    ("trainer.epochs=0", "trainer.epochs"),
    ("trainer.batch_size=63", "trainer.batch_size"),
    ("optimizer.lr=0", "optimizer.lr"),
    ("optimizer.lr=-0.1", "optimizer.lr"),
    ("dataset.subset=0", "dataset.subset"),
    ("optimizer.schedule.milestones=[5]", "optimizer.schedule.decay_factors"),
    ("trainer.device=tpu", "trainer.device"),
    ("logger.mode=sometimes", "logger.mode"),
    ("resume=true", "resume"),
])
def test_bad_values_name_the_field(compose_cfg, tmp_path, override, field):
    cfg = compose_cfg(override)
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        validate(cfg, world_size=2, run_dir=tmp_path)


def test_missing_dataset_files_name_the_path(compose_cfg, tmp_path):
    cfg = compose_cfg("dataset=cifar10", f"dataset.root={tmp_path}")
    with pytest.raises(ConfigError, match=str(tmp_path / "cifar-10-batches-py")):
        validate(cfg, world_size=1, run_dir=tmp_path)


def test_cli_bad_value_is_one_line_before_any_process_group(tmp_path):
    # WORLD_SIZE=2 with no rendezvous: had the group started, this would hang or fail to
    # connect; the check must end the run first with exit status 2 and one line.
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "1"}
    proc = run_cli([*TINY, "trainer.batch_size=33", f"hydra.run.dir={tmp_path}"], env=env,
                   timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: trainer.batch_size: the global batch 33 must be divisible by the "
                     "world size 2"]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_cli_missing_data_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    proc = run_cli([*TINY, "dataset=cifar100", f"dataset.root={missing}",
                    f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: dataset.root: ") and str(missing) in line


@pytest.mark.parametrize(("args", "group", "option", "close"), [
    (["compressor=powersdg"], "compressor", "powersdg", "powersgd"),
    (["-m", "sweep=table1", "scale=tiny", "model=resnet81", "hydra.sweeper.dry_run=true"],
     "model", "resnet81", "resnet18"),
])
def test_cli_misspelt_option_is_one_line_with_the_closest_choices(tmp_path, args, group, option,
                                                                    close):
    proc = run_cli([*args, f"hydra.run.dir={tmp_path}", f"runs_root={tmp_path}"], timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {group}={option}: no such option of group {group}; "
                           f"did you mean {close} ")
    assert line.endswith("choices: " + ", ".join(options(group)))
    assert not list(tmp_path.iterdir())


def test_misspelt_option_through_the_compose_api_is_hydras_exception(compose_cfg):
    with pytest.raises(MissingConfigException, match=r"^error: experiment=cifar10_recip: no "
                       r"such option of group experiment; choices: demo, "):
        compose_cfg("experiment=cifar10_recip")


def test_conf_groups_match_design_card():
    for group in (*GROUPS, "experiment"):
        assert (CONF / group).is_dir(), group
    assert Path(CONF / "config.yaml").is_file()


@pytest.mark.parametrize(("model", "dataset", "message"), [
    ("alexnet", "mnist", "alexnet expects 224x224 images but dataset mnist has 28x28"),
    ("resnet18", "synthetic_text", "resnet18 takes image but dataset synthetic_text is a "
                                   "language_model dataset"),
    ("lstm", "digits", "lstm takes tokens but dataset digits is a classification dataset"),
    ("mnist_cnn", "cifar10", "mnist_cnn expects 28x28 images but dataset cifar10 has 32x32"),
])
def test_model_dataset_mismatch_fails_early(compose_cfg, tmp_path, model, dataset, message):
    cfg = compose_cfg(f"model={model}", f"dataset={dataset}", f"dataset.root={tmp_path}",
                      "dataset.download=true" if dataset in ("mnist", "cifar10") else "seed=0")
    with pytest.raises(ConfigError, match=f"^model.name: {message}"):
        validate(cfg, world_size=1, run_dir=tmp_path)


@pytest.mark.parametrize(("model", "dataset"), [
    ("googlenet", "cifar100"), ("mnist_cnn", "mnist"), ("lstm", "wikitext2"),
    ("char_lstm", "shakespeare"), ("resnet50", "imagenet"), ("cifar10_cnn", "digits"),
])
def test_shapes_flow_from_dataset_to_model(compose_cfg, model, dataset):
    cfg = compose_cfg(f"model={model}", f"dataset={dataset}")
    assert cfg.model.num_classes == cfg.dataset.num_classes
    if cfg.dataset.task == "classification":
        assert cfg.model.in_channels == cfg.dataset.input_shape[0]


def test_slurm_launcher_composes_submitit(tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["launcher=slurm"], return_hydra_config=True)
    # the suite's own submitit launcher (hydra_plugins/accordion_bench/jobs.py): one Slurm job
    # per run, a failed job a failed run
    assert cfg.hydra.launcher._target_ == "hydra_plugins.accordion_bench.jobs.SlurmJobsLauncher"
    assert cfg.hydra.launcher.tasks_per_node == 4


def launcher(*overrides: str) -> DictConfig:
    """The ``hydra.launcher`` node a sweep with ``overrides`` hands to its launcher."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True
                       ).hydra.launcher


def test_submitit_local_gives_each_task_a_gpu():
    # Unset, submitit's local executor exports an empty CUDA_VISIBLE_DEVICES: runs on the CPU.
    assert launcher("launcher=submitit_local").gpus_per_node == 2
    node = launcher("launcher=submitit_local", "hydra.launcher.tasks_per_node=4")
    assert node.tasks_per_node == node.gpus_per_node == 4
    assert launcher("launcher=slurm").gpus_per_node == 4  # the same rule on Slurm


@pytest.mark.parametrize(("limit", "delay", "error"), [
    (2, 115, r"<= 60 \* timeout_min - 70 \(at most 50 with timeout_min=2\), got 115: Slurm "),
    (4, 171, r"at most 170 with timeout_min=4\), got 171"),
    (1, 0, r"\(and timeout_min >= 2\), got 0"),
    (4, 170, None), (1440, 120, None),
])
def test_a_slurm_signal_that_may_come_as_a_job_starts_is_refused(limit, delay, error):
    # sbatch --signal: up to 60 s early; at a job's start it would kill the tasks (the job fails
    # instead of being requeued), so the sweep refuses it before submitting anything
    from hydra_plugins.accordion_bench.sweeper import _check_launcher

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["launcher=slurm_local",
                                           f"hydra.launcher.timeout_min={limit}",
                                           f"hydra.launcher.signal_delay_s={delay}"],
                      return_hydra_config=True)
    if error is None:
        _check_launcher(cfg)
        return
    with pytest.raises(ConfigError, match=r"^hydra\.launcher\.signal_delay_s: expected an "
                                          r"integer .*" + error):
        _check_launcher(cfg)


def _visible_gpus() -> str:
    return os.environ["CUDA_VISIBLE_DEVICES"]


@pytest.mark.slow
def test_submitit_local_tasks_see_one_gpu_each(tmp_path):
    # What submitit's local executor (as hydra-submitit-launcher sets it up from the launcher
    # node) exports to every task of a 2-task job: the first 2 GPUs, not none.
    import submitit

    node = launcher("launcher=submitit_local")
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="local")
    executor.update_parameters(**{k: node[k] for k in ("tasks_per_node", "gpus_per_node",
                                                       "timeout_min")})
    assert executor.submit(_visible_gpus).results() == ["0,1", "0,1"]


def test_paper_scale_does_not_ask_for_deterministic_algorithms(compose_cfg):
    # conf/scale/paper.yaml says why; tiny scale (CPU) keeps bit-exact runs
    paper = compose_cfg("sweep=table1", "benchmark=cifar10", "scale=paper")
    assert paper.trainer.deterministic is False and paper.trainer.num_workers is None
    tiny = compose_cfg("sweep=table1", "benchmark=cifar10", "scale=tiny")
    assert tiny.trainer.deterministic is True and compose_cfg().trainer.deterministic is True


def test_every_planned_batch_is_checked_against_the_data(compose_cfg, tmp_path):
    # scheduler=plan's batches, like accordion_batch's, before any process group starts
    import data
    from training.config import prepare

    cfg = compose_cfg("dataset=digits", "scheduler=plan", "scheduler.epochs=[0,2]",
                      "scheduler.batch_sizes=[32,4096]", "trainer.batch_size=32")
    with pytest.raises(ConfigError, match=r"^scheduler\.batch_sizes\[1\]: 4096 is larger than "
                                          r"the training set \(\d+ examples\)$"):
        prepare(cfg, data.build(cfg.dataset), 1, tmp_path)
