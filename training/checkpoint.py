"""What a checkpoint holds and how every rank saves and restores its part of it.

Rank 0 writes ``checkpoint.pt`` (atomically, :func:`core.record.save_checkpoint`) with the model,
the optimizer, the scheduler's history and, per rank, what differs across ranks: the RNG states
and the compressor memories (error feedback, residues, warm-start Q), gathered to rank 0 only.
A resumed run therefore continues bit for bit (on CPU) as if it had never stopped. A checkpoint
is data, not code: tensors and plain containers only, loaded with ``weights_only=True``
(:func:`core.record.load_checkpoint`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from compression import WorkerState
from core import record, rng
from core.errors import ConfigError
from jobs import runs
from schedulers import Scheduler
from training.simulated import AllWorkers


def save(path: Path, cfg: Any, next_epoch: int, elapsed_s: float, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, hook_state: WorkerState,
         scheduler: Scheduler, progress: dict[str, Any] | None = None) -> None:
    """Gather every rank's own state (RNG, compressor memories); rank 0 writes the checkpoint.

    ``progress``: this rank's part of a mid-epoch checkpoint
    (:meth:`training.progress.EpochProgress.state_dict`); ``next_epoch`` is then the epoch it
    stopped in. Collective: every rank must call it. Simulated learners (``hook_state`` an
    :class:`~training.simulated.AllWorkers`) store each worker's state as a rank's, and the
    process's ``progress`` with worker 0's.
    """
    per_rank = _rank_states(hook_state, progress)
    if dist.get_rank() == 0:
        record.save_checkpoint(path, {
            "format": FORMAT,
            "epoch": next_epoch,
            "step": 0 if progress is None else int(progress["step"]),
            "elapsed_s": elapsed_s,
            "world_size": len(per_rank),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": {"epoch": next_epoch, "seed": int(cfg.seed),
                        "step": 0 if progress is None else int(progress["step"])},
            "per_rank": per_rank,
            "config": OmegaConf.to_container(cfg, resolve=True),
        })
    dist.barrier()


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         hook_state: WorkerState, scheduler: Scheduler
         ) -> tuple[int, float, dict[str, Any] | None]:
    """Restore a checkpoint on this rank; returns (first epoch to run, elapsed seconds, this
    rank's progress through that epoch if the checkpoint was written mid-epoch, else None)."""
    ckpt = record.load_checkpoint(path)  # checked before the group started (check_resumable)
    device = next(model.parameters()).device
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if isinstance(hook_state, AllWorkers):
        hook_state.load_rank_states([
            {"rng": r["rng"], "compressor": _map_tensors(r["compressor"], lambda t: t.to(device))}
            for r in ckpt["per_rank"]])
        return int(ckpt["epoch"]), float(ckpt["elapsed_s"]), ckpt["per_rank"][0].get("progress")
    mine = ckpt["per_rank"][dist.get_rank()]
    hook_state.load_state_dict(_map_tensors(mine["compressor"], lambda t: t.to(device)))
    rng.restore(mine["rng"])
    return int(ckpt["epoch"]), float(ckpt["elapsed_s"]), mine.get("progress")


def _rank_states(hook_state: WorkerState, progress: dict[str, Any] | None) -> list[Any]:
    """Every rank's own state, in rank order (a DDP job gathers it; simulated learners hold
    it all)."""
    if isinstance(hook_state, AllWorkers):  # the process's progress goes with worker 0's part
        per_rank = _to_cpu(hook_state.rank_states())
        for w, part in enumerate(per_rank):  # laid out as ranks' parts
            part["progress"] = _to_cpu(progress) if w == 0 else None
        return per_rank
    mine = {"rng": rng.capture(cuda=True), "compressor": _to_cpu(hook_state.state_dict()),
            "progress": _to_cpu(progress)}
    per_rank: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, per_rank, dst=0)  # only rank 0 writes them
    return per_rank or []


# Config keys that do not change a run's results: a resumed run may differ from its checkpoint
# in these (a key names itself and everything under it), and may run more epochs. How the
# workers are realized is one of them (the world size is compared on its own).
RESULT_NEUTRAL = (*runs.RUNTIME_KEYS, *runs.REALIZATION_KEYS, "trainer.epochs")
KEYS = ("epoch", "elapsed_s", "world_size", "model", "optimizer", "scheduler", "per_rank", "config")
# 1: epoch-end checkpoints only (no "format" key); 2: "step" > 0 marks a mid-epoch checkpoint,
# whose per-rank parts hold each rank's "progress" (training/progress.py).
FORMAT = 2


