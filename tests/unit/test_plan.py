"""The sweep plan (`make plan`): runs composed once per selection of config groups and equal to
Hydra's own composition, each run's resolved config or its diff against the defaults
(`make plan SHOW=config|diff`), and the dump of every sweep's runs (tools/sweep_configs.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from core.errors import ConfigError
from jobs import sweeps
from tests.conftest import CONF, ROOT, run_make
from tools import sweep_configs


def _jobs_and_compose(name: str, arguments: list[str]):
    """The sweep's jobs, Hydra's compose and its test for config groups (in an open context)."""
    scale = [a for a in arguments if a.startswith("scale=")]
    master = compose("config", overrides=[f"sweep={name}", *scale], return_hydra_config=True)
    jobs = sweeps.expand(master.hydra.sweeper.groups, master.hydra.sweeper.params,
                         [f"sweep={name}", *arguments], master.get("scale"))
    calls: list[list[str]] = []

    def compose_job(overrides: list[str]):
        calls.append(list(overrides))
        return compose("config", overrides=overrides, return_hydra_config=True)

    group_exists = GlobalHydra.instance().config_loader().repository.group_exists
    return jobs, compose_job, group_exists, calls


# Group keys, value keys inside groups (compressor.conv_bin_size, trainer.workers), value params
# (seed, optimizer.lr) and group params (variant, optimizer).
CASES = [("table1", ["scale=tiny", "model=resnet18"]), ("claim_residues", ["scale=tiny"]),
         ("claim_learners", []), ("ablation_ef", ["scale=paper", "method=rank1,k0.02"])]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "arguments"), CASES, ids=[c[0] for c in CASES])
def test_runs_composed_once_per_group_selection_equal_hydras(name, arguments):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        jobs, compose_job, group_exists, calls = _jobs_and_compose(name, arguments)
        whole = sweeps.compose_runs(jobs, compose_job)
        assert len(calls) == len(jobs)
        calls.clear()
        fast = sweeps.compose_runs(jobs, compose_job, group_exists)
    assert 0 < len(calls) < len(jobs)  # seeds (and other values) share one composition
    for a, b in zip(whole, fast, strict=True):
        assert sweep_configs.resolved_run(a) == sweep_configs.resolved_run(b)


def test_a_value_override_is_applied_to_its_own_copy():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        jobs, compose_job, group_exists, calls = _jobs_and_compose(
            "table1", ["scale=tiny", "model=resnet18", "method=rank2", "variant=ours"])
        cfgs = sweeps.compose_runs(jobs, compose_job, group_exists)
    assert len(calls) == 1 and [c.seed for c in cfgs] == [0, 1, 2]
    assert [c.compressor.seed for c in cfgs] == [0, 1, 2]  # interpolations follow the value
    assert [str(c.hydra.sweep.subdir).rsplit("/", 1)[1] for c in cfgs] == [
        "seed0", "seed1", "seed2"]


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    """Rank 2 and rank 1 of the tiny Table 1's ResNet-18, seed 0, and the default config."""
    root = tmp_path_factory.mktemp("runs")
    arguments = ["scale=tiny", "model=resnet18", "method=rank2,rank1", "variant=ours", "seed=0",
                 f"runs_root={root}"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        jobs, compose_job, group_exists, _ = _jobs_and_compose("table1", arguments)
        plan = sweeps.make_plan("table1", "tiny", 2, jobs, compose_job, group_exists)
        defaults = compose("config", overrides=[], return_hydra_config=True)
    return plan, defaults


def test_show_config_is_each_runs_resolved_config(small_plan):
    plan, _ = small_plan
    text = plan.show("config")
    blocks = text.split("\nrun ")
    assert len(blocks) == 2 and text.startswith("run 1/2: ")
    head, *body = blocks[0].split("\n")
    assert head.endswith("/table1/tiny/cifar10/resnet18/rank2/ours/seed0 (start)")
    shown = OmegaConf.create("\n".join(line[2:] for line in body))
    assert OmegaConf.to_container(shown) == sweeps.resolved(plan.jobs[0].cfg)
    assert "${" not in text and "hydra:" not in text


def test_show_diff_lists_only_the_keys_that_differ_from_the_defaults(small_plan):
    plan, defaults = small_plan
    lines = plan.show("diff", defaults).split("\n")
    first = lines[1:lines.index(next(x for x in lines if x.startswith("run 2/2")))]
    assert '  compressor.name: "none" -> "powersgd"' in first
    assert "  compressor.rank: (absent) -> 2" in first
    assert "  model.width: 64 -> 8" in first and '  benchmark: null -> "cifar10"' in first
    assert not any(x.startswith("  seed:") or x.startswith("  model.name:") for x in first)
    assert "  compressor.rank: (absent) -> 1" in lines[lines.index(
        next(x for x in lines if x.startswith("run 2/2"))):]


def test_show_refuses_an_unknown_mode(small_plan):
    plan, defaults = small_plan
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.show: 'yaml'; expected one of "
                                          r"\['config', 'diff'\]"):
        plan.show("yaml", defaults)


@pytest.mark.slow
def test_make_plan_show_diff_through_the_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "sweep=table1", "scale=tiny", "model=resnet18",
         "method=rank1", "variant=ours", "seed=0", f"runs_root={tmp_path}",
         "hydra.sweeper.dry_run=true", "hydra.sweeper.show=diff"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0] == ("sweep table1 (tiny scale): 1 runs: 0 complete, 0 to resume, "
                      "0 failed to rerun, 1 to start")
    assert out[2] == f"run 1/1: {tmp_path}/table1/tiny/cifar10/resnet18/rank1/ours/seed0 (start)"
    assert "  compressor.rank: (absent) -> 1" in out
    assert not list(tmp_path.iterdir())  # a plan writes nothing


def test_make_plan_passes_show():
    proc = run_make("-n", "plan", "SWEEP=table1", "SCALE=tiny", "SHOW=diff")
    line = proc.stdout.splitlines()[-1]
    assert "sweep=table1" in line and line.endswith("hydra.sweeper.dry_run=true "
                                                    "hydra.sweeper.show=diff")


def test_make_plan_of_a_claim_plans_what_its_target_runs(tmp_path):
    """``make plan SWEEP=claim_<name>`` launches as ``make claim-<name>`` does: SCALE=tiny's
    2 simulated learners are not laid over the claim's own launch (claim_learners sweeps 1 to
    128 learners in one process; claim_overlap runs on 2 CPU ranks)."""
    proc = run_make("plan", "SWEEP=claim_learners", "SCALE=tiny", f"RUNS={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("sweep claim_learners (tiny scale): 18 runs: 0 complete")
    core_min, wall_min = re.search(r"about (\d+) CPU core-minutes \((\d+) min on 2 cores;",
                                   proc.stdout.splitlines()[1]).groups()
    assert abs(int(wall_min) - int(core_min) / 2) <= 1  # two runs at a time
    proc = run_make("plan", "SWEEP=claim_overlap", "SCALE=tiny", f"RUNS={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("sweep claim_overlap (tiny scale): 2 runs: 0 complete")
    assert "on 2 cores;" in proc.stdout.splitlines()[1]
    assert not list(tmp_path.iterdir())


def test_sweep_dump_writes_every_scale(tmp_path):
    sweep_configs.main([str(tmp_path), "--sweeps", "claim_overlap"])
    paths = sorted(p.name for p in tmp_path.iterdir())
    assert paths == ["claim_overlap-default.yaml", "claim_overlap-paper.yaml",
                     "claim_overlap-tiny.yaml"]
    runs = OmegaConf.load(tmp_path / "claim_overlap-tiny.yaml").runs
    assert len(runs) == 2 and runs[0].run_dir.endswith("/seed0")
    assert runs[0].config.sweep == "claim_overlap" and "hydra" not in runs[0].config


@pytest.mark.slow
def test_make_reproduce_without_the_data_prints_only_the_dataset_line(tmp_path):
    # The sweep refuses (exit status 2) before it starts anything; its report is not run.
    proc = run_make("reproduce-table1", f"DATA_ROOT={tmp_path / 'data'}",
                    f"RUNS={tmp_path / 'runs'}", "ONLY=model=resnet18 seed=0", timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if not x.startswith("make: ***")]
    assert line.startswith("error: dataset.root: ") and "cifar-10-batches-py" in line
    assert proc.stdout.startswith("sweep table1 (paper scale): 4 runs: ")


def test_forward_flops_are_counted_once_and_kept(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = compose_cfg("model=resnet18", "model.width=8", "dataset=digits")
    counted = sweeps._forward_flops(cfg)
    path = sweeps.flops_cache()
    assert path.parent == tmp_path / "accordion-bench"
    (key, value), = json.loads(path.read_text()).items()
    assert value == counted > 0
    path.write_text(json.dumps({key: 123.0}))  # what is kept is what a plan uses
    assert sweeps._forward_flops(cfg) == 123.0
    wider = compose_cfg("model=resnet18", "model.width=16", "dataset=digits")
    assert sweeps._forward_flops(wider) > counted  # another model, another entry
    assert len(json.loads(path.read_text())) == 2
    path.write_text("{not json")
    assert sweeps._forward_flops(cfg) == counted  # a corrupt file is counted anew
