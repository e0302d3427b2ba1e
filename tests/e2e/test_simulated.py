"""Simulated learners (training/simulated.py) against real DDP ranks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from benchmarks.ranks import run_ranks
from core.errors import ConfigError
from tests.conftest import CONF, TIMING, TINY, assert_ok, read_rows, run_cli
from tests.ranks.test_compression_ddp import PROBE, SmallCNN, batch, make_ddp, plain
from training import config
from training.simulated import SimulatedWorkers

CONFIGS = [{"name": "none"}, {"name": "powersgd", "rank": 2},
           {"name": "topk", "ratio": 0.1, "error_feedback": False, "reduce": "sum"},
           {"name": "adacomp", "conv_bin_size": 20, "fc_bin_size": 100},
           {"name": "ef_signsgd", "block_size": 16}]
STEPS = 4


def _real(rank: int, world: int) -> list[list[dict[str, np.ndarray]]]:
    """Each config's aggregated gradients of every step, on one rank of a real gloo job."""
    runs = []
    for cfg in CONFIGS:
        model, ddp, _, opt = make_ddp(OmegaConf.create(cfg), bucket_cap_mb=25)
        grads = []
        for step in range(STEPS):
            x, y = batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            grads.append(plain({n: p.grad for n, p in model.named_parameters()}))
            opt.step()
        runs.append(grads)
    return runs


