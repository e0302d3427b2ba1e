"""The W&B wrapper: a real offline run; failures become one warning, never an exception."""

from __future__ import annotations

import warnings

import pytest
from omegaconf import OmegaConf

from training.wandb_logger import WandbLogger

CFG = {"mode": "offline", "project": "accordion-bench-test", "group": "g", "job_type": "train",
       "tags": ["t"], "entity": None, "run_name": None}


@pytest.mark.slow
def test_log_failure_mid_run_warns_once_and_stops_logging(tmp_path):
    logger = WandbLogger(OmegaConf.create(CFG), {"seed": 0}, tmp_path)
    assert logger.run is not None
    logger.log({"train/loss": 1.0}, step=0)
    logger.run.finish()  # the run ends under the logger: every later log call fails in W&B
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log({"train/loss": 0.5}, step=1)
        logger.log({"train/loss": 0.25}, step=2)
        logger.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and messages[0].startswith("W&B failed to log (UsageError")
    assert logger.run is None


def test_start_failure_warns_once(tmp_path):
    with pytest.warns(RuntimeWarning, match="W&B failed to start") as caught:
        logger = WandbLogger(OmegaConf.create({**CFG, "tags": ["x" * 100]}), {}, tmp_path)
        logger.log({"a": 1.0}, step=0)
        logger.finish()
    assert len(caught) == 1 and logger.run is None
