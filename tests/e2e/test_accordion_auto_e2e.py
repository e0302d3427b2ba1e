"""Accordion with measured endpoints end to end: `run.py` on 2 real gloo ranks and on 2 simulated
learners (the same numbers), the offline replay of a run's logged statistics, an epoch-end resume,
the batch twin, and the W&B panels' keys. Short schedules on 128 digits."""

from __future__ import annotations

import re

import pytest
import torch

import compression
from analysis.dashboard import SECTIONS
from core.lr import lr_at
from schedulers.accordion_auto import Chooser, candidates, replay_levels
from tests.conftest import TIMING, TINY, assert_ok, read_rows, run_cli

pytestmark = pytest.mark.slow

AUTO = ["compressor=powersgd", "compressor.rank=4", "scheduler=accordion_auto",
        "scheduler.levels=[4,2,1]", "scheduler.interval=1", "scheduler.probe_steps=2",
        "optimizer.schedule.milestones=[2]", "optimizer.schedule.decay_factors=[0.1]",
        "trainer.epochs=4"]


def _metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_rows(run_dir)]


def test_gloo_ranks_and_simulated_learners_choose_alike_and_the_replay_agrees(tmp_path,
                                                                             compose_cfg):
    real, sim = tmp_path / "real", tmp_path / "sim"
    assert_ok(run_cli([*TINY, *AUTO, f"hydra.run.dir={real}"], nproc=2))
    assert_ok(run_cli([*TINY, *AUTO, "launcher=simulated", "trainer.workers=2",
                       f"hydra.run.dir={sim}"]))
    rows = _metrics(real)
    assert rows == _metrics(sim)  # every metric, the measurements included, bit for bit
    layers = sorted(k.removeprefix("level/") for k in rows[0] if k.startswith("level/"))
    assert rows[0]["level/" + layers[0]] == 4  # epoch 0: the first candidate
    for row in rows:  # measured every epoch (interval 1): why it chose, per layer
        for n in layers:
            assert {f"auto/{s}/{n}" for s in ("noise", "local_sq", "corrected_sq", "low",
                                              "high", "error@1", "bits@2")} <= row.keys()
        assert row["auto/probe_bits/model"] > 0 and "auto/noise_scale/model" in row
    for before, row in zip(rows, rows[1:], strict=False):  # each epoch runs the last choice
        for n in layers:
            chosen = before[f"auto/low/{n}"] if row[f"critical/{n}"] else before[f"auto/high/{n}"]
            assert row[f"level/{n}"] == chosen, (row["epoch"], n)
    assert any(r[f"level/{n}"] != 4 for r in rows for n in layers)  # it did compress harder
    # The offline replay of the logged numbers makes the logged choices.
    cfg = compose_cfg(*TINY, *AUTO)
    s = cfg.scheduler
    levels = candidates(compression.build_compressor(cfg.compressor), list(s.levels))
    chooser = Chooser(levels, s.rule, s.fraction_low, s.fraction_high, s.budget, s.interval)
    lrs = [lr_at(cfg.optimizer, e) for e in range(len(rows) + 1)]
    replayed = replay_levels(rows, lrs, layers, chooser, s.eta, s.interval)
    assert replayed == [{n: r[f"level/{n}"] for n in layers} for r in rows]
    # ... and what another rule would have chosen, with its payload estimated
    lighter = Chooser(levels, "budget", 0.5, 1.0, 0.02, s.interval)
    other = replay_levels(rows, lrs, layers, lighter, s.eta, s.interval)
    assert sum(v == 1 for e in other for v in e.values()) > sum(
        v == 1 for e in replayed for v in e.values())
    # W&B: the workspace's panels plot keys such a run logs
    keys = set().union(*rows)
    for panel in (p for panels in SECTIONS.values() for p in panels if p.metric_regex):
        assert any(re.match(panel.metric_regex, k) for k in keys), panel.title


def test_epoch_end_resume_is_bit_exact_with_a_budget(tmp_path):
    # Top-K (whose epoch-end resume is exact), a budget: the detector's history, the choices,
    # the bits they were measured at and the payload so far all come back from the checkpoint.
    common = [*TINY, "compressor=topk", "scheduler=accordion_auto",
              "scheduler.levels=[0.5,0.1,0.02]", "scheduler.interval=1",
              "scheduler.budget=0.4", "scheduler.probe_steps=2", "launcher=simulated",
              "trainer.workers=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert_ok(run_cli([*common, "trainer.epochs=4", f"hydra.run.dir={straight}"]))
    assert_ok(run_cli([*common, "trainer.epochs=2", f"hydra.run.dir={resumed}"]))
    saved = torch.load(resumed / "checkpoint.pt", weights_only=True)["scheduler"]
    path = tmp_path / "scheduler.pt"
    torch.save(saved, path)
    assert torch.load(path, weights_only=True) == saved  # plain containers only
    assert_ok(run_cli([*common, "trainer.epochs=4", "resume=true", f"hydra.run.dir={resumed}"]))
    rows = _metrics(straight)
    assert rows == _metrics(resumed)
    assert "auto/allowance/model" in rows[2]


def test_batch_twin_takes_the_noise_scale(tmp_path):
    # interval 1, LR decay into epoch 2: epochs 0, 1 critical (batch_low), 2 critical (decay),
    # 3 decided by the norms; B_high is the largest candidate below the measured B_simple.
    assert_ok(run_cli([*TINY, "scheduler=accordion_batch_auto", "scheduler.batch_low=16",
                       "scheduler.batches=[16,32,64]", "scheduler.interval=1",
                       "scheduler.eta=100", "optimizer.lr=0.05",
                       "optimizer.schedule.milestones=[2]",
                       "optimizer.schedule.decay_factors=[0.1]", "trainer.epochs=4",
                       "launcher=simulated", "trainer.workers=2", f"hydra.run.dir={tmp_path}"]))
    rows = read_rows(tmp_path)
    assert [r["critical/model"] for r in rows] == [True, True, True, False]
    assert [r["batch_size"] for r in rows[:3]] == [16, 16, 16]
    b_simple = rows[2]["auto/noise_scale/model"]
    high = max([16, *(b for b in (16, 32, 64) if b <= b_simple)])
    assert rows[2]["auto/batch_high/model"] == high == rows[3]["batch_size"]
    assert rows[3]["lr"] == pytest.approx(0.005 * high / 16)
    assert all(r["auto/probe_bits/model"] > 0 for r in rows)  # the gathered scalars only
