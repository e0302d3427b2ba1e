"""What-if: replay a finished Accordion run's logged norms with another eta / interval.

    python -m analysis.whatif <run_dir> --eta 0.3 --interval 5

Reads ``<run_dir>/metrics.jsonl`` (``grad_norm/*``, ``level/*``, ``critical/*``, ``comm/bits``
per epoch), ``<run_dir>/.hydra/config.yaml`` (scheduler, compressor, LR schedule) and, for the
level-switching schedulers, ``<run_dir>/checkpoint.pt`` (the layers' shapes). It runs
:func:`schedulers.accordion.replay`, the very rule the schedulers decide with, over the logged
norms and prints per epoch: the critical fraction logged and replayed (over the compressed
layers; for ``accordion_batch`` the whole model's 0/1), the global batch (batch schedulers), and
the logged ``comm/bits`` next to an estimate under the replayed decisions. Without ``--eta`` /
``--interval`` the run's own values are used, and the replay reproduces the logged run.

The estimate, per epoch: logged bits x P(replayed levels) / P(logged levels) x logged batch /
replayed batch, where P is the bits one worker sends per step: 32 per element of the
uncompressed tensors (ndim <= 1) plus, per compressed layer, the compressor's own accounting for
the layer's shape at that level (:meth:`compression.Compressor.step_bits`). Assumptions:

- a layer's bits per step depend only on its shape and level: true where the compressor's
  ``step_bits`` says so (PowerSGD, Top-K, EF-signSGD), not for AdaComp (the number of elements
  sent depends on the gradients), so switching AdaComp's bin size gets no estimate (n/a);
- the steps per epoch scale as 1 / global batch (exact up to the last partial batch), with one
  gradient exchange per optimizer step.

The LRs come from the config's schedule (``core.lr.lr_at``), as the schedulers saw them: the
logged ``lr`` may include batch scaling.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import compression
from compression.stats import FP32_BITS
from core.errors import ConfigError
from core.lr import lr_at
from core.record import CHECKPOINT, METRICS, load_checkpoint, read_metrics
from schedulers.accordion import replay, resolve_levels
from schedulers.accordion_batch import MODEL, model_norm

LEVEL_SCHEDULERS = ("accordion", "accordion_joint")
BATCH_SCHEDULERS = ("accordion_batch", "accordion_joint")


@dataclass
class Epoch:
    """One epoch, logged vs replayed (``None``: not applicable or no estimate)."""

    epoch: int
    lr: float
    critical_logged: float
    critical_replay: float
    batch_logged: int | None
    batch_replay: int | None
    bits_logged: float
    bits_replay: float | None


def load_run(run_dir: Path, accepted: Sequence[str] = LEVEL_SCHEDULERS + BATCH_SCHEDULERS
             ) -> tuple[DictConfig, list[dict[str, Any]]]:
    """The run's config and its epoch rows (0, 1, ... in order); a ConfigError unless its
    scheduler is one of ``accepted``."""
    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"run_dir: no .hydra/config.yaml in {run_dir}; pass a run directory")
    rows = read_metrics(run_dir / METRICS)
    if not rows or [r.get("epoch") for r in rows] != list(range(len(rows))):
        raise ConfigError(f"run_dir: {run_dir / METRICS} must hold one row per epoch 0, 1, ...")
    cfg = OmegaConf.load(config)
    if cfg.scheduler.name not in accepted:
        raise ConfigError(f"scheduler.name: the run used {cfg.scheduler.name!r}; what-if replays "
                          f"runs of {sorted(set(accepted))}")
    return cfg, rows


def _value(row: dict[str, Any], key: str) -> Any:
    if key not in row:
        raise ConfigError(f"{METRICS}: epoch {row['epoch']} has no {key!r}")
    return row[key]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class StepBits:
    """Bits one worker sends per step, given every compressed layer's level."""

    def __init__(self, compressor: compression.Compressor, run_dir: Path,
                 rows: list[dict[str, Any]], layers: list[str]) -> None:
        path = run_dir / CHECKPOINT
        if not path.is_file():
            raise ConfigError(f"run_dir: no {CHECKPOINT} in {run_dir}; the bits estimate needs "
                              f"the layers' shapes")
        state = load_checkpoint(path)["model"]
        trainable = [k.removeprefix("grad_norm/") for k in rows[0] if k.startswith("grad_norm/")]
        missing = [n for n in trainable if n not in state]
        if missing:
            raise ConfigError(f"run_dir: {CHECKPOINT} has no weights for {missing[:3]}")
        self.dense = FP32_BITS * sum(state[n].numel() for n in trainable if n not in layers)
        self.shapes = {n: state[n].shape for n in layers}
        self.compressor = compressor

    def __call__(self, levels: dict[str, Any]) -> int:
        """P(levels): the uncompressed tensors plus each layer at its level (the compressor's
        own :meth:`~compression.Compressor.step_bits`)."""
        return self.dense + sum(self.compressor.step_bits(self.shapes[n], lv)
                                for n, lv in levels.items())


