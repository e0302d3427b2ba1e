"""The per-epoch learning-rate schedule (core/lr.py): warm-up, milestones, bad values.

Expected values are written out by hand from the documented rule, never computed by the code
under test.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from core.errors import ConfigError
from core.lr import check, lr_at


def optimizer(lr: float = 0.4, warmup_epochs: int = 0, warmup_start_lr: float = 0.1,
              milestones: list[int] | None = None, decay_factors: list[float] | None = None,
              weight_decay: float = 0.0, lag: object = None):
    schedule = {"warmup_epochs": warmup_epochs, "warmup_start_lr": warmup_start_lr,
                "milestones": milestones or [],
                "decay_factors": [] if decay_factors is None else decay_factors}
    if lag is not None:  # without the key: the schedule as written (lag 0)
        schedule["lag"] = lag
    return OmegaConf.create({"lr": lr, "weight_decay": weight_decay, "schedule": schedule})


class Plain(dict):
    """A config of plain Python containers (attribute access and ``get``), as a script builds
    it: its lists stay lists or tuples, not OmegaConf's ListConfig."""

    __getattr__ = dict.__getitem__


def test_constant_without_warmup_or_milestones():
    assert [lr_at(optimizer(lr=0.25), e) for e in range(4)] == [0.25] * 4


def test_warmup_rises_linearly_from_the_start_lr():
    # the Accordion authors' recipe: 0.1 -> 0.4 over 5 epochs, then 0.4
    cfg = optimizer(lr=0.4, warmup_epochs=5, warmup_start_lr=0.1)
    assert [lr_at(cfg, e) for e in range(7)] == pytest.approx(
        [0.1, 0.16, 0.22, 0.28, 0.34, 0.4, 0.4], abs=1e-12)
    assert lr_at(cfg, 0) == 0.1  # the first epoch runs at exactly warmup_start_lr


def test_warmup_of_one_epoch():
    cfg = optimizer(lr=1.0, warmup_epochs=1, warmup_start_lr=0.5)
    assert [lr_at(cfg, e) for e in range(3)] == [0.5, 1.0, 1.0]


def test_each_milestone_factor_is_relative_to_lr_not_compounded():
    # "/10 from epoch 150, /100 from 250": factors [0.1, 0.01] of lr, not 0.1 * 0.01
    cfg = optimizer(lr=0.4, milestones=[150, 250], decay_factors=[0.1, 0.01])
    assert lr_at(cfg, 149) == 0.4
    assert lr_at(cfg, 150) == pytest.approx(0.04, abs=1e-15)  # the first decayed epoch
    assert lr_at(cfg, 249) == pytest.approx(0.04, abs=1e-15)
    assert lr_at(cfg, 250) == pytest.approx(0.004, abs=1e-15)
    assert lr_at(cfg, 299) == pytest.approx(0.004, abs=1e-15)


def test_a_factor_above_one_raises_the_lr():
    cfg = optimizer(lr=0.1, milestones=[2, 4], decay_factors=[0.5, 2.0])
    assert [lr_at(cfg, e) for e in range(6)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.2, 0.2])


def test_warmup_then_decay():
    cfg = optimizer(lr=1.0, warmup_epochs=2, warmup_start_lr=0.5, milestones=[3],
                    decay_factors=[0.1])
    assert [lr_at(cfg, e) for e in range(5)] == pytest.approx([0.5, 0.75, 1.0, 0.1, 0.1])


def test_milestone_inside_the_warmup_waits_for_its_end():
    # the warm-up rule wins while it lasts; afterwards the factor of every milestone passed
    cfg = optimizer(lr=1.0, warmup_epochs=4, warmup_start_lr=0.2, milestones=[2],
                    decay_factors=[0.5])
    assert [lr_at(cfg, e) for e in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.5, 0.5])


# ---- lag: epoch e trains with s(max(e - lag, 0)) -------------------------------------------------
def test_lag_one_runs_each_epoch_with_the_previous_epochs_lr():
    # the Accordion authors' code: the warm-up peaks at epoch 6, milestones 151/251 act at 152/252
    cfg = optimizer(lr=0.4, warmup_epochs=5, warmup_start_lr=0.1, milestones=[151, 251],
                    decay_factors=[0.1, 0.01], lag=1)
    assert [lr_at(cfg, e) for e in range(8)] == pytest.approx(
        [0.1, 0.1, 0.16, 0.22, 0.28, 0.34, 0.4, 0.4], abs=1e-12)
    assert lr_at(cfg, 151) == 0.4
    assert lr_at(cfg, 152) == pytest.approx(0.04, abs=1e-15)
    assert lr_at(cfg, 251) == pytest.approx(0.04, abs=1e-15)
    assert lr_at(cfg, 252) == pytest.approx(0.004, abs=1e-15)


