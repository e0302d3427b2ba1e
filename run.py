"""Train one model under one compressor and scheduler, on one process or many.

    python run.py model=resnet18 dataset=digits trainer.epochs=2            # one process
    torchrun --standalone --nproc-per-node 2 run.py dataset=digits           # DDP on 2 ranks
    python run.py launcher=simulated trainer.workers=128 dataset=digits      # 128 in 1 process
    srun python run.py ...                                                   # Slurm tasks
    python run.py -m sweep=table1 scale=tiny                                 # a paper table
    python run.py -m sweep=table1 launcher=slurm                             # ... on Slurm

Read top to bottom: check the config, start the process group, decide what the run directory
calls for (start, resume, skip: training/runs.py), build model and DDP with the compression
hook, then train epoch by epoch. A preemption signal stops every rank at one step boundary
with a mid-epoch checkpoint (training/signals.py, training/progress.py). Rank 0 leaves the run
record in the Hydra output directory (see core/record.py) and logs to W&B.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import compression
import data
import models
import schedulers
import training.workers
from core import distributed, numerics, provenance, record, rng
from core.errors import ConfigError
from core.lr import lr_at
from training import checkpoint, faults, optim, runs, signals

# Not named `config`: with `distributed` beside it, cloudpickle (submitit) would take the
# unpicklable torch.distributed.config along with run.py's functions.
from training import config as checks
from training.progress import EpochProgress
from training.wandb_logger import NullLogger, WandbLogger

LOG = logging.getLogger("accordion-bench")
Workers = training.workers.Rank | training.workers.SimulatedWorkers


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: validate, then train (exit status 2 on bad input)."""
    env = distributed.detect()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    signals.install()  # SIGTERM, preemption: how the run ends, to be resumed (training/signals)
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
        action = runs.decide(cfg, run_dir)
        if action is runs.Action.RESUME and cfg.resume is not True:
            checkpoint.check_resumable(run_dir, cfg, world_size)
        return action
    except ConfigError as exc:
        return exc


