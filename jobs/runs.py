"""A run directory's state, and what starting a run in it does: sweeps are idempotent.

Sweeps give every run a directory derived from its config (conf/sweep_runs.yaml), so a relaunch
finds each run's earlier record. Rank 0 inspects it before training and decides:

===============  ==========================================  ===========  ============  ===========
state            the directory holds                          resume=auto  resume=false  resume=true
===============  ==========================================  ===========  ============  ===========
new              no record                                    start        start         error
completed        summary.json: completed or diverged          skip         start over    resume
interrupted      a checkpoint and no summary, or a summary    resume       start over    resume
                 ``preempted``, ``failed: SystemExit`` /
                 ``KeyboardInterrupt``, ``failed: the job
                 ended without a summary`` (killed,
                 preempted, timed out)
failed           summary.json: failed with another error      rerun        start over    resume
===============  ==========================================  ===========  ============  ===========

"resume" continues from ``checkpoint.pt`` (the end of an epoch, or the step a preempted run
stopped at; an interrupted run without one starts over); "rerun" moves the failed record
(metrics, summary, checkpoint) to ``failed/<k>/`` and starts over. Whatever the state, a
directory whose ``config.yaml`` (the resolved config written at the run's first start)
differs from the run's config is refused with one line: keys that do not change results
(``RUNTIME_KEYS``) are not compared, nor ``trainer.epochs`` when ``resume=true`` (extending
a finished run is allowed). How the workers are realized (``REALIZATION_KEYS``: W ranks, or W
simulated learners in one process, which train bit for bit alike) is not compared either; the
world size is, where both the record and the caller know it.

When a sweep's job fails, the sweeper records how (:func:`record_failed_job`): the run's own
summary if the job wrote one, else a summary saying that the job ended without one (killed, out
of memory, its node lost), which a relaunch resumes like any interruption.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core import record
from core.errors import ConfigError

IDENTITY = "config.yaml"
FAILED_DIR = "failed"
# Settings that do not change a run's results: a relaunch may differ in them. (Not
# trainer.num_workers: DataLoader workers draw the augmentations from seeds of their own.)
RUNTIME_KEYS = ("resume", "name", "runs_root", "logger", "trainer.progress",
                "trainer.dist_timeout_s", "trainer.preempt_signals", "trainer.preempt_check_every",
                "dataset.root", "dataset.download", "observe")
LOST_JOB = "failed: the job ended without a summary"  # written by the sweeper (see above)
INTERRUPTIONS = ("preempted", "failed: SystemExit", "failed: KeyboardInterrupt", LOST_JOB)
# How a run's workers are realized, not what they compute: ``trainer.workers: W`` (W simulated
# learners in one process) and W ranks (``trainer.workers: null``) train bit for bit alike
# (tests/e2e/test_simulated.py), so a run may be continued either way; the world size is compared
# instead (:func:`check_identity`, :func:`training.checkpoint.check_resumable`).
REALIZATION_KEYS = ("trainer.workers",)


class State(StrEnum):
    """What a run directory holds."""

    NEW = "new"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class Action(StrEnum):
    """What starting the run does."""

    START = "start"      # train from epoch 0 (a record of the same config is overwritten)
    RESUME = "resume"    # continue from checkpoint.pt
    RERUN = "rerun"      # move the failed record to failed/<k>/, then start
    SKIP = "skip"        # nothing to do: the run is complete


@dataclass(frozen=True)
class Inspection:
    """A run directory's state, read from its files (nothing is written)."""

    state: State
    status: str | None        # summary.json's status, if any
    epochs: int               # rows in metrics.jsonl
    has_checkpoint: bool


def inspect(run_dir: Path) -> Inspection:
    """Read ``run_dir``'s record; a directory without one is NEW."""
    summary_path, checkpoint = run_dir / record.SUMMARY, run_dir / record.CHECKPOINT
    has_checkpoint = checkpoint.is_file()
    epochs = _count_rows(run_dir / record.METRICS)
    status = None
    if summary_path.is_file():
        try:
            status = str(json.loads(summary_path.read_text())["status"])
        except (ValueError, KeyError, TypeError):
            status = "failed: unreadable summary.json"
    if status in ("completed", "diverged"):
        state = State.COMPLETED
    elif status is None:
        started = has_checkpoint or epochs or (run_dir / IDENTITY).is_file()
        state = State.INTERRUPTED if started else State.NEW
    elif status.startswith(INTERRUPTIONS):
        state = State.INTERRUPTED
    else:
        state = State.FAILED
    return Inspection(state, status, epochs, has_checkpoint)