def whatif(run_dir: Path, cfg: DictConfig, rows: list[dict[str, Any]], eta: float,
           interval: int) -> list[Epoch]:
    """Every epoch of the run (``load_run``'s ``cfg``, ``rows``), logged vs replayed."""
    lrs = [lr_at(cfg.optimizer, e) for e in range(len(rows))]
    out = [Epoch(r["epoch"], lrs[r["epoch"]], 0.0, 0.0, None, None, float(_value(r, "comm/bits")),
                 float(r["comm/bits"])) for r in rows]
    if cfg.scheduler.name in LEVEL_SCHEDULERS:
        _replay_levels(cfg, run_dir, rows, lrs, eta, interval, out)
    if cfg.scheduler.name in BATCH_SCHEDULERS:
        _replay_batch(cfg, rows, lrs, eta, interval, out)
    return out


def _replay_levels(cfg: DictConfig, run_dir: Path, rows: list[dict[str, Any]], lrs: list[float],
                   eta: float, interval: int, out: list[Epoch]) -> None:
    """Per-layer decisions, critical fractions, and the level factor of the bits estimate."""
    layers = [k.removeprefix("level/") for k in rows[0] if k.startswith("level/")]
    norms = [{n: _value(r, f"grad_norm/{n}") for n in layers} for r in rows]
    decisions = replay(norms[:-1], lrs, eta, interval, layers)
    compressor = compression.build_compressor(cfg.compressor)
    low, high = resolve_levels(compressor, cfg.scheduler.low, cfg.scheduler.high)
    exact = compressor.step_bits(torch.Size([1, 1]), low) is not None  # bits follow the level
    step_bits = StepBits(compressor, run_dir, rows, layers) if exact else None
    for row, decided, epoch in zip(rows, decisions, out, strict=True):
        epoch.critical_logged = _mean([bool(_value(row, f"critical/{n}")) for n in layers])
        epoch.critical_replay = _mean(list(decided.values()))
        logged = {n: _value(row, f"level/{n}") for n in layers}
        replayed = {n: low if c else high for n, c in decided.items()}
        if step_bits is not None:
            epoch.bits_replay *= step_bits(replayed) / step_bits(logged)
        elif replayed != logged:
            epoch.bits_replay = None


def _replay_batch(cfg: DictConfig, rows: list[dict[str, Any]], lrs: list[float], eta: float,
                  interval: int, out: list[Epoch]) -> None:
    """Whole-model decisions, batches, and the step-count factor of the bits estimate."""
    s = cfg.scheduler
    norms = [{MODEL: model_norm({k.removeprefix("grad_norm/"): v for k, v in r.items()
                                 if k.startswith("grad_norm/")})} for r in rows]
    decisions = replay(norms[:-1], lrs, eta, interval, [MODEL])
    only_batch = s.name not in LEVEL_SCHEDULERS
    for row, decided, epoch in zip(rows, decisions, out, strict=True):
        logged = bool(_value(row, f"critical/{MODEL}"))
        epoch.batch_logged = s.batch_low if logged else s.batch_high
        epoch.batch_replay = s.batch_low if decided[MODEL] else s.batch_high
        if only_batch:
            epoch.critical_logged, epoch.critical_replay = float(logged), float(decided[MODEL])
        if epoch.bits_replay is not None:
            epoch.bits_replay *= epoch.batch_logged / epoch.batch_replay