@pytest.fixture
def group():
    """A world-size-1 group, one intra-op thread (as the real ranks use: threads round alike)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def simulated(cfg: dict, world: int) -> list[dict[str, np.ndarray]]:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    workers = SimulatedWorkers(model, OmegaConf.create(cfg), [PROBE] * world,
                               list(range(world)), bucket_cap_mb=25)
    grads = []
    for step in range(STEPS):
        opt.zero_grad()

        def local_backward(w: int, step: int = step) -> None:
            x, y = batch(w, step)
            torch.nn.functional.cross_entropy(workers.ddp(x), y).backward()

        workers.step(local_backward)
        grads.append(plain({n: p.grad for n, p in model.named_parameters()}))
        opt.step()
    return grads


def test_two_simulated_workers_step_as_two_real_ranks(group) -> None:
    # Same buckets (DDP's, settled before the first step), same reduction order: bit for bit.
    real = run_ranks(_real, 2)[0]
    for cfg, real_grads in zip(CONFIGS, real, strict=True):
        for step, (got, want) in enumerate(zip(simulated(cfg, 2), real_grads, strict=True)):
            for name in want:
                assert np.array_equal(got[name], want[name]), f"{cfg['name']} step {step} {name}"


def test_three_workers_average_three_gradients(group) -> None:
    local = []
    for w in range(3):
        torch.manual_seed(0)
        model = SmallCNN()
        x, y = batch(w, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local.append({n: p.grad.clone() for n, p in model.named_parameters()})
    got = simulated({"name": "none"}, 3)[0]
    for name, g in got.items():
        mean = (local[0][name] + local[1][name] + local[2][name]) / 3
        torch.testing.assert_close(torch.from_numpy(g), mean, atol=1e-6, rtol=1e-6)


# ---- run.py with launcher=simulated ----------------------------------------------------------
# Compressor (and scheduler) settings the equivalence test trains under, 2 epochs each.
RUN_CONFIGS = {
    "powersgd-accordion": ["compressor=powersgd", "scheduler=accordion", "scheduler.interval=1"],
    "topk": ["compressor=topk", "compressor.ratio=0.1"],
    "adacomp": ["compressor=adacomp", "observe.overlap_epochs=[1]", "observe.overlap_steps=2"],
}


def _metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_rows(run_dir)]


@pytest.mark.parametrize("overrides, field", [
    (["launcher=simulated", "trainer.workers=0"], "trainer.workers: expected an integer in [1, "),
    (["trainer.workers=2.5"], "trainer.workers: expected an integer in [1, "),
    (["launcher=simulated", "trainer.workers=3"],
     "trainer.batch_size: the global batch 32 must be divisible by the world size 3"),
])
def test_bad_workers_are_one_line_before_anything_starts(compose_cfg, tmp_path, overrides, field):
    cfg = compose_cfg(*TINY, *overrides)
    with pytest.raises(ConfigError, match=re.escape(field)):
        config.validate(cfg, config.world_size(cfg, processes=1), tmp_path)


def test_simulated_learners_need_one_process(compose_cfg):
    cfg = compose_cfg(*TINY, "launcher=simulated", "trainer.workers=2")
    assert config.world_size(cfg, processes=1) == 2
    assert config.world_size(compose_cfg(*TINY), processes=4) == 4  # null: the real ranks
    with pytest.raises(ConfigError, match="trainer.workers: 2 simulated learners run in one "
                                          "process, but this is one of 2 ranks"):
        config.world_size(cfg, processes=2)


def test_bad_workers_exit_2_with_one_line(tmp_path):
    proc = run_cli([*TINY, "launcher=simulated", "trainer.workers=-1",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: trainer.workers: expected")
    assert "Traceback" not in proc.stderr and not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", [  # make test: AdaComp; the others with --stress (CI's time)
    pytest.param(n, marks=() if n == "adacomp" else pytest.mark.stress) for n in RUN_CONFIGS])
def test_two_simulated_learners_record_what_two_gloo_ranks_record(tmp_path, name):
    # The same buckets, reduction order and RNG streams as 2 torchrun ranks: every per-epoch
    # metric but the timings is bit-identical (float equality of the JSON numbers).
    common = [*TINY, *RUN_CONFIGS[name], "trainer.epochs=2"]
    assert_ok(run_cli([*common, "launcher=simulated", "trainer.workers=2",
                       f"hydra.run.dir={tmp_path / 'sim'}"]))
    assert_ok(run_cli([*common, f"hydra.run.dir={tmp_path / 'real'}"], nproc=2))
    sim, real = _metrics(tmp_path / "sim"), _metrics(tmp_path / "real")
    assert len(sim) == 2 and sim == real
    assert sim[0]["comm/bits"] < sim[0]["comm/bits_dense"]  # it did compress
    if name.endswith("accordion"):
        assert any(k.startswith("critical/") for k in sim[0])
    if name == "adacomp":  # the top-k overlap, measured by learner 0 as by rank 0
        assert "overlap_model" in sim[1] and "overlap_model" not in sim[0]
    a = torch.load(tmp_path / "sim" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "real" / "checkpoint.pt", weights_only=True)
    assert a["world_size"] == b["world_size"] == 2
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


@pytest.mark.slow
@pytest.mark.stress  # with --stress (make stress): the whole suite must fit CI's 30 minutes
def test_simulated_resume_is_bit_exact(tmp_path):
    # 4 learners, AdaComp: each learner's residue and RNG streams are in the checkpoint.
    common = [*TINY, "launcher=simulated", "trainer.workers=4", "compressor=adacomp"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert_ok(run_cli([*common, "trainer.epochs=3", f"hydra.run.dir={straight}"]))
    assert_ok(run_cli([*common, "trainer.epochs=1", f"hydra.run.dir={resumed}"]))
    saved = torch.load(resumed / "checkpoint.pt", weights_only=True)
    assert saved["world_size"] == 4 and len(saved["per_rank"]) == 4
    assert_ok(run_cli([*common, "trainer.epochs=3", "resume=true", f"hydra.run.dir={resumed}"]))
    assert _metrics(straight) == _metrics(resumed)
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for wa, wb in zip(a["per_rank"], b["per_rank"], strict=True):
        for layer, state in wa["compressor"]["layers"].items():
            for k, v in state["memory"].items():
                assert torch.equal(v, wb["compressor"]["layers"][layer]["memory"][k]), layer
    # Another number of learners cannot continue it.
    proc = run_cli([*TINY, "launcher=simulated", "trainer.workers=2", "compressor=adacomp",
                    "trainer.epochs=4", "resume=true", f"hydra.run.dir={resumed}"])
    assert proc.returncode == 2 and "written by 4 ranks" in proc.stderr


# ---- the claims' sweeps ----------------------------------------------------------------------
def _claim_runs(name: str) -> list:
    from hydra import compose, initialize_config_dir

    from jobs import sweeps

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"sweep={name}"], return_hydra_config=True)
        todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params,
                             [f"sweep={name}"], cfg.scale)
        return [compose("config", overrides=j, return_hydra_config=True) for j in todo]


def _validate(cfg, run_dir) -> None:
    """``training.config.validate`` on a composed run (without Hydra's own node), as run.py."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    config.validate(task, config.world_size(task, processes=1), run_dir)


def test_claim_learners_sweep_composes(tmp_path):
    runs = _claim_runs("claim_learners")
    ada = [(c.optimizer.name, c.trainer.workers) for c in runs if c.compressor.name == "adacomp"]
    assert sorted(ada) == sorted((o, w) for o in ("sgd", "adam")
                                 for w in (1, 2, 4, 8, 16, 32, 64, 128))
    assert sorted((c.optimizer.name, c.trainer.workers) for c in runs
                  if c.compressor.name == "none") == [("adam", 1), ("sgd", 1)]
    dirs = {str(c.hydra.sweep.subdir) for c in runs}
    assert len(dirs) == len(runs)  # one directory, and one identity (method), per run
    for c in runs:
        assert c.model.name == "cifar10_cnn" and list(c.model.channels) == [32, 32, 64]
        assert c.trainer.batch_size == 128 and c.hydra.launcher.nproc_per_node == 1
        _validate(c, tmp_path)


def test_claim_minibatch_sweep_composes(tmp_path):
    runs = _claim_runs("claim_minibatch")
    per_learner = sorted(c.trainer.batch_size // c.trainer.workers for c in runs)
    assert per_learner == [2, 4, 8, 16, 32, 64, 128]
    assert {c.compressor.name for c in runs} == {"adacomp"}
    assert len({str(c.hydra.sweep.subdir) for c in runs}) == len(runs)
    for c in runs:
        _validate(c, tmp_path)
