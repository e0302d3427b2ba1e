"""``scheduler=accordion_auto``: Accordion with each layer's two levels chosen from measurements.

Agarwal et al. (MLSys 2021) leave the endpoints {l_low, l_high} to the user, and a too
aggressive l_high costs accuracy that switching cannot recover (their Fig. 9). Here the
critical-regime detector is Accordion's own (:class:`schedulers.accordion.History`, Algorithm 1,
unchanged), and every compressed layer's low level (used in critical regimes) and high level
(elsewhere) are chosen among the candidates ``levels`` (the compressor's level field: PowerSGD
ranks, Top-K ratios, AdaComp bin sizes, ...) from what :mod:`compression.noise` measures on the
first ``probe_steps`` steps of epoch 0 and of every check epoch; the choice made at the end of
such an epoch holds until the next one. Epoch 0 runs at the first candidate (list the lightest
first).

Per layer, with W workers and the measured means over the probe's steps (compression/noise.py):

    noise        = dev_sq / (W - 1)   tr(Sigma_b): the variance of one worker's gradient g_w
    local_sq     = ||g_w||^2          (mean over workers)
    corrected_sq = ||M||^2            M = g_w + e_w, the error-corrected gradient
    error[c]     = ||C_c(M) - M||^2   the error of level c on it
    bits[c]      = its payload bits per step

Rules (``rule``), each a harm h(c) and "the candidate with the fewest bits whose h(c) <= f",
f = ``fraction_low`` for the low level and ``fraction_high`` for the high one (no candidate
qualifies: the one of smallest h):

- ``noise`` (default): h(c) = (error[c] / corrected_sq) / (noise / local_sq), the share of the
  error-corrected gradient the compressor drops over the share of the gradient that is noise.
  Under Accordion's Eq. 1 (a gradient is a sparse mean plus dense noise) a compressor that drops
  no more than the noise's share can keep the whole mean, as a large batch does; a small
  fraction inside critical regimes keeps most of the noise there too.
- ``noise_abs``: h(c) = error[c] / noise, the issue's literal form (absolute squared norms).
  With error feedback the memory e_w, and with it error[c], is many steps of residue, so h is
  large at every level (docs/accordion_auto.md has the numbers).
- ``budget``: the lightest candidates (most bits), made heavier only as ``budget`` needs (moves
  ordered by the ``noise`` rule's h).

With ``budget`` (a fraction of dense fp32 bits, for either rule) the levels are then made
heavier until the payload fits ``budget`` x the dense bits over the run: the payload so far plus
the planned one. With ``epochs`` (the run's length) the plan is the next ``interval`` epochs,
each layer at the endpoint its critical state at the next epoch uses, and every later epoch at
the layer's low level as often as it has been critical so far, at its high level otherwise;
without ``epochs`` it is the next ``interval`` epochs only (a running budget: early critical
regimes then get less). Moves: first the high levels (they serve the non-critical epochs), then
the low ones, each the move whose new level has the smallest h. The payload is the probe's own
bits plus the uncompressed tensors' and each layer's ``bits`` at its level (exact for
compressors whose bits follow the level; for AdaComp the last measurement's). A budget the
heaviest candidates cannot meet leaves them heaviest (``auto/over_budget/model`` 1).

Logged at the end of measured epochs (``auto/<stat>/<layer>``): ``noise``, ``local_sq``,
``corrected_sq``, ``error@<c>``, ``bits@<c>``, the chosen ``low`` and ``high``; for the model
``noise_scale`` (McCandlish et al. 2018's B_simple, :func:`noise_scale`), ``grad_sq``,
``trace``, ``probe_bits``, ``step_dense_bits`` and ``step_other_bits`` (fp32 bits of a step,
and of its uncompressed tensors), and with a budget ``allowance`` and ``over_budget``.
:func:`replay_levels` makes the same choices from those logged numbers (offline: other rules,
fractions, budgets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import compression
from compression.base import Compressor
from compression.noise import Measurement, NoiseProbe
from compression.stats import FP32_BITS
from compression.worker import WorkerState
from core.errors import ConfigError, check_choice, check_int, check_number, check_ratio
from schedulers import register
from schedulers.accordion import History, is_check_epoch, replay
from schedulers.accordion_batch import MODEL
from schedulers.base import Scheduler

RULES = ("noise", "noise_abs", "budget")


def measured_epoch(epoch: int, interval: int) -> bool:
    """Epoch 0 and the detector's check epochs: where the endpoints are chosen again."""
    return epoch == 0 or is_check_epoch(epoch, interval)


