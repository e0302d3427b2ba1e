"""Train one model under one compressor and scheduler, on one process or many.

    python run.py model=resnet18 dataset=digits trainer.epochs=2            # one process
    torchrun --standalone --nproc-per-node 2 run.py dataset=digits           # DDP on 2 ranks
    python run.py launcher=simulated trainer.workers=128 dataset=digits      # 128 in 1 process
    srun python run.py ...                                                   # Slurm tasks
    python run.py -m sweep=table1 scale=tiny                                 # a paper table
    python run.py -m sweep=table1 launcher=slurm                             # ... on Slurm

Read top to bottom: check the config, start the process group, decide what the run directory
calls for (start, resume, skip: jobs/runs.py), build model and DDP with the compression
hook, then train epoch by epoch. A preemption signal stops every rank at one step boundary
with a mid-epoch checkpoint (jobs/signals.py, training/progress.py). Rank 0 leaves the run
record in the Hydra output directory (see core/record.py) and logs to W&B.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import compression
import data
import models
import schedulers
import training.workers
from core import distributed, numerics, process, provenance, record, rng
from core.errors import ConfigError
from core.lr import lr_at
from jobs import faults, runs, signals
from training import checkpoint, optim

# Not named `config`: with `distributed` beside it, cloudpickle (submitit) would take the
# unpicklable torch.distributed.config along with run.py's functions.
from training import config as checks
from training.progress import EpochProgress, StepReport
from training.wandb_logger import NullLogger, WandbLogger

LOG = logging.getLogger("accordion-bench")
Workers = training.workers.Rank | training.workers.SimulatedWorkers


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: validate, then train (exit status 2 on bad input)."""
    env = distributed.detect()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    signals.install()  # SIGTERM, preemption: how the run ends, to be resumed (jobs/signals.py)
    try:
        numerics.apply(cfg.trainer.numerics)  # before torch's first operation (core/numerics)
        world_size = checks.world_size(cfg, env.world_size)  # ranks, or simulated learners
        checks.validate(cfg, world_size, run_dir)
        bundle = data.build(cfg.dataset)
        checks.prepare(cfg, bundle, world_size, run_dir)
        train(cfg, env, run_dir, bundle)
    except ConfigError as exc:  # before the group starts, or found by the data or a checkpoint
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except faults.RunFailed as exc:  # a lost peer, a full disk: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except signals.Preempted as exc:  # checkpointed mid-epoch: requeued (submitit) or resumed
        print(f"{exc}; {faults.record_line(run_dir)}", file=sys.stderr)
        signals.exit_preempted(exc, env.rank)


def train(cfg: DictConfig, env: distributed.DistEnv, run_dir: Path, bundle: data.DataBundle
          ) -> dict[str, Any]:
    """Run the whole training job on this rank; returns the summary (on every rank; empty if the
    run was already complete)."""
    device = distributed.device_for(env, cfg.trainer.device)
    distributed.init(env, device, float(cfg.trainer.dist_timeout_s))
    try:
        run_dir = _shared_run_dir(run_dir)
        world_size = checks.world_size(cfg, env.world_size)
        action = _from_rank0(_decide(cfg, run_dir, world_size) if env.is_main else None)
        if isinstance(action, ConfigError):  # the directory holds another config's run
            raise action
        if action is runs.Action.SKIP:
            LOG.info("%s: already complete (resume=auto), nothing to do", run_dir)
            return {}
        if env.is_main:
            runs.prepare(cfg, run_dir, action)
        dist.barrier()
        return _train(cfg, env, run_dir, bundle, device, resume=action is runs.Action.RESUME)
    finally:
        distributed.shutdown()


def _decide(cfg: DictConfig, run_dir: Path, world_size: int) -> runs.Action | ConfigError:
    """Rank 0's decision for the run directory, or the error that refuses it (another config's
    run; with resume=auto, a checkpoint that cannot continue this run: resume=true had it checked
    before the group started)."""
    try:
        action = runs.decide(cfg, run_dir, world_size)
        if action is runs.Action.RESUME and cfg.resume is not True:
            checkpoint.check_resumable(run_dir, cfg, world_size)
        return action
    except ConfigError as exc:
        return exc


@dataclass
class Run:
    """Everything the epochs of one start of a run share (built or restored by :func:`_build`).

    ``log`` and ``logger`` are rank 0's (None and a no-op elsewhere); ``saved`` is this
    process's progress through ``start_epoch`` if the checkpoint was written mid-epoch."""

    cfg: DictConfig
    env: distributed.DistEnv
    run_dir: Path
    model: torch.nn.Module
    workers: Workers
    scheduler: schedulers.Scheduler
    optimizer: torch.optim.Optimizer
    log: record.MetricsLog | None
    logger: WandbLogger | NullLogger
    stop: signals.StopCheck
    start_epoch: int
    started: float
    saved: dict[str, Any] | None

    @property
    def metric(self) -> str:
        """The task's test metric (test/accuracy, test/perplexity)."""
        return self.workers.tasks[0].metric


