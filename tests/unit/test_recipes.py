"""The paper-scale recipes give every epoch the LR the Accordion authors' code gave it.

Their code (official-implementation facts in analysis/reference/README.md) sets epoch e+1's LR at
the end of epoch e from e: lr = base x (1 + (W - 1) min(e / 5, 1)), divided by 10 for e > 150
and by 100 for e > 250 (CIFAR; the LSTM: by 10 for 60 < e < 80, by 100 for e >= 80); epoch 0 runs
at base. Their published curves (analysis/reference/official_curves.csv) show where the decays
acted, independently of that reading of the code.
"""

from __future__ import annotations

import pandas as pd
import pytest

from core.lr import check, lr_at
from schedulers.accordion import replay
from tests.conftest import ROOT

CURVES = ROOT / "analysis" / "reference" / "official_curves.csv"


def authors_lr(epoch: int, base: float, workers: int, decays: tuple[int, int],
               last_inclusive: bool = False) -> float:
    """The authors' LR of ``epoch``: their get_lr evaluated at the end of the previous epoch."""
    if epoch == 0:
        return base
    e = epoch - 1  # get_lr(e) at the end of epoch e gives epoch e + 1's LR
    lr = base * (1.0 + (workers - 1.0) * min(e / 5, 1.0))
    first, second = decays
    if e > second or (last_inclusive and e >= second):
        return lr / 100.0
    return lr / 10.0 if e > first else lr


def schedule(compose_cfg, sweep: str, benchmark: str) -> list[float]:
    cfg = compose_cfg(f"sweep={sweep}", f"benchmark={benchmark}", "scale=paper")
    check(cfg.optimizer)
    return [lr_at(cfg.optimizer, e) for e in range(cfg.trainer.epochs + 1)]


def first_decays(lrs: list[float]) -> list[int]:
    """Epochs whose LR is below the previous epoch's."""
    return [e for e in range(1, len(lrs)) if lrs[e] < lrs[e - 1]]


@pytest.mark.parametrize(("sweep", "benchmark"), [("table1", "cifar10"), ("table2", "cifar100")])
def test_cifar_recipe_lr_equals_the_authors_every_epoch(compose_cfg, sweep, benchmark):
    lrs = schedule(compose_cfg, sweep, benchmark)
    expected = [authors_lr(e, 0.1, 4, (150, 250)) for e in range(301)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[5] < lrs[6] == pytest.approx(0.4)  # the warm-up peaks at epoch 6, not 5
    assert first_decays(lrs) == [152, 252]


def test_lstm_recipe_lr_equals_the_authors_every_epoch(compose_cfg):
    lrs = schedule(compose_cfg, "table4", "wikitext2")
    expected = [authors_lr(e, 2.5, 4, (60, 80), last_inclusive=True) for e in range(91)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert first_decays(lrs) == [62, 81]


def _by_epoch(curves: pd.DataFrame) -> pd.DataFrame:
    """One column per run, one row per epoch."""
    return curves.pivot_table(index="epoch", values="value",
                              columns=["table", "dataset", "model", "compressor", "setting"])


def test_decay_epochs_are_where_the_authors_curves_show_them(compose_cfg):
    curves = pd.read_csv(CURVES)
    cifar = _by_epoch(curves[curves.dataset.isin(["cifar10", "cifar100"])])
    change = cifar.diff().mean(axis=1)
    first = int(change.loc[141:200].idxmax())  # the accuracy jump of the first decay
    scatter = cifar.diff().abs().mean(axis=1)
    # the /100 decay shows as the epoch-to-epoch scatter halving: the first difference of two
    # epochs both trained at the low LR is one epoch after the decay
    calm = min(range(241, 290), key=lambda e: scatter.loc[e:e + 20].mean()
               / scatter.loc[e - 10:e - 1].mean())
    second = calm - 1
    lstm = _by_epoch(curves[curves.dataset == "wikitext2"])
    lstm_first = int(lstm.diff().mean(axis=1).loc[55:75].idxmin())  # the perplexity drop
    assert (first, second, lstm_first) == (152, 252, 62)
    assert first_decays(schedule(compose_cfg, "table1", "cifar10")) == [first, second]
    assert first_decays(schedule(compose_cfg, "table4", "wikitext2"))[0] == lstm_first


def test_accordion_forces_the_epochs_after_each_decay_as_in_the_authors_logs(compose_cfg):
    # Norms that never trigger the norm rule: only the start window and the LR decays count.
    lrs = schedule(compose_cfg, "table1", "cifar10")
    norms = [{"w": 1.0}] * 300
    critical = [e for e, d in enumerate(replay(norms, lrs, eta=0.5, interval=10)) if d["w"]]
    assert critical == [*range(0, 11), *range(152, 161), *range(252, 261)]
    lstm = schedule(compose_cfg, "table4", "wikitext2")
    critical = [e for e, d in enumerate(replay([{"w": 1.0}] * 90, lstm, interval=5)) if d["w"]]
    assert critical == [*range(0, 6), *range(62, 66), *range(81, 86)]


def test_lag_shifts_the_schedule_by_whole_epochs(compose_cfg):
    cfg = compose_cfg("optimizer.schedule.warmup_epochs=2", "optimizer.lr=0.1",
                      "optimizer.schedule.warmup_start_lr=0.02",
                      "optimizer.schedule.milestones=[3]", "optimizer.schedule.decay_factors=[0.5]")
    plain = [lr_at(cfg.optimizer, e) for e in range(6)]
    cfg.optimizer.schedule.lag = 2
    lagged = [lr_at(cfg.optimizer, e) for e in range(6)]
    assert plain == pytest.approx([0.02, 0.06, 0.1, 0.05, 0.05, 0.05])
    assert lagged == pytest.approx([0.02, 0.02, 0.02, 0.06, 0.1, 0.05])


@pytest.mark.parametrize("lag", [-1, 1.5, True, "1"])
def test_bad_lag_names_the_field(compose_cfg, lag):
    from core.errors import ConfigError

    cfg = compose_cfg()
    cfg.optimizer.schedule.lag = lag
    with pytest.raises(ConfigError, match=r"^optimizer\.schedule\.lag: "):
        check(cfg.optimizer)
