"""The resume matrix: every registered compressor x {static, accordion, accordion_auto} (and
no compression x accordion_batch_auto) x {epoch-end, mid-epoch} checkpoint. A run stopped and
resumed from its checkpoint ends bit for bit where the run that never stopped ends: every
metric but the timings, every weight, every compressor memory.

W = 2 simulated learners in this process (bit-identical to 2 gloo ranks:
tests/e2e/test_simulated.py) train a ResNet-18 with several DDP buckets (conv kernels, a linear
layer, BatchNorm vectors) for 2 epochs, Accordion checking every epoch so that levels switch at the
second. The mid-epoch stop is a real preemption signal, sent to this process during a step's forward
(a global forward hook), which the training loop turns into a checkpoint at the step boundary. A
compressor joins the matrix by registering (compression.available()). With real gloo ranks:
tests/e2e/test_resume.py. """

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
import data
import run
from core import distributed
from jobs import signals
from tests.conftest import TIMING, read_rows, with_value
from training import config as checks

EPOCHS = 2
STEPS = 64 // 16  # per epoch: the training set over the global batch
COMMON = ["launcher=simulated", "trainer.workers=2", "model=resnet18", "model.width=4",
          "dataset=synthetic", "dataset.train_size=64", "dataset.test_size=16",
          "trainer.batch_size=16", "trainer.bucket_cap_mb=0.005",
          "logger=none", "trainer.progress=false", "trainer.device=cpu", "optimizer.lr=0.05"]
SCHEDULERS = {"static": [], "accordion": ["scheduler=accordion", "scheduler.interval=1",
                                          "scheduler.eta=0.01"],
              # measured endpoints: epoch 1 is measured on its first 3 steps, so the mid-epoch
              # checkpoint (step 2) holds the probe's partial sums
              "accordion_auto": ["scheduler=accordion_auto", "scheduler.interval=1",
                                 "scheduler.eta=0.01", "scheduler.probe_steps=3"],
              "accordion_batch_auto": ["scheduler=accordion_batch_auto",
                                       "scheduler.batch_low=16", "scheduler.batches=[16,32]",
                                       "scheduler.interval=1", "scheduler.probe_steps=3"]}
CASES = [(name, sched) for name in compression.available() for sched in SCHEDULERS
         if sched == "static" or (sched == "accordion_batch_auto" and name == "none")
         or (sched in ("accordion", "accordion_auto") and name in compression.with_levels())]


def train_here(cfg: Any, run_dir: Path) -> dict[str, Any]:
    """What run.py's Hydra entry point does, in this process (Hydra makes the directory)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = distributed.detect()
    world_size = checks.world_size(cfg, env.world_size)
    checks.validate(cfg, world_size, run_dir)
    bundle = data.build(cfg.dataset)
    checks.prepare(cfg, bundle, world_size, run_dir)
    return run.train(cfg, env, run_dir, bundle)


class StopAt:
    """Send this process SIGUSR1 during the ``forward``-th forward through DDP (counted from
    the hook's registration; each simulated learner's forward counts)."""

    def __init__(self, forward: int) -> None:
        self.left = forward
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if isinstance(module, DDP):
            self.left -= 1
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGUSR1)


def _weights_and_memories(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    out = {f"model/{k}": v for k, v in ckpt["model"].items()}
    for w, part in enumerate(ckpt["per_rank"]):
        for name, layer in part["compressor"]["layers"].items():
            out.update({f"{w}/{name}/{k}": v for k, v in layer["memory"].items()})
    return out


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as a run's processes have (and no contention with the others)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("compressor, scheduler", CASES)
def test_a_resumed_run_ends_where_the_run_that_never_stopped_ends(compose_cfg, tmp_path,
                                                                   compressor, scheduler):
    cfg = compose_cfg(*COMMON, f"compressor={compressor}", *SCHEDULERS[scheduler],
                      f"trainer.epochs={EPOCHS}")
    straight = tmp_path / "straight"
    train_here(copy.deepcopy(cfg), straight)
    expected_rows = [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(straight)]
    expected = _weights_and_memories(straight)

    for kind in ("epoch-end", "mid-epoch"):
        stopped = tmp_path / kind
        if kind == "epoch-end":
            train_here(with_value(cfg, "trainer.epochs", 1), stopped)
        else:  # a signal during epoch 1's second step: the checkpoint says epoch 1, step 2
            stop = StopAt(forward=1 + 2 * (STEPS + 2))  # the settling probe, then 2 a step
            try:
                with pytest.raises(signals.Preempted):
                    train_here(copy.deepcopy(cfg), stopped)
            finally:
                stop.handle.remove()
            ckpt = torch.load(stopped / "checkpoint.pt", weights_only=True)
            assert (ckpt["epoch"], ckpt["step"]) == (1, 2)
        train_here(with_value(cfg, "resume", True), stopped)
        rows = [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(stopped)]
        assert rows == expected_rows, kind
        got = _weights_and_memories(stopped)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(got[key], value), (kind, key)
        summary = json.loads((stopped / "summary.json").read_text())
        assert summary["status"] == "completed" and len(summary["starts"]) == 2
