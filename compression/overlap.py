"""Top-k support overlap of gradients: the observation behind Accordion's Fig. 4a.

Agarwal et al. (MLSys 2021) justify their sparse-mean plus dense-noise model of the stochastic
gradient (Eq. 1) by the overlap of the top-10% coordinates of gradients, above 90% (Fig. 4a):
every mini-batch's gradient carries the same few large coordinates (the sparse mean), which is
why a large batch and a heavy compression both keep only those. This module measures it in a
real data-parallel run, per matrix-shaped layer (ndim > 1), at chosen epochs:

    S_k(x) = the k = ceil(top x n) coordinates of largest |x| (n: the layer's size)
    overlap(a, b) = |S_k(a) & S_k(b)| / k                         in [0, 1]
    overlap/<layer>       = mean over worker pairs w < v of overlap(g_w, g_v)
    overlap_batch/<layer> = mean over workers w of overlap(g_w, (1/W) sum_v g_v)
    overlap_model, overlap_batch_model: the same for the whole model's gradient (its
                            matrix-shaped layers concatenated: one top-k over all of them)

g_w is worker w's local gradient of the step (its mini-batch of B/W examples, before any
compression or error feedback); (1/W) sum_v g_v is the gradient of the global batch B, the
"large batch" of the small- vs large-batch comparison (it contains g_w's own examples: with W =
2 it is half g_w). Both are averaged over the measured steps of the epoch.

Measuring needs every worker's gradient: on the chosen epochs' first ``steps`` steps the hook
all-gathers the bucket's matrix-shaped gradients (dense fp32, through the same :class:`~
compression.comm.Comm` as the compressor, so the order of collectives stays the same on every
rank); other steps cost nothing. The measuring is compute the hook times, so it shows in
``time/compress_s`` of the measured epochs. Config: the ``observe`` node of conf/config.yaml, off
by default; it changes no result (a relaunch or resume may change it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from compression.comm import Comm, Steps
from core.errors import ConfigError, check_int, check_ratio

KEYS = ("overlap_epochs", "overlap_top", "overlap_steps")
MODEL = ""  # the whole model's entry in the sums (no layer is named "")


def top_support(x: torch.Tensor, top: float) -> torch.Tensor:
    """The indices of the k = ceil(top n) coordinates of largest |x| (x flattened)."""
    flat = x.reshape(-1)
    k = max(1, math.ceil(top * flat.numel()))
    return torch.topk(flat.abs(), k, sorted=False).indices


def support_overlap(a: torch.Tensor, b: torch.Tensor, top: float) -> float:
    """|S_k(a) & S_k(b)| / k for the top-``top`` supports of two tensors of one shape."""
    ia, ib = top_support(a, top), top_support(b, top)
    mask = torch.zeros(a.numel(), dtype=torch.bool, device=a.device)
    mask[ia] = True
    return float(mask[ib].sum()) / ia.numel()


def layer_overlaps(grads: torch.Tensor, top: float) -> tuple[float | None, float]:
    """For one layer's gradients on W workers (a (W, n) tensor): the mean overlap over worker
    pairs (None for W = 1) and the mean overlap of each worker's with the global mean's."""
    world = grads.shape[0]
    pairs = [support_overlap(grads[w], grads[v], top)
             for w in range(world) for v in range(w + 1, world)]
    mean = grads.mean(dim=0)
    batch = sum(support_overlap(grads[w], mean, top) for w in range(world)) / world
    return (sum(pairs) / len(pairs) if pairs else None), batch


class OverlapProbe:
    """Measures the top-k support overlaps at chosen epochs; sums them per layer for the epoch.

    ``epochs``: the (0-based) epochs measured; ``top``: the fraction k/n of coordinates
    (Fig. 4a: 0.1); ``steps``: the first steps of each chosen epoch that are measured (None:
    all of them).
    """

    def __init__(self, epochs: Sequence[int] = (), top: float = 0.1, steps: int | None = 8,
                 *, record: bool = True) -> None:
        self.epochs = frozenset(epochs)
        self.top = top
        self.steps = steps
        self.record = record  # False: take part in the gathers only (see gather_only)
        self.layers: list[str] = []  # the model's matrix-shaped layers, in order (see expect)
        self.reset()

    def gather_only(self) -> OverlapProbe:
        """A probe on the same steps that joins the gathers and measures nothing: simulated
        learners other than learner 0, whose gathered gradients learner 0 already measures
        (W-fold the same work otherwise; only rank 0's metrics are recorded)."""
        return OverlapProbe(self.epochs, self.top, self.steps, record=False)

    def expect(self, layers: list[str]) -> None:
        """The model's matrix-shaped layers: once a step has gathered them all (over its
        buckets), the whole-model overlap is measured too."""
        self.layers = list(layers)

    def reset(self) -> None:
        """Forget the epoch's sums."""
        self._sums: dict[str, list[float]] = {}  # layer -> [pairs sum, batch sum, count]
        self._step: dict[str, torch.Tensor] = {}  # this step's gathered (W, n) per layer

    def active(self, epoch: int, step: int) -> bool:
        """Whether step ``step`` (0-based) of ``epoch`` is measured."""
        return epoch in self.epochs and (self.steps is None or step < self.steps)

    def measure(self, names: list[str], grads: list[torch.Tensor], comm: Comm) -> Steps[None]:
        """Steps that gather every worker's gradients of the matrix-shaped ``grads`` (named
        ``names``) and add their overlaps to the epoch's sums. Call before the compressor
        overwrites them."""
        chosen = [(n, g) for n, g in zip(names, grads, strict=True) if g.ndim > 1]
        if not chosen:
            return
        flat = torch.cat([g.detach().reshape(-1).float() for _, g in chosen])
        parts = (yield comm.all_gather(flat)).view(comm.world_size, -1)
        if not self.record:
            return
        start = 0
        for name, g in chosen:
            self._step[name] = parts[:, start:start + g.numel()]
            self._add(name, self._step[name])
            start += g.numel()
        if self.layers and all(n in self._step for n in self.layers):  # the step's last bucket
            self._add(MODEL, torch.cat([self._step.pop(n) for n in self.layers], dim=1))

    def _add(self, name: str, grads: torch.Tensor) -> None:
        pairs, batch = layer_overlaps(grads, self.top)
        sums = self._sums.setdefault(name, [0.0, 0.0, 0])
        sums[0] += pairs if pairs is not None else math.nan
        sums[1] += batch
        sums[2] += 1

    def stats(self) -> dict[str, float]:
        """``overlap/<layer>`` (worker pairs; not for one worker) and ``overlap_batch/<layer>``,
        ``overlap_model`` and ``overlap_batch_model`` (the whole model), each the mean over the
        measured steps of this epoch (empty if none was measured)."""
        out: dict[str, float] = {}
        for name, (pairs, batch, count) in self._sums.items():
            pair_key, batch_key = (("overlap_model", "overlap_batch_model") if name == MODEL
                                   else (f"overlap/{name}", f"overlap_batch/{name}"))
            if not math.isnan(pairs):
                out[pair_key] = pairs / count
            out[batch_key] = batch / count
        return out


def from_config(cfg: Any) -> OverlapProbe | None:
    """The probe the ``observe`` config node asks for (None when ``overlap_epochs`` is empty),
    or a ConfigError naming the field."""
    if cfg is None:
        return None
    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        raise ConfigError(f"observe.{unknown[0]}: unknown key; expected one of {list(KEYS)}")
    epochs = cfg.get("overlap_epochs") or []
    if isinstance(epochs, str) or not hasattr(epochs, "__iter__"):
        raise ConfigError(f"observe.overlap_epochs: expected a list of epochs, got {epochs!r}")
    epochs = [check_int(e, "observe.overlap_epochs", 0) for e in epochs]
    top = check_ratio(cfg.get("overlap_top", 0.1), "observe.overlap_top")
    steps = cfg.get("overlap_steps", 8)
    if steps is not None:
        steps = check_int(steps, "observe.overlap_steps")
    return OverlapProbe(epochs, top, steps) if epochs else None