def check_resumable(run_dir: Path, cfg: Any, world_size: int) -> int:
    """Before any process group starts: ConfigError (one line) unless ``run_dir``'s checkpoint
    can continue ``cfg`` on ``world_size`` ranks; returns the epoch it continues from.

    Checked: the file is a whole checkpoint (its zip records pass their CRC checks: a truncated,
    overwritten or bit-flipped file is refused), it was written by as many ranks, by a config
    that differs from ``cfg`` in no key that changes results (:func:`config_difference`), and
    ``metrics.jsonl`` holds every epoch it covers.
    """
    path = run_dir / record.CHECKPOINT
    if not path.is_file():
        raise ConfigError(f"resume: no {record.CHECKPOINT} in {run_dir}; pass the run's "
                          f"directory as hydra.run.dir=<dir> to resume it")
    ckpt = _read_whole(path)
    if int(ckpt.get("format", 1)) > FORMAT:
        raise ConfigError(f"resume: {path} has checkpoint format {ckpt['format']}, newer than "
                          f"this version of the suite reads ({FORMAT}); resume it with the "
                          f"version that wrote it")
    if ckpt["world_size"] != world_size:
        raise ConfigError(f"resume: {path} was written by {ckpt['world_size']} ranks; resume it "
                          f"with the same number, not {world_size}")
    _check_realization(path, ckpt, cfg)
    differ = config_difference(ckpt["config"], OmegaConf.to_container(cfg, resolve=True))
    if differ is not None:
        raise ConfigError(f"resume: {differ}: {path} is another config's run; resume with its "
                          f"values, or start this config in another directory")
    epoch = int(ckpt["epoch"])
    rows = len(record.read_metrics(run_dir / record.METRICS))
    if rows < epoch:
        raise ConfigError(f"resume: {run_dir / record.METRICS} holds {rows} complete epochs but "
                          f"{path} continues from epoch {epoch}; the record has lost epochs")
    return epoch


def _check_realization(path: Path, ckpt: dict[str, Any], cfg: Any) -> None:
    """ConfigError if a checkpoint written mid-epoch by ranks is to be continued by simulated
    learners, or the other way round: their progress through the epoch is kept per process
    (:mod:`training.progress`). Epoch-end checkpoints continue either way."""
    saved = (ckpt["config"].get("trainer") or {}).get("workers")
    wanted = cfg.trainer.get("workers")
    if int(ckpt.get("step", 0)) == 0 or (saved is None) == (wanted is None):
        return
    how = (f"{saved} simulated learners (launcher=simulated trainer.workers={saved})"
           if saved is not None else f"{ckpt['world_size']} ranks (trainer.workers=null)")
    raise ConfigError(f"resume: {path} stopped mid-epoch and was written by {how}; continue it "
                      f"the same way")


def config_difference(saved: dict[str, Any], current: dict[str, Any],
                      neutral: tuple[str, ...] = RESULT_NEUTRAL) -> str | None:
    """The first key (in ``current``'s order, then ``saved``'s) whose value differs between two
    resolved configs, other than the ``neutral`` ones, as "key: <saved> in the checkpoint,
    <current> now"; None if they agree."""
    a, b = record.flatten(saved, keep_empty=True), record.flatten(current, keep_empty=True)
    for key in dict.fromkeys([*b, *a]):
        if any(key == n or key.startswith(n + ".") for n in neutral):
            continue
        if key not in a or key not in b or a[key] != b[key]:
            return (f"{key}: {a.get(key, '(absent)')!r} in the checkpoint, "
                    f"{b.get(key, '(absent)')!r} now")
    return None


def _read_whole(path: Path) -> dict[str, Any]:
    """The checkpoint's contents (tensors memory-mapped, not read), after checking every record
    of the file against its CRC; ConfigError naming the file if it is not a whole checkpoint."""
    hint = "restore it from a copy, or start the run over with resume=false"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            raise ConfigError(f"resume: {path} is corrupt (its record {bad} fails its CRC "
                              f"check); {hint}")
        ckpt = record.load_checkpoint(path, mmap=True)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 (zipfile, pickle and torch raise many types)
        raise ConfigError(f"resume: {path} is not a readable checkpoint (truncated or "
                          f"corrupt: {' '.join(str(exc).split())[:120]}); {hint}") from exc
    missing = [k for k in KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ConfigError(f"resume: {path} is not a checkpoint of this suite (no "
                          f"{', '.join(missing)}); {hint}")
    return ckpt


def _to_cpu(obj: Any) -> Any:
    return _map_tensors(obj, lambda t: t.detach().cpu())


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj
