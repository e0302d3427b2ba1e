"""``scheduler=accordion``: Accordion's per-layer switch between two compression levels.

Agarwal et al., "Accordion: Adaptive Gradient Communication via Critical Learning Regime
Identification" (MLSys 2021), Algorithm 1. Each compressed layer runs at level ``low`` (little
compression: PowerSGD rank 2 or 4, Top-K ratio 0.99, AdaComp bin 50) in a critical regime and at
``high`` (rank 1, ratio 0.10 / 0.25 / 0.02, a larger bin) elsewhere. Over AdaComp this is our own
combination: neither paper tried it.

Detection (:func:`replay`, the one place the rule lives; epochs are 0-based, Delta_e is a layer's
local gradient summed over epoch e, logged as ``grad_norm/<layer>``):

- epochs 0 .. interval (inclusive) are critical for every layer;
- at the end of every check epoch e (e >= interval, e % interval == 0), a layer's epochs
  e+1 .. e+interval are critical iff | ||Delta_{e-interval}|| - ||Delta_e|| | /
  ||Delta_{e-interval}|| >= eta (a previous norm of 0 counts as critical, and so does a NaN
  ratio, from a norm that is inf or NaN: the authors' ``ratio < eta`` test is false for NaN);
- if the LR of epoch e+1 is below that of epoch e, every layer is critical from epoch e+1 through
  the next multiple of interval (inclusive); the norm rule decides again after that.

All ranks decide alike: run.py broadcasts rank 0's norms, so every rank calls ``end_epoch`` with
identical inputs and makes identical decisions (the authors' code, too, uses rank 0's local
statistic and broadcasts its choice). The LRs are the schedule's (before any batch scaling).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import compression
from compression.base import Compressor
from compression.worker import WorkerState
from core.errors import ConfigError, check_int, check_number
from schedulers import register
from schedulers.base import Scheduler

log = logging.getLogger(__name__)


def check_detector(eta: Any, interval: Any) -> None:
    """ConfigError unless eta is a (finite) number > 0 and interval an integer >= 1."""
    check_number(eta, "scheduler.eta", 0, low_open=True)
    check_int(interval, "scheduler.interval", 1)


def is_check_epoch(epoch: int, interval: int) -> bool:
    """Algorithm 1: norms are compared at the end of epochs interval, 2 interval, ..."""
    return epoch >= interval and epoch % interval == 0


def relative_change(prev: float, curr: float) -> float:
    """Algorithm 1's statistic | ||Delta_prev|| - ||Delta_curr|| | / ||Delta_prev||.

    A previous norm of 0 gives inf: it counts as critical, as in the authors' code.
    """
    return abs(prev - curr) / prev if prev != 0 else math.inf


def is_critical(ratio: float, eta: float) -> bool:
    """Algorithm 1's test, ratio >= eta, written as the authors' code decides: not ratio < eta,
    so that a NaN ratio (a norm that overflowed or is NaN) is critical (logged by the caller)."""
    return not ratio < eta


def replay(norms: Sequence[dict[str, float]], lrs: Sequence[float], eta: float = 0.5,
           interval: int = 10, layers: Iterable[str] | None = None) -> list[dict[str, bool]]:
    """Per epoch and layer, whether the epoch runs in the critical regime (Algorithm 1).

    ``norms[e]`` maps each layer to ||Delta_e||; ``lrs[e]`` is epoch e's (schedule) LR. The
    decision for epoch e + 1 needs the norms up to e and the LRs up to e + 1, so ``lrs`` must have
    exactly one entry more than ``norms``, and the result has ``len(lrs)`` items: item e is epoch
    e's decision, for every name in ``layers`` (default: the layers of ``norms[0]``). Epoch 0 is
    critical whatever ``lrs[0]`` is.
    """
    check_detector(eta, interval)
    if len(lrs) != len(norms) + 1:
        raise ValueError(f"replay: lrs needs one entry more than norms, got {len(lrs)} LRs for "
                         f"{len(norms)} epochs of norms")
    names = list(layers) if layers is not None else list(norms[0]) if norms else []
    critical_until = dict.fromkeys(names, interval)  # epochs 0 .. interval are critical
    decisions = []
    for epoch, lr in enumerate(lrs):
        decisions.append({n: epoch <= critical_until[n] for n in names})
        if epoch == len(norms):
            break
        if is_check_epoch(epoch, interval):  # Algorithm 1: compare Delta_{e-interval}, Delta_e
            before, now = norms[epoch - interval], norms[epoch]
            for n in names:
                ratio = relative_change(_norm(before, n, epoch - interval), _norm(now, n, epoch))
                if is_critical(ratio, eta):
                    critical_until[n] = epoch + interval
        if lrs[epoch + 1] < lr:  # Algorithm 1: gamma_next < gamma_curr
            last = math.ceil((epoch + 1) / interval) * interval  # next multiple, inclusive
            for n in names:
                critical_until[n] = max(critical_until[n], last)
    return decisions


def _norm(norms: dict[str, float], layer: str, epoch: int) -> float:
    if layer not in norms:
        raise ValueError(f"replay: norms[{epoch}] has no entry for layer {layer!r}")
    return norms[layer]


class History:
    """What the detector has seen: ||Delta_e|| per layer and the schedule's LRs.

    ``end_epoch(e)`` records epoch e; decisions come from :func:`replay` over this history, so a
    run restored from :meth:`state_dict` decides exactly as an uninterrupted one.
    """

    def __init__(self, eta: float, interval: int) -> None:
        check_detector(eta, interval)
        self.eta, self.interval = eta, interval
        self.norms: list[dict[str, float]] = []
        self.lrs: list[float] = []  # epochs 0 .. len(norms) once an epoch has ended

    def record(self, epoch: int, norms: dict[str, float], lr: float, next_lr: float) -> None:
        """Epoch ``epoch``'s norms, its LR and the next epoch's."""
        if epoch != len(self.norms):
            raise RuntimeError(f"end_epoch({epoch}) after {len(self.norms)} recorded epochs")
        self.norms.append(dict(norms))
        self.lrs[epoch:] = [lr, next_lr]

    def critical(self, epoch: int, layers: Iterable[str]) -> dict[str, bool]:
        """Per layer, whether ``epoch`` is critical (needs epochs 0 .. epoch - 1 recorded)."""
        if epoch > len(self.norms):
            raise RuntimeError(f"start_epoch({epoch}) after only {len(self.norms)} recorded "
                               f"epochs")
        # Before end_epoch(0), epoch 0's LR is unknown; Algorithm 1 makes epoch 0 critical anyway.
        lrs = self.lrs[:epoch + 1] or [math.nan]
        return replay(self.norms[:epoch], lrs, self.eta, self.interval, layers)[epoch]

    def ratios(self, epoch: int, layers: Iterable[str]) -> dict[str, float]:
        """Algorithm 1's statistic per layer at the end of a check epoch ({} otherwise); a NaN
        one (critical, see :func:`is_critical`) is also logged as a warning."""
        if not is_check_epoch(epoch, self.interval):
            return {}
        before, now = self.norms[epoch - self.interval], self.norms[epoch]
        ratios = {n: relative_change(before[n], now[n]) for n in layers}
        nan = [n for n, r in ratios.items() if math.isnan(r)]
        if nan:
            log.warning("accordion: NaN ratio at epoch %d for %s (norms %s -> %s): critical",
                        epoch, ", ".join(nan), [before[n] for n in nan], [now[n] for n in nan])
        return ratios

    def decisions(self) -> list[dict[str, bool]]:
        """Every decision the history implies: epochs 0 .. len(norms)."""
        if not self.norms:
            return []
        return replay(self.norms, self.lrs, self.eta, self.interval)

    def state_dict(self) -> dict[str, Any]:
        """Norms, LRs and the decisions they gave."""
        return {"norms": [dict(n) for n in self.norms], "lrs": list(self.lrs),
                "decisions": self.decisions()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a ConfigError if this eta/interval decide differently."""
        self.norms = [dict(n) for n in state["norms"]]
        self.lrs = list(state["lrs"])
        if self.decisions() != state["decisions"]:
            raise ConfigError(f"resume: scheduler.eta={self.eta} / scheduler.interval="
                              f"{self.interval} would change the checkpoint's past decisions; "
                              f"resume with the run's own values")


