"""Accordion end to end: 2 real gloo ranks through `torchrun run.py`, short schedules.

The detector is driven into known states: ``eta=100`` makes the norm rule never fire (a ratio
>= 100 is impossible here), so critical epochs come only from the start window and the LR decay.
"""

from __future__ import annotations

import pytest
import torch

from schedulers.accordion import replay
from tests.conftest import TINY, assert_ok, read_rows, run_cli

pytestmark = pytest.mark.slow


def _powersgd_bits_per_step(model: dict[str, torch.Tensor], rank: int) -> int:
    """32 (n + m) r per matrix-shaped layer (dense where that is no saving), 32 per 1-D element."""
    bits = 0
    for key, value in model.items():
        if not value.is_floating_point() or "running" in key:
            continue
        if value.ndim <= 1:
            bits += 32 * value.numel()
            continue
        n, m = value.shape[0], value.numel() // value.shape[0]
        r = min(rank, n, m)
        bits += 32 * (n * m if (n + m) * r >= n * m else (n + m) * r)
    return bits


def test_accordion_powersgd_switches_levels_and_bits(tmp_path):
    # interval 2, LR /10 from epoch 3: epochs 0..2 critical (start), 3..4 critical (decay),
    # 5 not critical (the check at the end of epoch 4 cannot fire with eta=100).
    assert_ok(run_cli([*TINY, "compressor=powersgd", "scheduler=accordion", "scheduler.low=2",
                       "scheduler.high=1", "scheduler.interval=2", "scheduler.eta=100",
                       "optimizer.schedule.milestones=[3]",
                       "optimizer.schedule.decay_factors=[0.1]",
                       "trainer.epochs=6", f"hydra.run.dir={tmp_path}"], nproc=2))
    rows = read_rows(tmp_path)
    model = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    layers = sorted(k[len("level/"):] for k in rows[0] if k.startswith("level/"))
    assert layers and all(model[name].ndim > 1 for name in layers)
    expected_critical = [True] * 5 + [False]
    steps = 128 // 32
    for row, critical in zip(rows, expected_critical, strict=True):
        assert all(row[f"critical/{n}"] is critical for n in layers), row["epoch"]
        rank = 2 if critical else 1
        assert all(row[f"level/{n}"] == rank for n in layers), row["epoch"]
        assert row["comm/bits"] == steps * _powersgd_bits_per_step(model, rank), row["epoch"]
    assert rows[5]["comm/bits"] < rows[4]["comm/bits"] < rows[4]["comm/bits_dense"]
    # The logged decisions are the replay of the logged norms and LRs.
    norms = [{n: r[f"grad_norm/{n}"] for n in layers} for r in rows]
    lrs = [r["lr"] for r in rows] + [rows[-1]["lr"]]
    decided = replay(norms, lrs, eta=100, interval=2)
    assert [all(d.values()) for d in decided[:6]] == expected_critical


def test_accordion_batch_changes_steps_and_lr(tmp_path):
    # interval 1: epochs 0..1 critical (start); 2 not; LR decay into 3 makes 3 critical; 4 not.
    assert_ok(run_cli([*TINY, "scheduler=accordion_batch", "scheduler.batch_low=16",
                       "scheduler.batch_high=32", "scheduler.interval=1", "scheduler.eta=100",
                       "scheduler.lr_scaling=linear", "optimizer.lr=0.05",
                       "optimizer.schedule.milestones=[3]",
                       "optimizer.schedule.decay_factors=[0.1]",
                       "trainer.epochs=5", f"hydra.run.dir={tmp_path}"], nproc=2))
    rows = read_rows(tmp_path)
    assert [r["batch_size"] for r in rows] == [16, 16, 32, 16, 32]
    assert [r["lr"] for r in rows] == pytest.approx([0.05, 0.05, 0.1, 0.005, 0.01])
    assert [r["critical/model"] for r in rows] == [True, True, False, True, False]
    # none compressor: bits are 32 per element per step, and steps halve with the batch.
    per_step = rows[0]["comm/bits"] / (128 // 16)
    assert [r["comm/bits"] / per_step for r in rows] == [8, 8, 4, 8, 4]