def level_key(level: Any) -> str:
    """A level as it appears in a metric name (``error@0.1``, ``bits@2``)."""
    return str(level)


# ---- the choice (pure: the scheduler and the offline replay both call it) ------------------
@dataclass(frozen=True)
class Candidate:
    """One level of one layer, as measured."""

    level: Any
    error: float
    bits: float


@dataclass
class LayerStats:
    """A layer's measurements (see the module doc); ``candidates`` in the order of ``levels``."""

    noise: float
    local_sq: float
    corrected_sq: float
    candidates: list[Candidate]

    def harm(self, c: Candidate, absolute: bool = False) -> float:
        """h(c) of rule ``noise`` (``noise_abs`` with ``absolute``); inf where a measurement is
        NaN (a non-finite gradient: the safest candidate is the lightest)."""
        if any(math.isnan(x) for x in (c.error, self.noise, self.local_sq, self.corrected_sq)):
            return math.inf
        if absolute:
            return _ratio(c.error, self.noise)
        return _ratio(_ratio(c.error, self.corrected_sq), _ratio(self.noise, self.local_sq))


def _ratio(a: float, b: float) -> float:
    """a / b of non-negative numbers (no NaN), with 0 / 0 = 0, a / 0 = inf, inf / inf = inf."""
    if a == 0:
        return 0.0
    if b == 0 or (math.isinf(a) and math.isinf(b)):
        return math.inf
    return a / b


def heaviest(stats: LayerStats, limit: float, absolute: bool = False) -> Candidate:
    """The candidate with the fewest bits (then the smallest h) whose h <= ``limit``; if none,
    the one with the smallest h (then the most bits)."""
    harm = {c: stats.harm(c, absolute) for c in stats.candidates}
    within = [c for c in stats.candidates if harm[c] <= limit]
    if within:
        return min(within, key=lambda c: (c.bits, harm[c]))
    return min(stats.candidates, key=lambda c: (harm[c], -c.bits))


def lightest(stats: LayerStats) -> Candidate:
    """The candidate with the most bits (then the smallest h)."""
    return min(stats.candidates, key=lambda c: (-c.bits, stats.harm(c)))


def fit_budget(choice: dict[str, list[Candidate]], stats: dict[str, LayerStats],
               weights: dict[str, tuple[float, float]], allowance: float) -> bool:
    """Make levels of ``choice`` (per layer [low, high]) heavier until sum over layers of
    ``weights`` (epochs at low, epochs at high) x their bits per step is <= ``allowance``: high
    levels first (outside critical regimes), then low ones, each move the one whose new level
    has the smallest h; then no layer's high is lighter than its low. True if it fits."""
    total = sum(w * choice[n][side].bits for n, ws in weights.items() for side, w in enumerate(ws))
    for side in (1, 0):  # 1: high, used outside critical regimes; 0: low, inside
        while total > allowance:
            moves = []
            for name, ws in weights.items():
                current = choice[name][side]
                heavier = [x for x in stats[name].candidates if x.bits < current.bits]
                if heavier and ws[side] > 0:
                    step = max(heavier, key=lambda x: (x.bits, -stats[name].harm(x)))
                    moves.append((stats[name].harm(step), ws[side] * (step.bits - current.bits),
                                  name, step))
            if not moves:
                break
            _, saved, name, step = min(moves, key=lambda m: m[:3])
            choice[name][side] = step
            total += saved
    for pair in choice.values():  # a high level sending more than the low: the low
        if pair[1].bits > pair[0].bits:
            pair[1] = pair[0]
    return total <= allowance


def choose(stats: dict[str, LayerStats], rule: str, fraction_low: float, fraction_high: float
           ) -> dict[str, list[Candidate]]:
    """Per layer [low, high] by ``rule`` before any budget (see the module doc)."""
    if rule == "budget":
        return {n: [lightest(s)] * 2 for n, s in stats.items()}
    absolute = rule == "noise_abs"
    return {n: [heaviest(s, fraction_low, absolute), heaviest(s, fraction_high, absolute)]
            for n, s in stats.items()}