def decide(cfg: Any, run_dir: Path, world_size: int | None = None) -> Action:
    """What starting ``cfg`` on ``world_size`` workers (None: not known) in ``run_dir`` does
    (the table above); ConfigError if the directory belongs to another config or world size.
    (``resume=true`` without a checkpoint is refused earlier, by
    :func:`training.config.validate`.)"""
    check_identity(cfg, run_dir, world_size)
    seen = inspect(run_dir)
    if cfg.resume is True:
        return Action.RESUME
    if cfg.resume is False or seen.state is State.NEW:
        return Action.START
    if seen.state is State.COMPLETED:
        return Action.SKIP
    if seen.state is State.INTERRUPTED:
        return Action.RESUME if seen.has_checkpoint else Action.START
    return Action.RERUN


def prepare(cfg: Any, run_dir: Path, action: Action) -> None:
    """Rank 0, before training: set a failed record aside (RERUN), write ``config.yaml`` and the
    resolved ``.hydra/config.yaml`` (the record's config, interpolations resolved)."""
    if action is Action.RERUN:
        attic = _next_free(run_dir / FAILED_DIR)
        attic.mkdir(parents=True)
        for name in (record.METRICS, record.SUMMARY, record.CHECKPOINT, record.STARTS):
            if (run_dir / name).exists():
                shutil.move(run_dir / name, attic / name)
    resolved = OmegaConf.to_yaml(_resolved(cfg))
    record.atomic_write_bytes(run_dir / IDENTITY, lambda f: f.write(resolved.encode()))
    if (run_dir / ".hydra").is_dir():
        record.atomic_write_bytes(run_dir / ".hydra" / "config.yaml",
                                  lambda f: f.write(resolved.encode()))


def identity(cfg: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved config without the keys that do not change results, flattened (a sweep's
    composed config also holds Hydra's own node, which is not the run's)."""
    flat = record.flatten(_resolved(cfg) if OmegaConf.is_config(cfg) else cfg)
    skip = RUNTIME_KEYS + REALIZATION_KEYS + ignore
    return {k: v for k, v in flat.items() if not any(k == s or k.startswith(s + ".")
                                                     for s in skip)}


def check_identity(cfg: Any, run_dir: Path, world_size: int | None = None) -> None:
    """ConfigError naming the first differing keys if ``run_dir`` holds another config's run,
    or the world sizes if it holds a run of other than ``world_size`` workers."""
    path = run_dir / IDENTITY
    if not path.is_file():
        return
    ignore = ("trainer.epochs",) if cfg.resume is True else ()
    saved = OmegaConf.to_container(OmegaConf.load(path))
    recorded = recorded_world_size(saved, run_dir)
    if None not in (world_size, recorded) and world_size != recorded:
        raise ConfigError(f"hydra.run.dir: {run_dir} holds a run of {recorded} workers, not "
                          f"{world_size}; choose another runs_root or directory, or remove it")
    stored = identity(saved, ignore)
    wanted = identity(cfg, ignore)
    differ = sorted(k for k in stored.keys() | wanted.keys() if stored.get(k) != wanted.get(k))
    if differ:
        shown = ", ".join(f"{k}: {stored.get(k)!r} there, {wanted.get(k)!r} now"
                          for k in differ[:3])
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise ConfigError(f"hydra.run.dir: {run_dir} holds a run of another config ({shown}"
                          f"{more}); choose another runs_root or directory, or remove it")


def summary_stamp(run_dir: Path) -> tuple[int, int] | None:
    """What tells one ``summary.json`` from another (modification time and size); None if the
    directory holds none."""
    try:
        stat = (run_dir / record.SUMMARY).stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def record_failed_job(run_dir: Path, failure: str, stamp: tuple[int, int] | None) -> str:
    """After a sweep's job failed (``failure``: how, in one line, as its launcher saw it): the
    run's status. If the job wrote ``summary.json`` (it differs from ``stamp``, taken before the
    launch), its own; otherwise the job ended before the run could say how (killed, out of
    memory, its node lost), and ``summary.json`` now says so (``LOST_JOB``: an interruption)."""
    now = summary_stamp(run_dir)
    if now is not None and now != stamp:
        return str(inspect(run_dir).status)
    status = f"{LOST_JOB} ({failure})"
    if run_dir.is_dir():
        record.write_summary(run_dir, {"status": status,
                                       "epochs_completed": _count_rows(run_dir / record.METRICS)})
    return status


def recorded_world_size(saved: dict[str, Any], run_dir: Path) -> int | None:
    """The world size of the run recorded in ``run_dir`` (``saved``: its config): its
    simulated learners, else the world size of its last start (None if it never started, or
    started before the record kept it)."""
    workers = (saved.get("trainer") or {}).get("workers")
    if workers is not None:
        return int(workers)
    starts = record.read_starts(run_dir)
    size = starts[-1].get("world_size") if starts else None
    return None if size is None else int(size)


def _resolved(cfg: Any) -> dict[str, Any]:
    """The run's config as plain data, interpolations resolved, without Hydra's own node."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    out = OmegaConf.to_container(task, resolve=True)
    assert isinstance(out, dict)
    return out


def _count_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _next_free(base: Path) -> Path:
    k = 0
    while (base / str(k)).exists():
        k += 1
    return base / str(k)