def _train(cfg: DictConfig, env: distributed.DistEnv, run_dir: Path, bundle: data.DataBundle,
           device: torch.device, resume: bool) -> dict[str, Any]:
    """The epochs of this start: build or restore, then train, evaluate and checkpoint each
    epoch; the run record says how it ended, whatever ended it."""
    run = _build(cfg, env, run_dir, bundle, device, resume)
    status, why = "running", None
    signals.defer(cfg.trainer.preempt_signals)
    try:
        for epoch in range(run.start_epoch, cfg.trainer.epochs):
            row, progress = _start_epoch(run, epoch)
            row["train/loss"], samples = _run_epoch(run, progress)
            why = _finish_epoch(run, row, progress, samples)
            if why is not None:  # stop before a non-finite state reaches the checkpoint
                status = "diverged"
                break
        else:
            status = "completed"
    except BaseException as exc:  # noqa: BLE001 (_fail re-raises)
        _fail(run, exc)
    finally:
        signals.undefer(ended=status != "running")  # late warnings: nothing left to save
    return _finish(run, status, why)


# ---- build or restore ------------------------------------------------------------------------
def _build(cfg: DictConfig, env: distributed.DistEnv, run_dir: Path, bundle: data.DataBundle,
           device: torch.device, resume: bool) -> Run:
    """Model (initialised from the seed alone), workers, optimizer, scheduler; the checkpoint's
    state if resuming; rank 0's record of this start."""
    t = cfg.trainer
    rng.seed_everything(cfg.seed, rank=0, deterministic=t.deterministic)
    model = models.build(**cfg.model).to(device)
    rng.seed_everything(cfg.seed, rank=env.rank, deterministic=t.deterministic)
    # This rank (DDP, the comm hook aggregates), or trainer.workers simulated learners.
    workers = training.workers.build(model, cfg, env, bundle, device)
    faults.inject_from_env(model, env.rank)  # tests only: a NaN/inf gradient (see faults.py)
    scheduler = schedulers.build(cfg.scheduler)
    optimizer = optim.build(cfg.optimizer, model.parameters())
    start_epoch, elapsed_s, saved = 0, 0.0, None
    if resume:  # saved: this process's progress through start_epoch, if it stopped mid-epoch
        start_epoch, elapsed_s, saved = checkpoint.load(run_dir / record.CHECKPOINT, model,
                                                        optimizer, workers.hook_state, scheduler)
    log, logger = None, NullLogger()
    if env.is_main:  # the record, and which machine and code run this start (core/provenance)
        log = record.MetricsLog(run_dir, keep_epochs=start_epoch)
        prov = provenance.collect(t.numerics, workers.world_size,
                                  "simulated" if t.workers is not None else env.launcher)
        record.record_start(run_dir, prov, start_epoch, fresh=not resume)
        logger = _make_logger(cfg, run_dir, prov)
    # A preemption signal stops the ranks (or the simulated learners) at one step boundary.
    stop = signals.StopCheck(int(t.preempt_check_every), enabled=bool(t.preempt_signals))
    return Run(cfg, env, run_dir, model, workers, scheduler, optimizer, log, logger, stop,
               start_epoch, time.perf_counter() - elapsed_s, saved)


# ---- one epoch -------------------------------------------------------------------------------
def _start_epoch(run: Run, epoch: int) -> tuple[dict[str, Any], EpochProgress]:
    """The scheduler's levels and batch, the LR; the epoch's progress (continued where a
    mid-epoch checkpoint stopped it)."""
    t, hook_state = run.cfg.trainer, run.workers.hook_state
    row: dict[str, Any] = {"epoch": epoch}
    row.update(run.scheduler.start_epoch(epoch, hook_state))  # per-layer levels of this epoch
    batch_size = run.scheduler.batch_size(epoch, t.batch_size)
    run.workers.set_batch_size(batch_size)
    lr = lr_at(run.cfg.optimizer, epoch) * run.scheduler.lr_scale(epoch)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    row.update({"lr": lr, "batch_size": batch_size})
    hook_state.reset_epoch(epoch)
    device = next(run.model.parameters()).device
    if run.saved is None:
        progress = EpochProgress(epoch, device, len(run.workers.tasks))
    else:  # continue a stopped epoch
        progress = EpochProgress.resume(run.saved, hook_state, run.workers.tasks, device)
        run.saved = None
    return row, progress


