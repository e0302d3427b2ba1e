"""Accordion end to end with the norm rule firing: 2 real gloo ranks under torchrun, Top-K
switching between ratios 0.5 and 0.05, interval 1, eta 0.5, no LR decay (so every critical
epoch after the start window comes from the norm rule).

``tests/observed_run.py`` runs run.py and records, on each rank, the local gradients summed
per epoch by autograd hooks on the parameters (not by the communication hook) and what the
scheduler received and decided. From those, independently of the hook's Delta_e:

- the logged ``grad_norm/*`` are rank 0's local epoch sums;
- every rank's scheduler received rank 0's norms (rank 1's own differ) and decided alike;
- the logged decisions are Algorithm 1 replayed on the recomputed norms, and they include
  layers made critical by the rule after the start window, and layers not made critical;
- each epoch's bits are those of the levels decided.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from schedulers.accordion import replay
from tests.conftest import ROOT, TINY, assert_ok, read_rows

pytestmark = pytest.mark.slow

ETA, LOW, HIGH, EPOCHS, STEPS = 0.5, 0.5, 0.05, 6, 128 // 32


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("norm_rule")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "tests/observed_run.py", *TINY, "compressor=topk", "scheduler=accordion",
           "scheduler.interval=1", f"scheduler.eta={ETA}", f"scheduler.low={LOW}",
           f"scheduler.high={HIGH}", f"trainer.epochs={EPOCHS}", "trainer.dist_timeout_s=120",
           f"hydra.run.dir={out / 'run'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OBSERVE_DIR": str(out)}
    assert_ok(subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600))
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    model = torch.load(out / "run" / "checkpoint.pt", weights_only=True)["model"]
    return read_rows(out / "run"), ranks, model


def compressed(rows: list[dict]) -> list[str]:
    return sorted(k[len("critical/"):] for k in rows[0] if k.startswith("critical/"))


def test_logged_norms_are_rank0s_local_gradient_sums(observed):
    rows, ranks, model = observed
    assert len(rows) == len(ranks[0]["local"]) == EPOCHS
    trainable = [k for k, v in model.items() if v.is_floating_point() and "running" not in k]
    for row, local in zip(rows, ranks[0]["local"], strict=True):
        assert sorted(local) == sorted(trainable)
        for name, total in local.items():
            assert row[f"grad_norm/{name}"] == pytest.approx(float(total.norm()), rel=1e-5)


def test_every_rank_decides_on_rank0s_norms(observed):
    rows, ranks, _ = observed
    logged = [{k[len("grad_norm/"):]: v for k, v in row.items() if k.startswith("grad_norm/")}
              for row in rows]
    for r in ranks:
        assert r["received"] == logged
        for row, started in zip(rows, r["started"], strict=True):
            assert started == {k: row[k] for k in started}
            assert any(k.startswith("critical/") for k in started)
    # meaningful only because rank 1's own statistic differs from rank 0's (the comparisons
    # above are exact, so any difference tells them apart; one layer's can be as close as 7e-4)
    own = [{n: float(t.norm()) for n, t in epoch.items()} for epoch in ranks[1]["local"]]
    assert all(own[e][n] != logged[e][n] for e in range(EPOCHS) for n in compressed(rows))


def test_decisions_are_algorithm_1_on_the_recomputed_norms(observed):
    rows, ranks, _ = observed
    layers = compressed(rows)
    norms = [{n: float(epoch[n].norm()) for n in layers} for epoch in ranks[0]["local"]]
    lrs = [row["lr"] for row in rows] + [rows[-1]["lr"]]
    assert len(set(lrs)) == 1  # no LR decay: after epoch 1, only the norm rule decides
    expected = replay(norms, lrs, eta=ETA, interval=1)
    for e, row in enumerate(rows):
        assert {n: row[f"critical/{n}"] for n in layers} == expected[e], e
        assert {n: row[f"level/{n}"] for n in layers} == \
               {n: LOW if expected[e][n] else HIGH for n in layers}
        if e >= 1:
            for n in layers:
                ratio = abs(norms[e - 1][n] - norms[e][n]) / norms[e - 1][n]
                assert row[f"ratio/{n}"] == pytest.approx(ratio, rel=1e-5)
    after_window = [row[f"critical/{n}"] for row in rows[2:] for n in layers]
    assert any(after_window) and not all(after_window)  # the rule fired, and not everywhere


def test_each_epochs_bits_follow_its_levels(observed):
    rows, _, model = observed
    layers = compressed(rows)
    dense = sum(v.numel() for k, v in model.items()
                if v.is_floating_point() and "running" not in k and v.ndim <= 1)
    for row in rows:
        kept = sum(max(1, math.floor(row[f"level/{n}"] * model[n].numel())) for n in layers)
        assert row["comm/bits"] == STEPS * (64 * kept + 32 * dense), row["epoch"]
