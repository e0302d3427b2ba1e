"""Seeds and RNG states: how a rank (or a simulated learner) seeds its streams, and the states
a checkpoint saves, as plain containers and tensors (checkpoints load with
``torch.load(weights_only=True)``: no NumPy arrays or other objects in them).

(Not in run.py: submitit pickles run.py's functions by value, and ``torch.backends.cudnn`` is a
module object that cannot be pickled so.)
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rank_seed(seed: int, rank: int) -> int:
    """The data-side seed of rank ``rank`` (of a simulated worker too)."""
    return int(seed) * 1000 + rank


def seed_everything(seed: int, rank: int, deterministic: bool) -> None:
    """Seed Python, NumPy and torch; ``rank`` offsets the data-side seeds (model init uses 0)."""
    s = rank_seed(seed, rank)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        # torch.use_deterministic_algorithms(True, warn_only=True) without its import of
        # torch._inductor (seconds of start-up, for the flag of torch.compile, unused here).
        torch._C._set_deterministic_algorithms(True, warn_only=True)


def capture(cuda: bool = False) -> dict[str, Any]:
    """The process's RNG states (Python, NumPy, torch's CPU generator; with ``cuda`` and a GPU
    present, the current device's generator too)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, Any]) -> None:
    """Set the process's RNG states to what :func:`capture` returned."""
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _as_tuples(obj: Any) -> Any:
    """Python's RNG state with its tuples back (a checkpoint may hand them back as lists)."""
    return tuple(_as_tuples(x) for x in obj) if isinstance(obj, list | tuple) else obj
