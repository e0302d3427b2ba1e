"""Accordion schedulers: the replay rule, levels set on a real HookState, batch/LR, resume, bad
input, and the what-if command."""

from __future__ import annotations

import io
import json
import logging
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn

import compression
import schedulers
from analysis.whatif import main
from compression.hook import HookState
from core.errors import ConfigError
from schedulers.accordion import replay
from tests.conftest import ROOT

T, F = True, False


def crit(decisions: list[dict[str, bool]], layer: str = "a") -> list[bool]:
    return [d[layer] for d in decisions]


def series(*values: float, layer: str = "a") -> list[dict[str, float]]:
    return [{layer: v} for v in values]


# ---- replay: the rule --------------------------------------------------------------------------
def test_replay_norm_rule_by_hand():
    # interval 2: epochs 0..2 critical; end of 2: |10-8|/10 = 0.2 -> 3,4 not critical;
    # end of 4: |8-3|/8 = 0.625 -> 5,6 critical; end of 6: |3-2.5|/3 = 0.17 -> 7,8 not.
    norms = series(10, 99, 8, 99, 3, 99, 2.5, 99)
    assert crit(replay(norms, [0.1] * 9, eta=0.5, interval=2)) == [T, T, T, F, F, T, T, F, F]


def test_replay_ratio_equal_to_eta_is_critical():
    norms = series(10, 1, 5, 1)  # |10 - 5| / 10 = 0.5 exactly
    assert crit(replay(norms, [1.0] * 5, eta=0.5, interval=2)) == [T, T, T, T, T]
    assert crit(replay(norms, [1.0] * 5, eta=0.51, interval=2)) == [T, T, T, F, F]


def test_replay_growth_counts_like_a_drop():
    norms = series(2, 0, 3)  # |2 - 3| / 2 = 0.5: the absolute value, not a signed drop
    assert crit(replay(norms, [1.0] * 4, eta=0.5, interval=2)) == [T, T, T, T]


def test_replay_lr_decay_on_a_check_epoch():
    # end of 4: norm rule says not critical (|8-8|/8 = 0) but the LR drops into epoch 5:
    # critical 5..6 (the next multiple of 2); end of 6 the norm rule decides again (0 -> not).
    norms = series(8, 8, 8, 8, 8, 8, 8, 8)
    lrs = [1.0] * 5 + [0.1] * 4
    assert crit(replay(norms, lrs, eta=0.5, interval=2)) == [T, T, T, F, F, T, T, F, F]


def test_replay_lr_decay_mid_interval():
    # interval 4, LR drops into epoch 6: critical 6..8, then the rule at 8 (|8-8|/8) -> 9.. not.
    norms = series(*[8.0] * 10)
    lrs = [1.0] * 6 + [0.1] * 5
    assert crit(replay(norms, lrs, eta=0.5, interval=4)) == [T] * 5 + [F, T, T, T, F, F]


def test_replay_lr_decay_into_a_multiple_is_one_epoch():
    # interval 4, LR drops into epoch 8 (a multiple): only epoch 8 is forced, then the rule.
    norms = series(*[8.0] * 10)
    lrs = [1.0] * 8 + [0.1] * 3
    assert crit(replay(norms, lrs, eta=0.5, interval=4)) == [T] * 5 + [F, F, F, T, F, F]


def test_replay_lr_rise_is_not_a_decay():
    norms = series(*[8.0] * 5)
    lrs = [0.1, 0.2, 0.3, 0.4, 0.4, 0.5]  # warm-up
    assert crit(replay(norms, lrs, eta=0.5, interval=2)) == [T, T, T, F, F, F]


def test_replay_zero_previous_norm_is_critical():
    assert crit(replay(series(0, 5, 0, 5), [1.0] * 5, eta=0.5, interval=2)) == [T] * 5
    assert crit(replay(series(0, 5, 3, 5), [1.0] * 5, eta=0.5, interval=2)) == [T] * 5


def test_replay_interval_one():
    # epochs 0, 1 critical; from the end of epoch 1 on, every epoch compares with the previous.
    norms = series(10, 10, 4, 4, 1)  # ratios at ends of 1..4: 0, 0.6, 0, 0.75
    assert crit(replay(norms, [1.0] * 6, eta=0.5, interval=1)) == [T, T, F, T, F, T]