def _train(cfg: DictConfig, env: distributed.DistEnv, run_dir: Path, bundle: data.DataBundle,
           device: torch.device, resume: bool) -> dict[str, Any]:
    t = cfg.trainer
    rng.seed_everything(cfg.seed, rank=0, deterministic=t.deterministic)
    model = models.build(**cfg.model).to(device)
    rng.seed_everything(cfg.seed, rank=env.rank, deterministic=t.deterministic)
    # This rank (DDP, the comm hook aggregates), or trainer.workers simulated learners.
    workers = training.workers.build(model, cfg, env, bundle, device)
    faults.inject_from_env(model, env.rank)  # tests only: a NaN/inf gradient (see faults.py)
    task, hook_state = workers.tasks[0], workers.hook_state
    scheduler = schedulers.build(cfg.scheduler)
    o = cfg.optimizer
    optimizer = optim.build(o, model.parameters())

    start_epoch, elapsed_s, saved = 0, 0.0, None
    if resume:  # saved: this rank's progress through start_epoch, if it stopped mid-epoch
        start_epoch, elapsed_s, saved = checkpoint.load(run_dir / record.CHECKPOINT, model,
                                                        optimizer, hook_state, scheduler)
    log = record.MetricsLog(run_dir, keep_epochs=start_epoch) if env.is_main else None
    logger: WandbLogger | NullLogger = NullLogger()
    if env.is_main:  # which machine and code run this start (core/provenance.py)
        prov = provenance.collect(t.numerics, workers.world_size,
                                  "simulated" if t.workers is not None else env.launcher)
        record.record_start(run_dir, prov, start_epoch, fresh=not resume)
        logger = _make_logger(cfg, run_dir, prov)

    amp = bool(t.amp) and device.type == "cuda"
    # A preemption signal stops the ranks (or the simulated learners) at one step boundary.
    preemptible = bool(t.preempt_signals)
    stop = signals.StopCheck(int(t.preempt_check_every), enabled=preemptible)
    status, why, started = "running", None, time.perf_counter() - elapsed_s
    signals.defer(t.preempt_signals if preemptible else [])
    try:
        for epoch in range(start_epoch, t.epochs):
            row: dict[str, Any] = {"epoch": epoch}
            row.update(scheduler.start_epoch(epoch, hook_state))  # per-layer levels of this epoch
            batch_size = scheduler.batch_size(epoch, t.batch_size)
            workers.set_batch_size(batch_size)
            lr = lr_at(o, epoch) * scheduler.lr_scale(epoch)
            for group in optimizer.param_groups:
                group["lr"] = lr
            row.update({"lr": lr, "batch_size": batch_size})
            hook_state.reset_epoch(epoch)
            progress = EpochProgress(epoch, device, len(workers.tasks)) if saved is None else \
                EpochProgress.resume(saved, hook_state, workers.tasks, device)  # a stopped epoch
            saved = None

            # ---- train one epoch: the comm hook aggregates (and compresses) in backward -------
            try:
                row["train/loss"], samples = _train_epoch(workers, optimizer, t, env, amp,
                                                          progress, stop)
            except signals.Preempted:  # every rank stopped at this step: checkpoint mid-epoch
                checkpoint.save(run_dir / record.CHECKPOINT, cfg, epoch,
                                time.perf_counter() - started, model, optimizer, hook_state,
                                scheduler, progress.state_dict(hook_state, workers.tasks))
                raise
            epoch_s = progress.seconds()

            # ---- evaluate, record -------------------------------------------------------------
            _sync_buffers(model)
            row.update(workers.evaluate())
            row.update(hook_state.epoch_stats())
            row["time/epoch_s"] = epoch_s
            row["samples_per_s"] = samples * env.world_size / epoch_s
            norms, nonfinite = _end_of_epoch(hook_state, env)
            row.update(scheduler.end_epoch(epoch, norms, lr_at(o, epoch), lr_at(o, epoch + 1)))
            why = _divergence(epoch, row["train/loss"], nonfinite)  # the same on every rank
            if log is not None:  # rank 0 writes the record (and knows the earlier epochs)
                sent_before = sum(r["comm/bits"] for r in log.rows)
                row["comm/cumulative_bits"] = sent_before + row["comm/bits"]
                log.write(row)
                _report(row, task.metric)
            logger.log(row, step=epoch)
            if why is not None:  # stop before a non-finite state reaches the checkpoint
                status = "diverged"
                LOG.error("diverged: %s; %s is left as it was before epoch %d", why,
                          record.CHECKPOINT, epoch)
                break
            checkpoint.save(run_dir / record.CHECKPOINT, cfg, epoch + 1,
                            time.perf_counter() - started, model, optimizer, hook_state, scheduler)
        else:
            status = "completed"
    except BaseException as exc:  # the record says how the run ended, whatever ended it
        with signals.shield():
            end = faults.ending(exc, env.rank, env.world_size, float(t.dist_timeout_s))
            note = _record_failure(run_dir, log, end, task.metric, started)
            logger.finish(exit_code=1)
        if end.line is None:  # a bug, a signal, a preemption: keep Python's own way out
            raise
        raise faults.RunFailed(f"{end.line}{note}; {faults.record_line(run_dir)}") from exc
    finally:
        signals.undefer()

    rows = log.rows if log is not None else []
    summary = record.summarize(rows, status, task.metric, time.perf_counter() - started)
    if why is not None:
        summary["reason"] = why
    summary["params_in_sync"] = _params_in_sync(model)
    if log is not None:
        log.close()
        record.write_summary(run_dir, summary)
        LOG.info("%s: final %s %.4g (best %.4g), run record in %s", status, task.metric,
                 summary["final"], summary["best"], run_dir)
    logger.finish(exit_code=0 if status == "completed" else 1)
    return summary