def test_a_lag_longer_than_the_epoch_holds_the_first_lr():
    # max(e - lag, 0): the first `lag` epochs all run at s(0), never at a negative epoch's
    cfg = optimizer(lr=1.0, warmup_epochs=2, warmup_start_lr=0.5, milestones=[3],
                    decay_factors=[0.1], lag=2)
    assert [lr_at(cfg, e) for e in range(7)] == pytest.approx(
        [0.5, 0.5, 0.5, 0.75, 1.0, 0.1, 0.1])


def test_lag_zero_is_the_schedule_as_written():
    kwargs = {"lr": 1.0, "warmup_epochs": 2, "warmup_start_lr": 0.5, "milestones": [3],
              "decay_factors": [0.1]}
    expected = pytest.approx([0.5, 0.75, 1.0, 0.1, 0.1])
    assert [lr_at(optimizer(**kwargs, lag=0), e) for e in range(5)] == expected
    assert [lr_at(optimizer(**kwargs), e) for e in range(5)] == expected  # no lag key


def test_valid_schedules_pass():
    check(optimizer())
    check(optimizer(warmup_epochs=3, warmup_start_lr=0.01, milestones=[1, 2, 5],
                    decay_factors=[0.5, 0.25, 0.1], weight_decay=0.0))
    check(optimizer(milestones=[151], decay_factors=[0.1], lag=1))


@pytest.mark.parametrize("factors", [[0.1, 0.01], (0.1, 0.01)])
def test_a_plain_python_config_passes(factors):
    # decay_factors may be a list or a tuple as well as OmegaConf's ListConfig
    cfg = Plain(lr=0.4, weight_decay=0.0, schedule=Plain(
        warmup_epochs=0, warmup_start_lr=0.1, milestones=[2, 4], decay_factors=factors, lag=1))
    check(cfg)
    assert [lr_at(cfg, e) for e in range(6)] == pytest.approx(
        [0.4, 0.4, 0.4, 0.04, 0.04, 0.004])


def test_lr_at_never_drops_a_milestone_without_a_factor():
    # check() refuses such a config; lr_at itself does not silently ignore the extra milestone
    with pytest.raises(ValueError):
        lr_at(optimizer(milestones=[1, 2], decay_factors=[0.1]), 3)


@pytest.mark.parametrize(("cfg", "message"), [
    (optimizer(lr=0), "optimizer.lr: expected a number in (0, inf), got 0"),
    (optimizer(lr=-1e-3), "optimizer.lr: expected a number in (0, inf), got -0.001"),
    (optimizer(weight_decay=-1e-4),
     "optimizer.weight_decay: expected a number in [0, inf), got -0.0001"),
    (optimizer(warmup_epochs=-1),
     "optimizer.schedule.warmup_epochs: expected an integer >= 0, got -1"),
    (optimizer(warmup_epochs=1, warmup_start_lr=0),
     "optimizer.schedule.warmup_start_lr: expected a number in (0, inf), got 0"),
    (optimizer(warmup_epochs=2, warmup_start_lr=-0.1),
     "optimizer.schedule.warmup_start_lr: expected a number in (0, inf), got -0.1"),
    (optimizer(milestones=[5], decay_factors=[]),
     "optimizer.schedule.decay_factors: expected one factor per milestone, got 0 factors for 1 "
     "milestones"),
    (optimizer(milestones=[5, 3], decay_factors=[0.1, 0.01]),
     "optimizer.schedule.milestones: expected increasing epochs >= 1, got [5, 3]"),
    (optimizer(milestones=[0], decay_factors=[0.1]),
     "optimizer.schedule.milestones: expected a list of integers >= 1, got [0]"),
    (optimizer(milestones=[3], decay_factors=[0]),
     "optimizer.schedule.decay_factors: expected a number in (0, inf), got 0"),
    (optimizer(milestones=[3, 4], decay_factors=[0.1, -0.1]),
     "optimizer.schedule.decay_factors: expected a number in (0, inf), got -0.1"),
    (optimizer(decay_factors=0.1),
     "optimizer.schedule.decay_factors: expected a list of numbers > 0, got 0.1"),
    (optimizer(milestones=[3], decay_factors="0.1"),
     "optimizer.schedule.decay_factors: expected a list of numbers > 0, got '0.1'"),
    (optimizer(lag=-1), "optimizer.schedule.lag: expected an integer >= 0, got -1"),
    (optimizer(lag=0.5), "optimizer.schedule.lag: expected an integer >= 0, got 0.5"),
    (optimizer(lag=True), "optimizer.schedule.lag: expected an integer >= 0, got True"),
])
def test_bad_values_give_the_whole_message(cfg, message):
    with pytest.raises(ConfigError) as info:
        check(cfg)
    assert str(info.value) == message