def test_replay_layers_diverge():
    norms = [{"a": 10, "b": 10, "c": 0}, {"a": 1, "b": 1, "c": 1}, {"a": 9, "b": 2, "c": 0},
             {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1.5, "c": 0}]
    out = replay(norms, [1.0] * 6, eta=0.5, interval=2)
    assert crit(out, "a") == [T, T, T, F, F, T]  # 0.1 then 0.89
    assert crit(out, "b") == [T, T, T, T, T, F]  # 0.8 then 0.25
    assert crit(out, "c") == [T] * 6  # previous norm 0 every time


def test_replay_lengths_and_layers():
    assert replay([], [0.1]) == [{}]
    assert replay([], [0.1], layers=["a"]) == [{"a": True}]
    assert len(replay(series(*[1.0] * 7), [0.1] * 8)) == 8
    with pytest.raises(ValueError, match="one entry more"):
        replay(series(1, 2), [0.1, 0.1])
    with pytest.raises(ValueError, match="no entry for layer 'b'"):
        replay(series(1, 1, 1), [0.1] * 4, interval=2, layers=["a", "b"])


def test_replay_layers_default_to_those_of_epoch_0():
    assert replay([{"a": 1.0, "b": 1.0}, {"a": 1.0}], [0.1] * 3) == [{"a": T, "b": T}] * 3


@pytest.mark.parametrize(("norms", "layers", "message"), [
    (series(1, 1, 1), ["a", "b"], "replay: norms[0] has no entry for layer 'b'"),  # Delta_{e-2}
    ([{"a": 1, "b": 1}, {"a": 1}, {"a": 1}], None, "replay: norms[2] has no entry for layer 'b'"),
])
def test_replay_missing_norm_names_its_epoch(norms, layers, message):
    with pytest.raises(ValueError) as exc:
        replay(norms, [0.1] * 4, interval=2, layers=layers)
    assert str(exc.value) == message


# The default detector (eta 0.5, interval 10): |10 - 4| / 10 = 0.6 at the end of epoch 10 makes
# 11..20 critical, 0 at the end of 20 makes 21 not. Eta 1.5 would end the regime at 10; interval
# 11 would compare epoch 11 with epoch 0 (both 10: no change) and end it at 11.
DEFAULT_SERIES = [10.0] + [1.0] * 9 + [4.0, 10.0] + [1.0] * 8 + [4.0, 1.0]
DEFAULT_CRIT = [T] * 21 + [F]


def test_replay_defaults_are_eta_half_interval_ten():
    assert crit(replay(series(*DEFAULT_SERIES), [0.1] * 23)) == DEFAULT_CRIT + [F]


@pytest.mark.parametrize(("eta", "interval", "field"), [
    (0, 10, "scheduler.eta"), (-0.5, 10, "scheduler.eta"), (0.5, 0, "scheduler.interval"),
    (0.5, 2.5, "scheduler.interval"),
])
def test_replay_rejects_bad_detector(eta, interval, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        replay([], [0.1], eta=eta, interval=interval)


# ---- schedulers on a real HookState ------------------------------------------------------------
@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def hook_for(name: str, **params) -> HookState:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.Linear(16, 3))
    return HookState(compression.create(name, **params), model.named_parameters())


def build(**cfg) -> schedulers.Scheduler:
    return schedulers.build(OmegaConf.create(cfg))


# Norms of two compressed layers (interval 2): "0.weight" goes non-critical at the end of 2
# (0.1) and critical again at the end of 4 (0.78); "2.weight" stays critical (0.6) then not
# (0.25). Biases are in the norms, as run.py passes them, and must be ignored.
NORMS = [{"0.weight": w, "0.bias": 1.0, "2.weight": v, "2.bias": 1.0}
         for w, v in [(10, 10), (5, 5), (9, 4), (5, 5), (2, 3), (5, 5), (2, 3)]]
EXPECT_0 = [T, T, T, F, F, T, T]
EXPECT_2 = [T, T, T, T, T, F, F]


def drive(sched: schedulers.Scheduler, hook_state: HookState, epochs: range, lr=lambda e: 0.1,
          norms: list[dict[str, float]] = NORMS) -> list[dict]:
    """start_epoch / end_epoch as run.py calls them; per epoch the metrics and the levels."""
    out = []
    for e in epochs:
        row = dict(sched.start_epoch(e, hook_state))
        row["_levels"] = {n: hook_state.layers[n].level for n in hook_state.compressed_layers()}
        row["_batch"], row["_scale"] = sched.batch_size(e, 64), sched.lr_scale(e)
        row.update(sched.end_epoch(e, norms[e], lr(e), lr(e + 1)))
        out.append(row)
    return out