# ---- helpers ---------------------------------------------------------------------------------
def _train_epoch(workers: Workers, optimizer: torch.optim.Optimizer, t: Any,
                 env: distributed.DistEnv, amp: bool, progress: EpochProgress,
                 stop: signals.StopCheck) -> tuple[float, int]:
    """The epoch's optimizer steps from ``progress.step`` on; returns (mean train loss over all
    workers, this process's samples). Raises :class:`signals.Preempted` at the step boundary
    where the ranks agree to stop on a preemption signal (``progress`` then says how far it got).

    A batch larger than ``trainer.micro_batch_size`` is split and its gradients accumulated
    under ``no_sync``: only the last micro-batch's backward runs the comm hook.
    """
    ddp = workers.ddp
    device = next(ddp.parameters()).device
    epoch, steps = progress.epoch, workers.tasks[0].steps_per_epoch()
    batches = [task.batches(epoch, start=progress.step) for task in workers.tasks]
    samples = 0  # this step's, over the process's workers

    def local_backward(w: int) -> None:  # worker w's forward and backward of this step
        nonlocal samples
        task = workers.tasks[w]
        batch = next(batches[w])  # read inside the worker (its own RNG streams)
        micro_batches = task.split(batch, t.micro_batch_size)
        n = task.size(batch)
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with ddp.no_sync() if not last else nullcontext():
                with torch.autocast(device.type, torch.bfloat16, enabled=amp):
                    loss, m = task.loss(ddp, micro)
                    loss = loss * (m / n)
                loss.backward()
            progress.loss_sum[w] += loss.detach().double()
        samples += n

    bar = tqdm(total=steps, initial=progress.step, desc=f"epoch {epoch}", leave=False,
               disable=not _show_bar(t, env))
    while progress.step < steps:
        optimizer.zero_grad(set_to_none=True)
        samples = 0
        workers.step(local_backward)
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(ddp.module.parameters(), float(t.grad_clip))
        optimizer.step()
        progress.step_done(samples)
        if not bar.disable and (progress.step % 10 == 1 or progress.step == steps):
            rate = progress.samples * env.world_size / progress.seconds()
            bar.set_postfix(loss=f"{progress.loss_sum[0].item() / progress.step:.3f}",
                            samples_s=f"{rate:.0f}")
        bar.update()
        signum = stop.due(progress.step)  # collective: the same answer on every rank
        if signum:
            bar.close()
            raise signals.Preempted(signum, epoch, progress.step)
    bar.close()
    return workers.mean_loss(progress.loss_sum, steps), progress.samples


def _end_of_epoch(hook_state: compression.HookState, env: distributed.DistEnv
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


def _show_bar(t: Any, env: distributed.DistEnv) -> bool:
    if not env.is_main:
        return False
    return sys.stderr.isatty() if t.progress == "auto" else bool(t.progress)


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


def _quiet_other_ranks() -> None:
    """Ranks > 0 write nothing: no Hydra output folder, config copy or log file of their own."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    multirun = any(a in ("-m", "--multirun") for a in sys.argv)
    if rank > 0 and not multirun:
        extra = ["hydra.output_subdir=null", "hydra/job_logging=disabled",
                 "hydra/hydra_logging=disabled"]
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv):
            extra.append("hydra.run.dir=.")
        sys.argv.extend(extra)


def _exit_without_teardown(code: int | str | None) -> None:
    """Exit with ``code`` as ``sys.exit`` would, after flushing logs and streams, but skipping
    the interpreter's teardown: everything is written by then, and gloo's C++ threads, destroyed
    during teardown, abort a rank now and then ("terminate called without an active exception",
    exit -6 after a complete run; pytorch/pytorch#179291 describes the mechanism)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if isinstance(code, str) else code or 0)


if __name__ == "__main__":
    _quiet_other_ranks()
    try:
        main()
    except SystemExit as exc:
        _exit_without_teardown(exc.code)
    _exit_without_teardown(0)