def resolve_levels(compressor: Compressor, low: Any, high: Any) -> tuple[Any, Any]:
    """(low, high) as ``compressor`` takes them; null ones from its ``accordion_levels``.

    A level the compressor rejects raises its ConfigError naming ``scheduler.low`` / ``.high``.
    """
    if low is None or high is None:
        if compressor.accordion_levels is None:
            raise ConfigError(f"scheduler.low: compressor {compressor.name!r} has no levels to "
                              f"switch; use a compressor with levels "
                              f"({compression.with_levels()}) or scheduler=static / "
                              f"accordion_batch")
        default_low, default_high = compressor.accordion_levels
        low = default_low if low is None else low
        high = default_high if high is None else high
    return (compressor.validate_level(low, "scheduler.low"),
            compressor.validate_level(high, "scheduler.high"))


@register("accordion")
class Accordion(Scheduler):
    """Per compressed layer: level ``low`` in critical regimes, ``high`` elsewhere.

    ``low`` / ``high`` null take the compressor's ``accordion_levels``.
    """

    def __init__(self, low: Any = None, high: Any = None, eta: float = 0.5,
                 interval: int = 10) -> None:
        self.low, self.high = low, high
        self.history = History(eta, interval)
        self.layers: list[str] = []

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """ConfigError if the compressor does not take ``low`` and ``high`` as levels."""
        resolve_levels(compressor, self.low, self.high)

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Set each compressed layer's level for ``epoch``; log ``critical/*`` and ``level/*``."""
        low, high = resolve_levels(hook_state.compressor, self.low, self.high)
        self.layers = hook_state.compressed_layers()
        critical = self.history.critical(epoch, self.layers)
        levels = {n: low if c else high for n, c in critical.items()}
        hook_state.set_levels(levels)
        return {**{f"critical/{n}": c for n, c in critical.items()},
                **{f"level/{n}": level for n, level in levels.items()}}

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the compressed layers' ||Delta_e||; log ``ratio/*`` on check epochs."""
        self.history.record(epoch, {n: grad_norms[n] for n in self.layers}, lr, next_lr)
        return {f"ratio/{n}": r for n, r in self.history.ratios(epoch, self.layers).items()}

    def state_dict(self) -> dict[str, Any]:
        """The detector's history (norms, LRs, decisions)."""
        return self.history.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.history.load_state_dict(state)