@pytest.mark.parametrize(("compressor", "params", "low", "high"), [
    ("powersgd", {"rank": 3}, 2, 1),
    ("topk", {"ratio": 0.5}, 0.99, 0.1),
    ("adacomp", {}, 50, 500),
])
def test_accordion_sets_levels_per_layer(group, compressor, params, low, high):
    hook_state = hook_for(compressor, **params)
    assert hook_state.compressed_layers() == ["0.weight", "2.weight"]
    # low/high null: the defaults
    rows = drive(build(name="accordion", interval=2), hook_state, range(7))
    for e, row in enumerate(rows):
        assert row["_levels"] == {"0.weight": low if EXPECT_0[e] else high,
                                  "2.weight": low if EXPECT_2[e] else high}
        assert row["critical/0.weight"] is EXPECT_0[e] and row["critical/2.weight"] is EXPECT_2[e]
        assert row["level/0.weight"] == row["_levels"]["0.weight"]
        assert (row["_batch"], row["_scale"]) == (64, 1.0)  # the batch is not its business
        assert "critical/0.bias" not in row and "level/2.bias" not in row
    assert rows[2]["ratio/0.weight"] == pytest.approx(0.1)
    assert rows[4]["ratio/2.weight"] == pytest.approx(0.25)
    assert not any(k.startswith("ratio/") for e in (0, 1, 3, 5) for k in rows[e])


def test_accordion_explicit_levels(group):
    hook_state = hook_for("powersgd")
    rows = drive(build(name="accordion", low=4, high=2, interval=2), hook_state, range(7))
    assert [r["_levels"]["0.weight"] for r in rows] == [4 if c else 2 for c in EXPECT_0]


def test_accordion_lr_decay_makes_every_layer_critical(group):
    hook_state = hook_for("powersgd")
    rows = drive(build(name="accordion", interval=2), hook_state, range(7),
                 lr=lambda e: 0.1 if e < 4 else 0.01)  # drops into epoch 4: 4 critical
    assert [r["critical/0.weight"] for r in rows] == [T, T, T, F, T, T, T]


BATCH_NORMS = [math.hypot(*(v for v in n.values())) for n in NORMS]


def test_batch_uses_whole_model_norm():
    # per layer, "0.weight" goes 10 -> 9 and "2.weight" 10 -> 4; the whole model
    # sqrt(100+1+100+1) -> sqrt(81+1+16+1): ratio 0.30 -> not critical at 3, 4.
    sched = build(name="accordion_batch", interval=2)
    for e in range(5):
        sched.start_epoch(e, None)
        metrics = sched.end_epoch(e, NORMS[e], 0.1, 0.1)
    assert metrics["ratio/model"] == pytest.approx(abs(BATCH_NORMS[2] - BATCH_NORMS[4])
                                                   / BATCH_NORMS[2])
    # end of 4: sqrt(99) -> sqrt(4+1+9+1): ratio 0.61 -> epoch 5 critical again.
    assert [sched.critical(e) for e in range(6)] == [T, T, T, F, F, T]
    assert sched.start_epoch(5, None) == {"critical/model": True}


@pytest.mark.parametrize(("scaling", "high_scale"), [
    ("linear", 8.0), ("sqrt", math.sqrt(8.0)), ("none", 1.0),
])
def test_batch_and_lr_per_epoch(scaling, high_scale):
    sched = build(name="accordion_batch", interval=2, lr_scaling=scaling)
    batches, scales = [], []
    for e in range(6):
        sched.start_epoch(e, None)
        batches.append(sched.batch_size(e, 64))
        scales.append(sched.lr_scale(e))
        sched.end_epoch(e, NORMS[e], 0.1, 0.1)
    assert batches == [512, 512, 512, 4096, 4096, 512]  # trainer.batch_size (64) ignored
    assert scales == pytest.approx([1.0, 1.0, 1.0, high_scale, high_scale, 1.0])


