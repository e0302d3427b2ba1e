"""The optimizer group: SGD and Adam built from config, bad values named, a real Adam run."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from core.errors import ConfigError
from tests.conftest import TINY, assert_ok, run_cli
from training import optim


def test_adam_is_built_with_its_keys(compose_cfg) -> None:
    cfg = compose_cfg("optimizer=adam", "optimizer.betas=[0.8,0.95]", "optimizer.eps=1e-6",
                      "optimizer.weight_decay=0.01")
    optim.check(cfg.optimizer)
    opt = optim.build(cfg.optimizer, torch.nn.Linear(3, 2).parameters())
    assert isinstance(opt, torch.optim.Adam)
    group = opt.param_groups[0]
    assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-6
    assert group["weight_decay"] == 0.01


def test_sgd_is_built_with_its_keys(compose_cfg) -> None:
    cfg = compose_cfg("optimizer.momentum=0.5", "optimizer.nesterov=true")
    optim.check(cfg.optimizer)
    group = optim.build(cfg.optimizer, torch.nn.Linear(3, 2).parameters()).param_groups[0]
    assert isinstance(optim.build(cfg.optimizer, [torch.nn.Parameter(torch.ones(1))]),
                      torch.optim.SGD)
    assert group["momentum"] == 0.5 and group["nesterov"] is True


@pytest.mark.parametrize(("overrides", "field"), [
    ({"name": "rmsprop"}, "optimizer.name"),
    ({"momentum": 1.0}, "optimizer.momentum"),
    ({"momentum": "fast"}, "optimizer.momentum"),
    ({"momentum": 0.0, "nesterov": True}, "optimizer.nesterov"),
    ({"nesterov": "yes"}, "optimizer.nesterov"),
    ({"lr": 0}, "optimizer.lr"),
])
def test_bad_sgd_values_name_the_field(compose_cfg, overrides: dict, field: str) -> None:
    cfg = OmegaConf.merge(compose_cfg().optimizer, overrides)
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        optim.check(cfg)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"betas": [0.9]}, "optimizer.betas"),
    ({"betas": [0.9, 1.0]}, "optimizer.betas"),
    ({"betas": 0.9}, "optimizer.betas"),
    ({"eps": 0}, "optimizer.eps"),
    ({"weight_decay": -1}, "optimizer.weight_decay"),
])
def test_bad_adam_values_name_the_field(compose_cfg, overrides: dict, field: str) -> None:
    cfg = OmegaConf.merge(compose_cfg("optimizer=adam").optimizer, overrides)
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        optim.check(cfg)


def test_adam_trains_with_compression(tmp_path) -> None:
    # A real run: Adam after Top-K with error feedback learns the digits.
    proc = run_cli([*TINY, "dataset.subset=512", "optimizer=adam", "optimizer.lr=0.001",
                    "compressor=topk", "trainer.epochs=4", f"hydra.run.dir={tmp_path}"])
    assert_ok(proc)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["test/accuracy"] > 80 and rows[-1]["lr"] == 0.001  # 10% is chance