def _run_epoch(run: Run, progress: EpochProgress) -> tuple[float, int]:
    """The epoch's optimizer steps from ``progress.step`` on; returns (mean train loss over all
    workers, this process's samples). On a preemption signal every rank stops at the same step
    boundary and the mid-epoch checkpoint is written before :class:`signals.Preempted` goes on.
    """
    t, workers = run.cfg.trainer, run.workers
    amp = bool(t.amp) and progress.loss_sum.device.type == "cuda"
    steps = workers.tasks[0].steps_per_epoch()
    batches = [task.batches(progress.epoch, start=progress.step) for task in workers.tasks]
    report = StepReport(progress, steps, run.env.world_size, t.progress, int(t.progress_every_s),
                        enabled=run.env.is_main)
    try:
        while progress.step < steps:
            run.optimizer.zero_grad(set_to_none=True)
            # each worker reads its batch inside the step (simulated: with its own RNG streams)
            done = workers.step(lambda w: _forward_backward(
                workers.tasks[w], workers.ddp, next(batches[w]), t.micro_batch_size, amp))
            for w, (losses, _) in enumerate(done):
                for loss in losses:
                    progress.loss_sum[w] += loss
            if t.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(run.model.parameters(), float(t.grad_clip))
            run.optimizer.step()
            progress.step_done(sum(n for _, n in done))
            report.update()
            signum = run.stop.due(progress.step)  # collective: the same answer on every rank
            if signum:
                raise signals.Preempted(signum, progress.epoch, progress.step)
    except signals.Preempted:
        _checkpoint(run, progress.epoch, progress)
        raise
    finally:
        report.close()
    return workers.mean_loss(progress.loss_sum, steps), progress.samples


def _forward_backward(task: Any, ddp: torch.nn.Module, batch: Any, micro_batch_size: int | None,
                      amp: bool) -> tuple[list[torch.Tensor], int]:
    """One worker's forward and backward of its batch of a step; returns each micro-batch's
    loss (weighted by its share of the batch, float64) and the batch's examples.

    A batch larger than ``micro_batch_size`` is split and its gradients accumulated under
    ``no_sync``: only the last micro-batch's backward runs the comm hook.
    """
    device = next(ddp.parameters()).device
    micro_batches = task.split(batch, micro_batch_size)
    n = task.size(batch)
    losses = []
    for i, micro in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with ddp.no_sync() if not last else nullcontext():
            with torch.autocast(device.type, torch.bfloat16, enabled=amp):
                loss, m = task.loss(ddp, micro)
                loss = loss * (m / n)
            loss.backward()
        losses.append(loss.detach().double())
    return losses, n


def _finish_epoch(run: Run, row: dict[str, Any], progress: EpochProgress, samples: int
                  ) -> str | None:
    """Evaluate, record the epoch's row (rank 0), let the scheduler see the epoch, checkpoint;
    returns why the run cannot go on (None if it can: then the checkpoint is written)."""
    env, hook_state, o = run.env, run.workers.hook_state, run.cfg.optimizer
    epoch, epoch_s = progress.epoch, progress.seconds()
    _sync_buffers(run.model)
    row.update(run.workers.evaluate())
    row.update(hook_state.epoch_stats())
    row["time/epoch_s"] = epoch_s
    row["samples_per_s"] = samples * env.world_size / epoch_s
    norms, nonfinite = _end_of_epoch(hook_state, env)
    row.update(run.scheduler.end_epoch(epoch, norms, lr_at(o, epoch), lr_at(o, epoch + 1)))
    why = _divergence(epoch, row["train/loss"], nonfinite)  # the same on every rank
    if run.log is not None:  # rank 0 writes the record (and knows the earlier epochs)
        sent_before = sum(r["comm/bits"] for r in run.log.rows)
        row["comm/cumulative_bits"] = sent_before + row["comm/bits"]
        run.log.write(row)
        _report(row, run.metric)
    run.logger.log(row, step=epoch)
    if why is not None:
        LOG.error("diverged: %s; %s is left as it was before epoch %d", why, record.CHECKPOINT,
                  epoch)
        return why
    _checkpoint(run, epoch + 1)
    return None


def _checkpoint(run: Run, epoch: int, progress: EpochProgress | None = None) -> None:
    """Every rank's part of ``checkpoint.pt``: at the end of ``epoch - 1``, or mid-``epoch``
    with ``progress``."""
    checkpoint.save(run.run_dir / record.CHECKPOINT, run.cfg, epoch,
                    time.perf_counter() - run.started, run.model, run.optimizer,
                    run.workers.hook_state, run.scheduler,
                    None if progress is None else progress.state_dict(run.workers.hook_state,
                                                                      run.workers.tasks))