def test_joint_sets_levels_and_batch(group):
    hook_state = hook_for("powersgd")
    rows = drive(build(name="accordion_joint", interval=2, batch_low=256, batch_high=1024),
                 hook_state, range(6))
    assert [r["_levels"]["0.weight"] for r in rows] == [2 if c else 1 for c in EXPECT_0[:6]]
    assert [r["_levels"]["2.weight"] for r in rows] == [2 if c else 1 for c in EXPECT_2[:6]]
    assert [r["_batch"] for r in rows] == [256, 256, 256, 1024, 1024, 256]
    assert [r["_scale"] for r in rows] == [1.0, 1.0, 1.0, 4.0, 4.0, 1.0]
    assert [r["critical/model"] for r in rows] == [T, T, T, F, F, T]
    assert "ratio/model" in rows[2] and "ratio/0.weight" in rows[2]


def test_static_keeps_the_configured_level(group):
    hook_state = hook_for("powersgd", rank=3)
    rows = drive(build(name="static"), hook_state, range(4))
    assert all(r["_levels"] == {"0.weight": 3, "2.weight": 3} for r in rows)


def test_start_epoch_without_history_is_an_error(group):
    with pytest.raises(RuntimeError, match="start_epoch"):
        build(name="accordion").start_epoch(3, hook_for("powersgd"))


@pytest.mark.parametrize("name", ["accordion", "accordion_batch", "accordion_joint"])
def test_schedulers_default_to_eta_half_interval_ten(group, name):
    norms = [dict.fromkeys(NORMS[0], v) for v in DEFAULT_SERIES]  # whole model: 2 v, same ratios
    rows = drive(build(name=name), hook_for("powersgd"), range(22), norms=norms)
    assert [{v for k, v in r.items() if k.startswith("critical/")} for r in rows] == [
        {c} for c in DEFAULT_CRIT]


@pytest.mark.parametrize("name", ["accordion", "accordion_joint"])
def test_low_alone_keeps_the_compressors_high(group, name):
    rows = drive(build(name=name, low=4, interval=2), hook_for("powersgd"), range(7))
    assert [r["_levels"]["0.weight"] for r in rows] == [4 if c else 1 for c in EXPECT_0]


def test_accordion_tracks_the_compressed_layers_from_its_first_epoch(group):
    sched = build(name="accordion")
    assert sched.layers == []  # none before start_epoch
    sched.start_epoch(0, hook_for("powersgd"))
    assert sched.layers == ["0.weight", "2.weight"]