def sweep(run_dirs: Iterable[Path], etas: Sequence[float] | None = None,
          intervals: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The what-if over many runs: for every Accordion run (the others are skipped) and every
    (eta, interval), the totals of :func:`whatif`: mean critical fraction logged and replayed,
    ``comm/bits`` logged and replayed (None: no estimate) and their ratio.

    Defaults: eta 0.3, 0.5, 0.7 and the run's own; interval the run's own, half and double it.
    A run that cannot be replayed (no checkpoint for the layers' shapes, a gap in its epochs)
    gets one row with a ``note`` instead.
    """
    out = []
    for run_dir in run_dirs:
        try:
            cfg, rows = load_run(run_dir)
        except ConfigError as exc:
            if "scheduler.name" not in str(exc):
                out.append({"run_dir": str(run_dir), "note": str(exc)})
            continue
        s = cfg.scheduler
        grid_eta = sorted({*(etas or (0.3, 0.5, 0.7)), *([] if etas else [s.eta])})
        grid_interval = sorted(set(intervals or (max(1, s.interval // 2), s.interval,
                                                 2 * s.interval)))
        for eta in grid_eta:
            for interval in grid_interval:
                row: dict[str, Any] = {"run_dir": str(run_dir), "eta": eta, "interval": interval,
                                       "own": eta == s.eta and interval == s.interval}
                try:
                    epochs = whatif(run_dir, cfg, rows, eta, interval)
                except ConfigError as exc:
                    out.append({**row, "note": str(exc)})
                    continue
                logged = sum(e.bits_logged for e in epochs)
                replayed = [e.bits_replay for e in epochs]
                replay = None if None in replayed else sum(replayed)
                out.append({**row,
                            "critical_logged": _mean([e.critical_logged for e in epochs]),
                            "critical_replay": _mean([e.critical_replay for e in epochs]),
                            "bits_logged": logged, "bits_replay": replay,
                            "replay_over_logged": None if replay is None else replay / logged,
                            "note": None if replay is not None else
                            "no estimate: AdaComp's bits depend on the gradients"})
    return out


def _bits(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4e}"


def report(run_dir: Path, eta: float | None = None, interval: int | None = None) -> str:
    """The what-if table and totals, as printed by the command (None: the run's own value)."""
    cfg, rows = load_run(run_dir)
    s = cfg.scheduler
    eta = s.eta if eta is None else eta
    interval = s.interval if interval is None else interval
    epochs = whatif(run_dir, cfg, rows, eta, interval)
    batch = s.name in BATCH_SCHEDULERS
    lines = [f"what-if {run_dir}: scheduler={s.name} compressor={cfg.compressor.name}",
             f"detector: logged eta={s.eta} interval={s.interval} -> replay eta={eta} "
             f"interval={interval}",
             f"{'epoch':>5} {'lr':>10} {'crit_log':>8} {'crit_rep':>8}"
             + (f" {'batch_log':>9} {'batch_rep':>9}" if batch else "")
             + f" {'bits_log':>11} {'bits_rep':>11}"]
    for e in epochs:
        lines.append(f"{e.epoch:>5} {e.lr:>10.4g} {e.critical_logged:>8.2f} "
                     f"{e.critical_replay:>8.2f}"
                     + (f" {e.batch_logged:>9} {e.batch_replay:>9}" if batch else "")
                     + f" {_bits(e.bits_logged):>11} {_bits(e.bits_replay):>11}")
    logged = sum(e.bits_logged for e in epochs)
    replayed = [e.bits_replay for e in epochs]
    if None in replayed:
        lines.append(f"total bits: logged {logged:.4e}, replay n/a (AdaComp's bits depend on the "
                     f"gradients, not only on the level)")
    else:
        total = sum(replayed)
        lines.append(f"total bits: logged {logged:.4e}, replay (estimated) {total:.4e}, "
                     f"replay/logged {total / logged:.4f}")
    lines.append(f"critical fraction (mean over epochs): logged "
                 f"{_mean([e.critical_logged for e in epochs]):.4f}, replay "
                 f"{_mean([e.critical_replay for e in epochs]):.4f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the report; exit status 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.whatif",
                                     description="Replay an Accordion run's logged gradient norms "
                                                 "with another eta / interval.")
    parser.add_argument("run_dir", type=Path, help="the run's Hydra output directory")
    parser.add_argument("--eta", type=float, help="threshold (default: the run's)")
    parser.add_argument("--interval", type=int, help="epochs between checks (default: the run's)")
    args = parser.parse_args(argv)
    try:
        print(report(args.run_dir, args.eta, args.interval))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