@dataclass
class Epoch:
    """What the choice needs to know of one finished epoch."""

    epoch: int
    critical: dict[str, bool]       # per layer, in this epoch
    critical_next: dict[str, bool]  # per layer, in the next one
    bits_dense: float               # comm/bits_dense of the epoch (fp32 bits of its steps)


class Chooser:
    """The endpoints of every layer, epoch by epoch: the one place the choice lives.

    :meth:`end_epoch` accounts the epoch's payload and, with a measurement, chooses again.
    Its state (:meth:`state_dict`) is plain numbers, lists and dicts.
    """

    def __init__(self, levels: list[Any], rule: str, fraction_low: float,
                 fraction_high: float, budget: float | None, interval: int,
                 epochs: int | None = None) -> None:
        self.levels, self.rule = levels, rule
        self.fraction_low, self.fraction_high = fraction_low, fraction_high
        self.budget, self.interval, self.epochs = budget, interval, epochs
        self.choices: dict[str, list[Any]] = {}  # layer -> [low, high]
        self.bits: dict[str, list[float]] = {}   # layer -> bits per step of each level
        self.spent = [0.0, 0.0]                  # payload bits, dense bits so far
        self.critical: dict[str, int] = {}       # layer -> its critical epochs so far

    def level(self, layer: str, critical: bool) -> Any:
        """The level ``layer`` runs at (the first candidate before any measurement)."""
        pair = self.choices.get(layer)
        return self.levels[0] if pair is None else pair[0 if critical else 1]

    def end_epoch(self, done: Epoch, stats: dict[str, LayerStats] | None, probe_bits: float,
                  step_dense: float, step_other: float) -> dict[str, float]:
        """Account epoch ``done`` (its levels' bits, the probe's); with ``stats`` (the
        epoch's measurement) choose every layer's [low, high] again; returns the model-level
        metrics of the choice (allowance, over_budget)."""
        if stats is not None:
            self.bits = {n: [c.bits for c in s.candidates] for n, s in stats.items()}
        steps = done.bits_dense / step_dense
        payload = step_other + sum(
            self.bits[n][self.levels.index(self.level(n, c))] for n, c in done.critical.items())
        self.spent[0] += steps * payload + probe_bits
        self.spent[1] += done.bits_dense
        for n, c in done.critical.items():
            self.critical[n] = self.critical.get(n, 0) + c
        if stats is None:
            return {}
        choice = choose(stats, self.rule, self.fraction_low, self.fraction_high)
        out: dict[str, float] = {}
        window = self.interval if self.epochs is None else min(self.interval,
                                                               self.epochs - done.epoch - 1)
        if self.budget is not None and window > 0:
            rest = 0 if self.epochs is None else self.epochs - done.epoch - 1 - window
            ahead = window + rest  # epochs left to plan for
            allowed = self.budget * (self.spent[1] + ahead * done.bits_dense) - self.spent[0]
            allowance = allowed / steps - ahead * step_other  # compressed layers, step x epoch
            # the window as the detector decided it, later epochs critical as often as so far
            share = {n: self.critical.get(n, 0) / (done.epoch + 1) for n in done.critical_next}
            weights = {n: (window * c + rest * share[n], window * (not c) + rest * (1 - share[n]))
                       for n, c in done.critical_next.items()}
            fits = fit_budget(choice, stats, weights, allowance)
            out = {f"auto/allowance/{MODEL}": allowance / ahead,
                   f"auto/over_budget/{MODEL}": float(not fits)}
        self.choices = {n: [low.level, high.level] for n, (low, high) in choice.items()}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Choices, the bits they were measured at, the payload so far."""
        return {"choices": {n: list(p) for n, p in self.choices.items()},
                "bits": {n: list(b) for n, b in self.bits.items()}, "spent": list(self.spent),
                "critical": dict(self.critical)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.choices = {n: list(p) for n, p in state["choices"].items()}
        self.bits = {n: list(b) for n, b in state["bits"].items()}
        self.spent = [float(x) for x in state["spent"]]
        self.critical = {n: int(c) for n, c in state["critical"].items()}


def noise_scale(local_sq: float, mean_sq: float, batch: int, world_size: int
                ) -> tuple[float, float, float]:
    """McCandlish et al. 2018 (App. A.1) from the gradients of batches b = batch / W (each
    worker's) and B = batch (their mean): |G|^2 = (B |g_B|^2 - b |g_b|^2) / (B - b),
    tr(Sigma) = (|g_b|^2 - |g_B|^2) / (1/b - 1/B), and B_simple = tr(Sigma) / |G|^2 (inf where
    the |G|^2 estimate is not positive: noise dominates). Returns the three."""
    small, big = batch / world_size, float(batch)
    grad_sq = (big * mean_sq - small * local_sq) / (big - small)
    trace = (local_sq - mean_sq) / (1 / small - 1 / big)
    return grad_sq, trace, trace / grad_sq if grad_sq > 0 else math.inf


def model_noise_metrics(m: Measurement, batch: int) -> dict[str, float]:
    """``auto/{grad_sq,trace,noise_scale,probe_bits}/model`` of a measurement (whole model)."""
    # fsum: correctly rounded whatever the order the buckets (which DDP rebuilds) added them in
    local = math.fsum(t.local_sq for t in m.tensors.values())
    mean = math.fsum(t.mean_sq for t in m.tensors.values())
    grad_sq, trace, b_simple = noise_scale(local, mean, batch, m.world_size)
    return {f"auto/grad_sq/{MODEL}": grad_sq, f"auto/trace/{MODEL}": trace,
            f"auto/noise_scale/{MODEL}": b_simple, f"auto/probe_bits/{MODEL}": m.probe_bits}


# ---- measuring: shared with accordion_batch_auto ---------------------------------------------
class Probing:
    """The :class:`~compression.noise.NoiseProbe` a scheduler measures with: added to the hook
    on the first ``start_epoch`` (every rank, every simulated learner), its partial sums kept
    across a mid-epoch checkpoint."""

    def __init__(self, interval: int, steps: Any, sample: Any) -> None:
        self.interval = interval
        self.steps = check_int(steps, "scheduler.probe_steps", 1)
        self.sample = check_ratio(sample, "scheduler.probe_sample")
        self.probe: NoiseProbe | None = None
        self._hook: Any = None
        self._saved: dict[str, Any] | None = None

    def attach(self, hook_state: WorkerState, levels: Sequence[Any] = ()) -> None:
        """Add the probe to ``hook_state`` (once per hook state)."""
        if self._hook is hook_state:
            return
        make: Callable[[], NoiseProbe] = partial(
            NoiseProbe, partial(measured_epoch, interval=self.interval), self.steps, levels,
            self.sample)
        self.probe = hook_state.add_probe(make)
        self._hook = hook_state
        if self._saved is not None:
            self.probe.load_state_dict(self._saved)
            self._saved = None

    def take(self) -> Measurement:
        """The measured epoch's statistics."""
        assert self.probe is not None, "start_epoch attaches the probe"
        return self.probe.take()

    def state_dict(self) -> dict[str, Any] | None:
        """The probe's sums (mid-epoch), None before it is attached."""
        return self.probe.state_dict() if self.probe is not None else self._saved

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (into the probe, or into it once it is attached)."""
        if self.probe is not None and state is not None:
            self.probe.load_state_dict(state)
        else:
            self._saved = state


def check_world(world_size: int, name: str) -> None:
    """ConfigError unless there are >= 2 workers to measure the noise between."""
    if world_size < 2:
        raise ConfigError(f"scheduler.name: {name} measures the noise between workers' "
                          f"gradients; it needs >= 2 ranks or simulated learners "
                          f"(trainer.workers), got {world_size}")


def as_list(value: Any, field: str) -> list[Any] | None:
    """A config list (or null) as a Python list; a ConfigError naming ``field`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str) or not hasattr(value, "__iter__") or isinstance(value, dict):
        raise ConfigError(f"scheduler.{field}: expected a list or null, got {value!r}")
    items = list(value)
    if not items:
        raise ConfigError(f"scheduler.{field}: expected a non-empty list or null, got []")
    return items


def candidates(compressor: Compressor, levels: list[Any] | None) -> list[Any]:
    """The candidate levels as ``compressor`` takes them (null: its ``accordion_levels``); a
    ConfigError naming ``scheduler.levels`` for a level it rejects or a repeated one."""
    if compressor.accordion_levels is None:
        raise ConfigError(f"scheduler.levels: compressor {compressor.name!r} has no levels to "
                          f"choose; use a compressor with levels ({compression.with_levels()}) "
                          f"or scheduler=accordion_batch_auto")
    chosen = [compressor.validate_level(level, "scheduler.levels")
              for level in (levels if levels is not None else compressor.accordion_levels)]
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"scheduler.levels: expected distinct levels, got {chosen}")
    return chosen


@register("accordion_auto")
class AccordionAuto(Scheduler):
    """Per compressed layer: a low level in critical regimes and a high one elsewhere, both
    chosen among ``levels`` from measurements (see the module doc)."""

    def __init__(self, levels: Sequence[Any] | None = None, rule: str = "noise",
                 fraction_low: float = 0.5, fraction_high: float = 1.0,
                 budget: float | None = None, epochs: int | None = None, eta: float = 0.5,
                 interval: int = 10, probe_steps: int = 4, probe_sample: float = 1 / 16
                 ) -> None:
        self.levels = as_list(levels, "levels")
        check_choice(rule, "scheduler.rule", RULES)
        check_number(fraction_low, "scheduler.fraction_low", 0, low_open=True)
        check_number(fraction_high, "scheduler.fraction_high", fraction_low)
        if budget is not None:
            check_number(budget, "scheduler.budget", 0, low_open=True)
        elif rule == "budget":
            raise ConfigError("scheduler.budget: rule 'budget' needs a budget (a fraction of "
                              "the dense fp32 bits > 0), got null")
        if epochs is not None:
            check_int(epochs, "scheduler.epochs", 1)
        self.history = History(eta, interval)
        self.probing = Probing(interval, probe_steps, probe_sample)
        self.chooser = Chooser([], rule, float(fraction_low), float(fraction_high),
                               None if budget is None else float(budget), interval, epochs)
        self.layers: list[str] = []
        self.batch = 0
        self._hook: Any = None

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """ConfigError for bad candidates, or fewer than 2 workers."""
        candidates(compressor, self.levels)
        check_world(world_size, self.name)

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Set each compressed layer's level for ``epoch``; log ``critical/*`` and ``level/*``."""
        self.chooser.levels = candidates(hook_state.compressor, self.levels)
        self.probing.attach(hook_state, self.chooser.levels)
        self._hook = hook_state
        self.layers = hook_state.compressed_layers()
        critical = self.history.critical(epoch, self.layers)
        levels = {n: self.chooser.level(n, c) for n, c in critical.items()}
        hook_state.set_levels(levels)
        return {**{f"critical/{n}": c for n, c in critical.items()},
                **{f"level/{n}": level for n, level in levels.items()}}

    def batch_size(self, epoch: int, default: int) -> int:
        """``trainer.batch_size`` (kept for the noise scale)."""
        self.batch = default
        return default

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record ||Delta_e||; on measured epochs choose the endpoints again and log why."""
        self.history.record(epoch, {n: grad_norms[n] for n in self.layers}, lr, next_lr)
        out: dict[str, Any] = {f"ratio/{n}": r
                               for n, r in self.history.ratios(epoch, self.layers).items()}
        measured = self.probing.take() if measured_epoch(epoch, self.history.interval) else None
        step_dense = FP32_BITS * sum(x.shape.numel() for x in self._hook.layers.values())
        step_other = step_dense - FP32_BITS * sum(self._hook.layers[n].shape.numel()
                                                  for n in self.layers)
        done = Epoch(epoch, self.history.critical(epoch, self.layers),
                     self.history.critical(epoch + 1, self.layers),
                     self._hook.epoch_stats()["comm/bits_dense"])
        stats = (layer_stats(measured, self.layers, self.chooser.levels)
                 if measured is not None else None)
        out.update(self.chooser.end_epoch(done, stats, measured.probe_bits if measured else 0.0,
                                          step_dense, step_other))
        if measured is not None and stats is not None:
            out.update(model_noise_metrics(measured, self.batch))
            out.update(layer_metrics(stats, self.chooser.choices))
            out[f"auto/step_dense_bits/{MODEL}"] = step_dense
            out[f"auto/step_other_bits/{MODEL}"] = step_other
        return out

    def state_dict(self) -> dict[str, Any]:
        """The detector's history, the chooser's state, the probe's sums (mid-epoch)."""
        return {**self.history.state_dict(), "chooser": self.chooser.state_dict(),
                "probe": self.probing.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.history.load_state_dict(state)
        self.chooser.load_state_dict(state["chooser"])
        self.probing.load_state_dict(state["probe"])


def layer_stats(m: Measurement, layers: list[str], levels: list[Any]
                ) -> dict[str, LayerStats] | None:
    """Each compressed layer's noise and candidates from a measurement at ``levels`` (None:
    it measured no step)."""
    if m.steps == 0:
        return None
    return {n: LayerStats(m.tensors[n].dev_sq / (m.world_size - 1), m.tensors[n].local_sq,
                          m.tensors[n].corrected_sq,
                          [Candidate(c, e, b) for c, e, b in zip(
                              levels, m.tensors[n].error, m.tensors[n].bits, strict=True)])
            for n in layers}


def logged_stats(row: dict[str, Any], layers: list[str], levels: list[Any]
                 ) -> dict[str, LayerStats] | None:
    """:func:`layer_stats` as an epoch's row logged them (None: not a measured epoch)."""
    if not layers or f"auto/noise/{layers[0]}" not in row:
        return None
    return {n: LayerStats(row[f"auto/noise/{n}"], row[f"auto/local_sq/{n}"],
                          row[f"auto/corrected_sq/{n}"], [
        Candidate(c, row[f"auto/error@{level_key(c)}/{n}"], row[f"auto/bits@{level_key(c)}/{n}"])
        for c in levels]) for n in layers}


def replay_levels(rows: Sequence[dict[str, Any]], lrs: Sequence[float], layers: list[str],
                  chooser: Chooser, eta: float, interval: int) -> list[dict[str, Any]]:
    """Each epoch's level per layer that ``chooser`` (fresh: its rule, fractions, budget)
    picks from a run's logged rows (``grad_norm/*``, ``comm/bits_dense``, the ``auto/*`` of
    measured epochs; ``lrs``: the schedule's LR of every epoch and one more), as the live
    scheduler would have decided from the same numbers; afterwards ``chooser.spent[0]`` is the
    payload those levels would have sent (the logged measurements' bits per level). With the
    run's own settings it gives the logged ``level/*``. What it cannot see: training under
    other levels changes the statistics themselves."""
    norms = [{n: row[f"grad_norm/{n}"] for n in layers} for row in rows]
    critical = replay(norms, list(lrs)[:len(rows) + 1], eta, interval, layers)
    first = rows[0]
    step_dense = first[f"auto/step_dense_bits/{MODEL}"]
    step_other = first[f"auto/step_other_bits/{MODEL}"]
    out = []
    for epoch, row in enumerate(rows):
        out.append({n: chooser.level(n, critical[epoch][n]) for n in layers})
        stats = logged_stats(row, layers, chooser.levels) if measured_epoch(epoch, interval) \
            else None
        chooser.end_epoch(Epoch(epoch, critical[epoch], critical[epoch + 1],
                                row["comm/bits_dense"]), stats,
                          row.get(f"auto/probe_bits/{MODEL}", 0.0), step_dense, step_other)
    return out


def layer_metrics(stats: dict[str, LayerStats], choices: dict[str, list[Any]]
                  ) -> dict[str, float]:
    """``auto/noise``, ``auto/local_sq``, ``auto/corrected_sq``, ``auto/error@<c>``,
    ``auto/bits@<c>``, ``auto/low``, ``auto/high`` per layer."""
    out: dict[str, Any] = {}
    for name, s in stats.items():
        out[f"auto/noise/{name}"] = s.noise
        out[f"auto/local_sq/{name}"] = s.local_sq
        out[f"auto/corrected_sq/{name}"] = s.corrected_sq
        for c in s.candidates:
            out[f"auto/error@{level_key(c.level)}/{name}"] = c.error
            out[f"auto/bits@{level_key(c.level)}/{name}"] = c.bits
        out[f"auto/low/{name}"], out[f"auto/high/{name}"] = choices[name]
    return out