# ---- how the run ends ------------------------------------------------------------------------
def _fail(run: Run, exc: BaseException) -> None:
    """Whatever ended the run early: write the record of how it ended, then re-raise (a bug, a
    signal, a preemption) or raise a one-line :class:`faults.RunFailed`."""
    with signals.shield():
        end = faults.ending(exc, run.env.rank, run.env.world_size,
                            float(run.cfg.trainer.dist_timeout_s))
        note = _record_failure(run.run_dir, run.log, end, run.metric, run.started)
        run.logger.finish(exit_code=1)
    if end.line is None:
        raise exc
    raise faults.RunFailed(f"{end.line}{note}; {faults.record_line(run.run_dir)}") from exc


def _finish(run: Run, status: str, why: str | None) -> dict[str, Any]:
    """``summary.json`` (rank 0) of a run that ended by itself: completed or diverged."""
    rows = run.log.rows if run.log is not None else []
    summary = record.summarize(rows, status, run.metric, time.perf_counter() - run.started)
    if why is not None:
        summary["reason"] = why
    summary["params_in_sync"] = _params_in_sync(run.model)
    if run.log is not None:
        run.log.close()
        record.write_summary(run.run_dir, summary)
        LOG.info("%s: final %s %.4g (best %.4g), run record in %s", status, run.metric,
                 summary["final"], summary["best"], run.run_dir)
    run.logger.finish(exit_code=0 if status == "completed" else 1)
    return summary


# ---- helpers ---------------------------------------------------------------------------------
def _end_of_epoch(hook_state: compression.WorkerState, env: distributed.DistEnv
                  ) -> tuple[dict[str, float], list[tuple[int, int, list[str]]]]:
    """Rank 0's ||Delta_e|| per layer (every rank decides on rank 0's statistic), and (rank,
    step, layers) for every rank whose Delta_e stopped being finite: one collective."""
    mine = (hook_state.grad_norms() if env.is_main else None, hook_state.nonfinite())
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    return gathered[0][0], [(r, *seen) for r, (_, seen) in enumerate(gathered) if seen]


def _divergence(epoch: int, train_loss: float, nonfinite: list[tuple[int, int, list[str]]]
                ) -> str | None:
    """Why the run cannot go on after ``epoch`` (None if it can)."""
    if nonfinite:
        return faults.describe_nonfinite(epoch, nonfinite)
    if not math.isfinite(train_loss):
        return f"train/loss is {train_loss} in epoch {epoch}"
    return None


def _record_failure(run_dir: Path, log: record.MetricsLog | None, end: faults.Ending,
                    metric: str, started: float) -> str:
    """Write ``summary.json`` for a failed run if this rank records it (rank 0, or the lowest
    survivor of a lost rank 0, from ``metrics.jsonl``); a note if it cannot be written."""
    if not end.records:
        return ""
    try:
        rows = log.rows if log is not None else record.read_metrics(run_dir / record.METRICS)
        record.write_summary(run_dir, record.summarize(rows, end.status, metric,
                                                       time.perf_counter() - started))
    except (OSError, ConfigError) as exc:
        return f" ({record.SUMMARY} not written: {exc})"
    return ""


def _report(row: dict[str, Any], metric: str) -> None:
    """One log line per epoch (console and the run's run.log)."""
    LOG.info("epoch %d  lr %.4g  train/loss %.4f  %s %.4g  comm %.3g Gbit (%.1f%% of fp32)  %.1fs",
             row["epoch"], row["lr"], row["train/loss"], metric, row[metric],
             row["comm/bits"] / 1e9, 100 * row["comm/bits"] / max(row["comm/bits_dense"], 1),
             row["time/epoch_s"])


def _shared_run_dir(run_dir: Path) -> Path:
    """Rank 0's output directory, on every rank (ranks may start in different seconds)."""
    return Path(_from_rank0(str(run_dir)))


def _from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _params_in_sync(model: torch.nn.Module) -> bool:
    """True if every rank holds bit-identical parameters (a SHA-256 of their bytes, compared)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest.hexdigest())
    return len(set(digests)) == 1


def _sync_buffers(model: torch.nn.Module) -> None:
    """Give every rank rank 0's BatchNorm statistics before evaluating (as DDP does in forward)."""
    for buf in model.buffers():
        dist.broadcast(buf, src=0)


def _make_logger(cfg: DictConfig, run_dir: Path, prov: dict[str, Any]
                 ) -> WandbLogger | NullLogger:
    if cfg.logger.name == "none":
        return NullLogger()
    # Flattened ("model.name": ..., "provenance.git.commit": ...), so that W&B can group and
    # filter runs by any key.
    config = {**OmegaConf.to_container(cfg, resolve=True), "provenance": prov}
    return WandbLogger(cfg.logger, record.flatten(config), run_dir)


if __name__ == "__main__":
    process.quiet_other_ranks()
    try:
        main()
    except SystemExit as exc:
        process.exit_without_teardown(exc.code)
    process.exit_without_teardown(0)
