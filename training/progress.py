"""How far the current epoch has gone on this rank: everything a mid-epoch checkpoint must hold
to continue the epoch bit for bit (jobs/signals.py says when the ranks stop). For simulated
learners, the process's progress holds every learner's sums and carry.

An epoch's result depends on more than the model, the optimizer and the compressor memories
that an epoch-end checkpoint holds: the steps already taken (the sampler resumes after them:
:meth:`training.tasks.Task.batches`), the train loss summed so far and the examples seen, the
hook's sums (Delta_e per layer, the bits sent in all and by layer type, the elements a
sparsifier chose, the time spent compressing, the first non-finite sum:
:meth:`compression.WorkerState.epoch_state_dict`) and what a task carries from step to step (the
LSTM's hidden state: :meth:`training.tasks.Task.carry`). :class:`EpochProgress` keeps the first
of these and gathers the rest when the checkpoint is written; the RNG states and memories travel
in the checkpoint's per-rank part as at an epoch's end (training/checkpoint.py).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch
from tqdm import tqdm

from compression import WorkerState


class EpochProgress:
    """One process's progress through ``epoch``: steps taken, the train loss summed per local
    worker (one for a DDP rank, W for simulated learners), examples."""

    def __init__(self, epoch: int, device: torch.device, workers: int = 1, step: int = 0,
                 samples: int = 0, loss_sum: torch.Tensor | None = None, seconds: float = 0.0
                 ) -> None:
        self.epoch, self.step, self.samples = epoch, step, samples
        self.loss_sum = torch.zeros(workers, dtype=torch.float64, device=device) \
            if loss_sum is None else loss_sum.to(device)
        self._started = time.perf_counter() - seconds  # an earlier process's seconds count too

    def step_done(self, samples: int) -> None:
        """One optimizer step of ``samples`` examples (this rank's) is done."""
        self.step += 1
        self.samples += samples

    def seconds(self) -> float:
        """Training time of this epoch so far (evaluation excluded)."""
        return time.perf_counter() - self._started

    def state_dict(self, hook_state: WorkerState, tasks: list[Any]) -> dict[str, Any]:
        """This process's part of a mid-epoch checkpoint (``tasks``: its workers' tasks)."""
        return {"epoch": self.epoch, "step": self.step, "samples": self.samples,
                "loss_sum": self.loss_sum.detach().cpu().clone(), "seconds": self.seconds(),
                "hook": hook_state.epoch_state_dict(), "carry": [t.carry() for t in tasks]}

    @classmethod
    def resume(cls, state: dict[str, Any], hook_state: WorkerState,
               tasks: list[Any], device: torch.device) -> EpochProgress:
        """Continue the epoch :meth:`state_dict` saved: the hook's sums and the tasks' carries
        are restored (call after the epoch's start: levels set, ``hook_state.reset_epoch()``)."""
        hook_state.load_epoch_state_dict(state["hook"], device)
        for task, carry in zip(tasks, state["carry"], strict=True):
            task.set_carry(carry)
        return cls(state["epoch"], device, len(state["loss_sum"]), state["step"],
                   state["samples"], state["loss_sum"], state["seconds"])


class StepReport:
    """Where an epoch is, for the person watching rank 0 (``trainer.progress``): a tqdm bar
    when stderr is a terminal (``auto``) or always (``true``); without a terminal (``auto``:
    a batch job, a pipe) one log line every ``every_s`` seconds; ``false``: nothing."""

    def __init__(self, progress: EpochProgress, steps: int, world_size: int, mode: Any,
                 every_s: float, enabled: bool = True) -> None:
        self.progress, self.steps, self.world_size, self.every_s = progress, steps, world_size, \
            every_s
        bar = enabled and (mode is True or (mode == "auto" and sys.stderr.isatty()))
        self.lines = enabled and mode == "auto" and not bar
        self.bar = tqdm(total=steps, initial=progress.step, desc=f"epoch {progress.epoch}",
                        leave=False, disable=not bar)
        self._last = time.perf_counter()

    def update(self) -> None:
        """One step is done."""
        p = self.progress
        if not self.bar.disable:
            if p.step % 10 == 1 or p.step == self.steps:
                self.bar.set_postfix(loss=f"{self._loss():.3f}", samples_s=f"{self._rate():.0f}")
            self.bar.update()
        elif self.lines and time.perf_counter() - self._last >= self.every_s:
            self._last = time.perf_counter()
            logging.getLogger("accordion-bench").info(
                "epoch %d  step %d/%d  train/loss %.4f  %.0f samples/s", p.epoch, p.step,
                self.steps, self._loss(), self._rate())

    def close(self) -> None:
        """The epoch's steps are over (or stopped)."""
        self.bar.close()

    def _loss(self) -> float:
        return self.progress.loss_sum[0].item() / self.progress.step

    def _rate(self) -> float:
        return self.progress.samples * self.world_size / self.progress.seconds()
