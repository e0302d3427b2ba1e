"""How a run that cannot go on ends: what its summary says, who writes it, what the user reads.

A multi-rank job can end by an error on one rank (a bug, a full disk, a signal) or because a
peer is gone (killed, its node lost, stopped): the others then see a collective fail, at once
for a closed connection or after ``trainer.dist_timeout_s`` for a peer that stopped answering.
:func:`ending` tells these apart through the posts every failing rank leaves in the job's store
(:func:`core.distributed.post_ending`): a rank that posted its own error failed; a rank that
posted nothing within a few seconds is lost. Rank 0 writes ``summary.json``; if rank 0 is the
one lost, the lowest surviving rank does, from ``metrics.jsonl``.

Numerical faults: :func:`describe_nonfinite` words the first non-finite gradient the ranks saw
(:meth:`compression.HookState.nonfinite`). :func:`inject_from_env` is the tests' way to cause
one: a real NaN or inf in one layer's gradient on one rank (nothing is installed unless the
environment variable is set).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core import distributed
from core.errors import ConfigError
from core.record import RecordError
from jobs import signals

# How long a rank that saw a collective fail waits for the other ranks' posts (at most
# trainer.dist_timeout_s): a rank that failed on its own posts before it exits.
WAIT_S = 5.0
# A collective failed because of a peer: torch.distributed's own errors, and gloo's, which reach
# Python as RuntimeErrors (from DDP's hook futures, "Unable to cast ... to Tensor").
PEER_MARKERS = ("third_party/gloo/", "Connection reset by peer", "Connection closed by peer",
                "timeout caused pair closure", "NCCL")
INJECT_ENV = "ACCORDION_BENCH_INJECT"  # <parameter>@<rank>:<backward>=<inf|nan>
MAX_REASON = 300


class RunFailed(RuntimeError):
    """The run could not go on (a lost peer, a full disk); the message is one line, printed
    without a traceback, and the summary says how the run ended."""


@dataclass(frozen=True)
class Ending:
    """How this rank ended: ``status`` for ``summary.json``; ``line`` for stderr in place of a
    traceback (None: keep the traceback, a bug); ``records``: this rank writes the summary."""

    status: str
    line: str | None
    records: bool


def reason(exc: BaseException) -> str:
    """``exc`` as "Type: first line of its message", at most MAX_REASON characters; a gloo
    error as its gist ("Read error [127.0.0.1]:33986: Connection reset by peer")."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if is_peer_failure(exc):  # DDP's "Unable to cast [<gloo source>] <gist>. <advice> to Tensor"
        text = re.sub(r"^Unable to cast |\[[^\]]*third_party/gloo/[^\]]*\]\s*| to Tensor$", "",
                      text).split(". ")[0]
    return f"{type(exc).__name__}: {text}"[:MAX_REASON]


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed (a peer gone or not answering)."""
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in PEER_MARKERS)


def ending(exc: BaseException, rank: int, world_size: int, timeout_s: float) -> Ending:
    """How this rank's run ends by ``exc``; posts it for the other ranks (see the module doc)."""
    if isinstance(exc, signals.Preempted):  # every rank stopped together, checkpointed
        return Ending(str(exc), None, rank == 0)
    wait_s = min(WAIT_S, timeout_s)
    mine = reason(exc)
    if not is_peer_failure(exc) or world_size == 1:
        if world_size > 1:
            distributed.post_ending(rank, mine, own=True, timeout_s=wait_s)
        line = mine if isinstance(exc, RecordError) else None
        return Ending(f"failed: {mine}", line, rank == 0)
    distributed.post_ending(rank, mine, own=False, timeout_s=wait_s)
    posts = distributed.endings(world_size, wait_s)
    if posts is None:  # the store went with its host: rank 0 (not under torchrun)
        return Ending(f"failed: lost rank 0 (the job's store is gone too): {mine}",
                      f"lost rank 0 (the job's store is gone too): {mine}", False)
    failed = sorted(r for r, post in posts.items() if post["own"])
    if failed:
        what = f"rank {failed[0]} failed: {posts[failed[0]]['reason']}"
        return Ending(f"failed: {what}", what, rank == 0)
    lost = [r for r in range(world_size) if r not in posts]
    if not lost:
        return Ending(f"failed: {mine}", mine, rank == 0)
    survivors = sorted(posts)
    what = (f"lost rank {', '.join(map(str, lost))} (no word from it within {wait_s:g} s of "
            f"this collective failing: {mine})")
    return Ending(f"failed: {what}", what, rank == (0 if 0 in posts else survivors[0]))


def describe_nonfinite(epoch: int, faults: list[tuple[int, int, list[str]]]) -> str:
    """One line naming the first non-finite gradient sum: ``faults`` holds (rank, step,
    layers) for each rank that saw one in ``epoch``."""
    step = min(f[1] for f in faults)
    first = [f for f in faults if f[1] == step]
    ranks = ", ".join(str(r) for r, _, _ in first)
    layers = list(dict.fromkeys(name for _, _, names in first for name in names))
    more = f" (and {len(layers) - 1} more)" if len(layers) > 1 else ""
    return (f"non-finite gradient in layer {layers[0]}{more} on rank {ranks} at epoch {epoch}, "
            f"step {step}: its sum over the epoch (Delta_e) became inf or NaN")


def inject_from_env(model: nn.Module, rank: int) -> None:
    """``ACCORDION_BENCH_INJECT=<parameter>@<rank>:<backward>=<inf|nan>``: on that rank, the
    ``backward``-th backward pass (0-based, counted from the start of this process) multiplies
    the parameter's gradient by inf or NaN. Unset (always, outside tests): nothing is done."""
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return
    try:
        target, value = spec.rsplit("=", 1)
        name, where = target.rsplit("@", 1)
        at_rank, at_call = (int(x) for x in where.split(":"))
        factor = {"inf": float("inf"), "nan": float("nan")}[value]
        param = dict(model.named_parameters())[name]
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{INJECT_ENV}: expected <parameter>@<rank>:<backward>=<inf|nan> "
                          f"with a parameter of the model, got {spec!r}") from exc
    if rank != at_rank:
        return
    calls = itertools.count()

    def poison(grad: torch.Tensor) -> torch.Tensor | None:
        return grad * factor if next(calls) == at_call else None

    param.register_hook(poison)


def record_line(run_dir: Any) -> str:
    """What the user does after a failure that left the run resumable."""
    return f"the run resumes from its last checkpoint with resume=true hydra.run.dir={run_dir}"