def test_nan_ratio_is_critical_and_logged_with_its_layers_and_norms(group, caplog):
    # end of 2: 0.weight nan -> 1 and 2.weight inf -> inf both give a NaN ratio
    nan, inf = math.nan, math.inf
    norms = [{**NORMS[0], "0.weight": w, "2.weight": v} for w, v in
             [(nan, inf), (1.0, 1.0), (1.0, inf), (1.0, 1.0)]]
    with caplog.at_level(logging.WARNING, logger="schedulers.accordion"):
        rows = drive(build(name="accordion", interval=2), hook_for("powersgd"), range(4),
                     norms=norms)
    assert math.isnan(rows[2]["ratio/0.weight"]) and math.isnan(rows[2]["ratio/2.weight"])
    assert rows[3]["critical/0.weight"] and rows[3]["critical/2.weight"]
    [record] = [r for r in caplog.records if r.name == "schedulers.accordion"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == ("accordion: NaN ratio at epoch 2 for 0.weight, 2.weight "
                                   "(norms [nan, inf] -> [1.0, inf]): critical")


def test_end_epoch_out_of_order_is_an_error():
    with pytest.raises(RuntimeError, match=r"^end_epoch\(3\) after 0 recorded epochs$"):
        build(name="accordion_batch").end_epoch(3, NORMS[0], 0.1, 0.1)


def test_batch_low_equal_to_batch_high_is_one_fixed_batch():
    sched = build(name="accordion_batch", batch_low=1024, batch_high=1024)
    assert (sched.batch_size(0, 64), sched.lr_scale(0)) == (1024, 1.0)


@pytest.mark.parametrize(("cfg", "sizes"), [
    ({"name": "static"}, {"trainer.batch_size": 64}),
    ({"name": "accordion"}, {"trainer.batch_size": 64}),
    ({"name": "accordion_batch", "batch_low": 256, "batch_high": 1024},
     {"scheduler.batch_low": 256, "scheduler.batch_high": 1024}),
    ({"name": "accordion_joint"}, {"scheduler.batch_low": 512, "scheduler.batch_high": 4096}),
    ({"name": "plan", "epochs": [0, 2]}, {"trainer.batch_size": 64}),
    ({"name": "plan", "epochs": [0, 2], "batch_sizes": [512, 4096]},
     {"scheduler.batch_sizes[0]": 512, "scheduler.batch_sizes[1]": 4096}),
])
def test_batch_sizes_name_every_batch_by_its_field(cfg, sizes):
    assert build(**cfg).batch_sizes(64) == sizes


# ---- plan: a fixed per-epoch plan, no detector -------------------------------------------------
def test_plan_levels_by_phase(group):
    hook_state = hook_for("powersgd", rank=3)
    rows = drive(build(name="plan", epochs=[0, 2, 5], levels=[1, None, 4]), hook_state, range(7))
    # null: the compressor's own level (rank 3) in that phase; the norms play no part
    assert [r["_levels"]["0.weight"] for r in rows] == [1, 1, 3, 3, 3, 4, 4]
    assert all(r["_levels"]["0.weight"] == r["_levels"]["2.weight"] for r in rows)
    assert all((r["_batch"], r["_scale"]) == (64, 1.0) for r in rows)  # no batch plan
    assert not any(k.startswith(("critical/", "ratio/")) for r in rows for k in r)


@pytest.mark.parametrize(("scaling", "base", "scales"), [
    ("linear", None, [1.0, 1.0, 8.0, 8.0]),
    ("sqrt", None, [1.0, 1.0, math.sqrt(8.0), math.sqrt(8.0)]),
    ("none", None, [1.0] * 4),
    ("linear", 256, [2.0, 2.0, 16.0, 16.0]),
])
def test_plan_batch_sizes_and_lr(scaling, base, scales):
    # the Accordion authors' batch runs: 512 for the first epochs, 4096 after (here from epoch 2)
    sched = build(name="plan", epochs=[0, 2], batch_sizes=[512, 4096], base_batch=base,
                  lr_scaling=scaling)
    assert [sched.batch_size(e, 64) for e in range(4)] == [512, 512, 4096, 4096]
    assert [sched.lr_scale(e) for e in range(4)] == pytest.approx(scales)


def test_plan_one_phase_of_large_batch_scales_lr_from_the_base():
    sched = build(name="plan", epochs=[0], batch_sizes=[4096], base_batch=512)
    assert (sched.batch_size(7, 64), sched.lr_scale(7)) == (4096, 8.0)


def test_plan_needs_no_state_to_resume():
    sched = build(name="plan", epochs=[0, 3], batch_sizes=[16, 32])
    assert sched.state_dict() == {} and sched.batch_size(5, 1) == 32  # a pure function of e


def test_plan_null_level_is_each_layers_own_default(group):
    hook_state = hook_for("adacomp")  # its own bins: 50 for conv kernels, 500 for matrices
    rows = drive(build(name="plan", epochs=[0, 2], levels=[200, None]), hook_state, range(3))
    assert [r["_levels"] for r in rows] == [{"0.weight": 200, "2.weight": 200}] * 2 + [
        {"0.weight": 50, "2.weight": 500}]


def test_plan_that_fits_validates():
    sched = build(name="plan", epochs=[0, 2], levels=[4, None], batch_sizes=[512, 4096])
    sched.validate(compression.build_compressor(OmegaConf.create({"name": "powersgd"})), 64, 4)


@pytest.mark.parametrize(("cfg", "field"), [
    ({"epochs": [1, 3]}, "scheduler.epochs"),
    ({"epochs": [0, 3, 3]}, "scheduler.epochs"),
    ({"epochs": [0, -1]}, "scheduler.epochs"),
    ({"epochs": "0"}, "scheduler.epochs"),
    ({"epochs": [0, 3], "levels": [1]}, "scheduler.levels"),
    ({"epochs": [0, 3], "batch_sizes": [16]}, "scheduler.batch_sizes"),
    ({"epochs": [0, 3], "batch_sizes": [16, 0]}, "scheduler.batch_sizes"),
    ({"batch_sizes": [16], "base_batch": 0}, "scheduler.base_batch"),
    ({"batch_sizes": [16], "lr_scaling": "cubic"}, "scheduler.lr_scaling"),
])
def test_plan_bad_values_name_the_field(cfg, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        build(name="plan", **cfg)


@pytest.mark.parametrize(("scheduler", "compressor", "world", "field"), [
    ({"levels": [0]}, {"name": "powersgd"}, 1, "scheduler.levels"),
    ({"levels": [1.5]}, {"name": "topk"}, 1, "scheduler.levels"),
    ({"levels": [2]}, {"name": "none"}, 1, "scheduler.levels"),
    ({"batch_sizes": [510]}, {"name": "none"}, 4, "scheduler.batch_sizes"),
])
def test_plan_validate_names_the_field(scheduler, compressor, world, field):
    sched = build(name="plan", **scheduler)
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        sched.validate(compression.build_compressor(OmegaConf.create(compressor)), 64, world)


# ---- resume ------------------------------------------------------------------------------------
def roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("name", ["accordion", "accordion_batch", "accordion_joint"])
def test_resume_mid_run_decides_alike(group, name):
    cfg = {"name": name, "interval": 2}
    lr = lambda e: 0.1 if e < 5 else 0.01  # noqa: E731
    whole = drive(build(**cfg), hook_for("powersgd"), range(7), lr)
    first = build(**cfg)
    head = drive(first, hook_for("powersgd"), range(3), lr)
    resumed = build(**cfg)
    resumed.load_state_dict(roundtrip(first.state_dict()))
    tail = drive(resumed, hook_for("powersgd"), range(3, 7), lr)
    assert head + tail == whole
    # meaningful only if the decisions after the resume point vary
    assert any(v is False for r in tail for k, v in r.items() if k.startswith("critical/"))


def test_resume_with_another_detector_is_refused():
    first = build(name="accordion_batch", interval=2)
    for e in range(5):
        first.end_epoch(e, NORMS[e], 0.1, 0.1)
    with pytest.raises(ConfigError, match="^resume: "):
        build(name="accordion_batch", interval=2, eta=0.1).load_state_dict(first.state_dict())


# ---- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("cfg", "field"), [
    ({"name": "accordion", "eta": 0}, "scheduler.eta"),
    ({"name": "accordion", "eta": -1.0}, "scheduler.eta"),
    ({"name": "accordion", "interval": 0}, "scheduler.interval"),
    ({"name": "accordion_joint", "interval": 0}, "scheduler.interval"),
    ({"name": "accordion_batch", "batch_low": 4096, "batch_high": 512}, "scheduler.batch_low"),
    ({"name": "accordion_batch", "batch_low": 0}, "scheduler.batch_low"),
    ({"name": "accordion_batch", "lr_scaling": "cubic"}, "scheduler.lr_scaling"),
    ({"name": "accordion_batch", "eta": 0}, "scheduler.eta"),
])
def test_bad_values_rejected_at_build(cfg, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        build(**cfg)


@pytest.mark.parametrize(("cfg", "message"), [
    ({"name": "nope"}, "scheduler.name: unknown scheduler 'nope'; choose one of ['accordion', "
     "'accordion_auto', 'accordion_batch', 'accordion_batch_auto', 'accordion_joint', 'plan', "
     "'static']"),
    ({"name": "accordion", "rank": 2}, "scheduler.rank: unknown key for scheduler 'accordion'; "
     "expected ['low', 'high', 'eta', 'interval']"),
    ({"name": "static", "rank": 2}, "scheduler.rank: unknown key for scheduler 'static'; "
     "expected none"),
    ({"name": "accordion_batch", "batch_high": 0},
     "scheduler.batch_high: expected an integer >= 1, got 0"),
    ({"name": "plan", "epochs": 5},
     "scheduler.epochs: expected a list (one entry per phase) or null, got 5"),
    ({"name": "plan", "epochs": "0"},
     "scheduler.epochs: expected a list (one entry per phase) or null, got '0'"),
    ({"name": "plan", "levels": "1"},
     "scheduler.levels: expected a list (one entry per phase) or null, got '1'"),
    ({"name": "plan", "batch_sizes": 512},
     "scheduler.batch_sizes: expected a list (one entry per phase) or null, got 512"),
])
def test_build_errors_say_what_is_allowed(cfg, message):
    with pytest.raises(ConfigError) as exc:
        build(**cfg)
    assert str(exc.value) == message


def test_register_names_the_class_and_build_makes_it(monkeypatch):
    # register() itself, called here: the shipped schedulers register at import time
    schedulers.available()  # every shipped scheduler registered before the registry is swapped
    monkeypatch.setattr(schedulers.REGISTRY, "entries", dict(schedulers.REGISTRY.entries))

    class Probe(schedulers.Scheduler):
        """A scheduler without parameters."""

    assert schedulers.register("probe")(Probe) is Probe and Probe.name == "probe"
    assert type(build(name="probe")) is Probe
    assert all(build(name=n).name == n for n in schedulers.available())


@pytest.mark.parametrize(("scheduler", "compressor", "world", "field"), [
    ({"name": "accordion", "low": 0, "high": 1}, {"name": "powersgd"}, 1, "scheduler.low"),
    ({"name": "accordion", "low": 2, "high": 1.5}, {"name": "powersgd"}, 1, "scheduler.high"),
    ({"name": "accordion", "low": 1.5, "high": 0.1}, {"name": "topk"}, 1, "scheduler.low"),
    ({"name": "accordion", "low": 0.99, "high": 0}, {"name": "topk"}, 1, "scheduler.high"),
    ({"name": "accordion", "low": 0, "high": 500}, {"name": "adacomp"}, 1, "scheduler.low"),
    ({"name": "accordion_joint", "high": 0}, {"name": "powersgd"}, 1, "scheduler.high"),
    ({"name": "accordion"}, {"name": "none"}, 1, "scheduler.low"),
    ({"name": "accordion_batch"}, {"name": "none"}, 3, "scheduler.batch_low"),
    ({"name": "accordion_batch", "batch_low": 510}, {"name": "none"}, 4, "scheduler.batch_low"),
    ({"name": "accordion_joint", "batch_high": 4095}, {"name": "topk"}, 2,
     "scheduler.batch_high"),
])
def test_bad_values_rejected_by_validate(scheduler, compressor, world, field):
    sched = build(**scheduler)
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        sched.validate(compression.build_compressor(OmegaConf.create(compressor)), 64, world)


@pytest.mark.parametrize("compressor", ["powersgd", "topk", "adacomp"])
@pytest.mark.parametrize("scheduler", ["static", "accordion", "accordion_batch",
                                       "accordion_joint", "plan"])
def test_shipped_configs_validate(compose_cfg, compressor, scheduler):
    cfg = compose_cfg(f"compressor={compressor}", f"scheduler={scheduler}")
    schedulers.build(cfg.scheduler).validate(compression.build_compressor(cfg.compressor),
                                             cfg.trainer.batch_size, 4)


# ---- what-if -----------------------------------------------------------------------------------
CONFIG = """
seed: 0
optimizer: {{lr: 0.1, schedule: {{warmup_epochs: 0, warmup_start_lr: 0.1, milestones: [5],
                                  decay_factors: [0.1]}}}}
compressor: {compressor}
scheduler: {scheduler}
"""


def write_run(run: Path, compressor: str, scheduler: str, rows: list[dict]) -> Path:
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        CONFIG.format(compressor=compressor, scheduler=scheduler))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def whatif(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analysis.whatif", str(run), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def whatif_here(capsys, run: Path, *args: str) -> tuple[int, str, str]:
    """The command's main() in this process (faster than a subprocess)."""
    code = main([str(run), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def table(stdout: str) -> dict[int, list[str]]:
    return {int(line.split()[0]): line.split() for line in stdout.splitlines()
            if line.split() and line.split()[0].isdigit()}


def powersgd_run(tmp_path: Path) -> Path:
    """PowerSGD, interval 2, eta 0.5, LR /10 from epoch 5, 10 steps per epoch.

    Layer A (8 x 16): 32 (8 + 16) r = 768 r bits; layer B (4 x 8): 384 r; bias (8): 256.
    Per step: all rank 2 = 2560, all rank 1 = 1408, A rank 2 + B rank 1 = 2176.
    Ratios at the end of 2: A |10-7|/10 = 0.3, B |4-3.6|/4 = 0.1 (both < 0.5).
    """
    torch.save({"model": {"A": torch.zeros(8, 16), "bias": torch.zeros(8),
                          "B": torch.zeros(4, 8)}}, tmp_path / "checkpoint.pt")
    a = [10, 9, 7, 6, 3, 3]
    b = [4, 4, 3.6, 3.5, 3.4, 3.3]
    crit = [T, T, T, F, F, T]  # epoch 5: the LR decay
    rows = [{"epoch": e, "lr": 0.1 if e < 5 else 0.01, "grad_norm/A": a[e],
             "grad_norm/bias": 1.0, "grad_norm/B": b[e], "critical/A": crit[e],
             "critical/B": crit[e], "level/A": 2 if crit[e] else 1,
             "level/B": 2 if crit[e] else 1, "comm/bits": 10 * (2560 if crit[e] else 1408)}
            for e in range(6)]
    return write_run(tmp_path, "{name: powersgd, rank: 2, seed: 0}",
                     "{name: accordion, low: null, high: null, eta: 0.5, interval: 2}", rows)


def test_whatif_powersgd_replay_by_hand(tmp_path):
    run = powersgd_run(tmp_path)
    proc = whatif(run, "--eta", "0.25")
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    # eta 0.25: A becomes critical in 3, 4 (0.3 >= 0.25), B not; 5 is critical (LR decay).
    assert [float(rows[e][2]) for e in range(6)] == [1, 1, 1, 0, 0, 1]  # logged
    assert [float(rows[e][3]) for e in range(6)] == [1, 1, 1, 0.5, 0.5, 1]  # replayed
    assert [float(rows[e][1]) for e in range(6)] == [0.1] * 5 + [0.01]
    assert [float(rows[e][5]) for e in range(6)] == [25600] * 3 + [21760] * 2 + [25600]
    # totals: logged 4 x 25600 + 2 x 14080 = 130560; replayed 4 x 25600 + 2 x 21760 = 145920
    assert "logged 1.3056e+05, replay (estimated) 1.4592e+05, replay/logged 1.1176" in proc.stdout
    assert "critical fraction (mean over epochs): logged 0.6667, replay 0.8333" in proc.stdout


def test_whatif_with_the_runs_own_detector_reproduces_it(tmp_path, capsys):
    code, out, err = whatif_here(capsys, powersgd_run(tmp_path))
    assert code == 0, err
    assert all(r[2] == r[3] and r[4] == r[5] for r in table(out).values())
    assert "replay/logged 1.0000" in out
    # interval 1: ratios at the ends of 1, 2, 3 all < 0.5 (A 0.1, 0.22, 0.14); 5: LR decay.
    _, out, _ = whatif_here(capsys, tmp_path, "--interval", "1")
    assert [float(table(out)[e][3]) for e in range(6)] == [1, 1, 0, 0, 0, 1]


def test_whatif_batch_by_hand(tmp_path):
    # Whole model: sqrt(3^2 + 4^2) = 5 -> 4 at the end of 2 (0.2), 4 -> 1 at the end of 4 (0.75).
    norms = [(3, 4), (3, 4), (0, 4), (0, 4), (1, 0), (1, 0)]
    crit = [T, T, T, F, F, T]
    rows = [{"epoch": e, "lr": 0.1, "grad_norm/a": norms[e][0], "grad_norm/b": norms[e][1],
             "critical/model": crit[e], "comm/bits": 25600 if crit[e] else 3200}
            for e in range(6)]
    run = write_run(tmp_path, "{name: none}", "{name: accordion_batch, batch_low: 512, "
                    "batch_high: 4096, lr_scaling: linear, eta: 0.5, interval: 2}", rows)
    proc = whatif(run, "--eta", "0.1")
    assert proc.returncode == 0, proc.stderr
    out = table(proc.stdout)
    assert [int(out[e][4]) for e in range(6)] == [512, 512, 512, 4096, 4096, 512]
    assert [int(out[e][5]) for e in range(6)] == [512] * 6
    assert [float(out[e][7]) for e in range(6)] == [25600] * 6  # 8x the steps at 512
    assert "logged 1.0880e+05, replay (estimated) 1.5360e+05, replay/logged 1.4118" in proc.stdout


def test_whatif_adacomp_level_switch_has_no_estimate(tmp_path, capsys):
    rows = [{"epoch": e, "lr": 0.1, "grad_norm/A": [10, 9, 7, 6][e], "critical/A": e < 3,
             "level/A": 50 if e < 3 else 500, "comm/bits": 1000.0} for e in range(4)]
    run = write_run(tmp_path, "{name: adacomp}", "{name: accordion, low: null, high: null, "
                    "eta: 0.5, interval: 2}", rows)
    assert "replay/logged 1.0000" in whatif_here(capsys, run)[1]  # nothing changes: exact
    _, out, _ = whatif_here(capsys, run, "--eta", "0.25")
    assert table(out)[3][5] == "n/a" and "replay n/a" in out


def test_whatif_rejects_a_static_run(tmp_path, capsys):
    run = write_run(tmp_path, "{name: powersgd}", "{name: static}",
                    [{"epoch": 0, "comm/bits": 1.0}])
    code, _, err = whatif_here(capsys, run)
    assert code == 2 and err.startswith("error: scheduler.name: ")
