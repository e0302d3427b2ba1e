"""Token streams from a random first-order Markov chain (embedded; no files needed).

The chain has ``vocab_size`` states; row i of its transition matrix P is a Dirichlet(``alpha``)
draw (all rows from ``seed``), so a small ``alpha`` makes each next token predictable from the
current one and a large one makes it nearly uniform. The train and test streams are sampled
independently, each starting from the stationary distribution pi (so every token is
distributed as pi) and of ``train_tokens`` / ``test_tokens`` tokens.

The best possible test loss is therefore known: the entropy rate
``H = sum_i pi_i * H(P_i)`` nats per token (:func:`entropy_rate`), i.e. a perplexity floor of
``exp(H)`` (:func:`perplexity_floor`) that any model's test perplexity approaches from above (up
to sampling noise of the finite test stream, and except for the first token of a stream, which
has no predecessor). A model that ignores context can do no better than ``exp(H(pi))``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

import numpy as np
import torch

from core.errors import ConfigError, check_int, check_number
from data import DataBundle, register


def _check(cfg: Any) -> None:
    check_int(cfg.vocab_size, "dataset.vocab_size", 2)
    check_number(cfg.alpha, "dataset.alpha", 0, low_open=True)
    for field in ("train_tokens", "test_tokens"):
        check_int(cfg[field], f"dataset.{field}", 2)
    if cfg.get("num_classes") is not None and cfg.num_classes != cfg.vocab_size:
        raise ConfigError(f"dataset.num_classes: must equal dataset.vocab_size ({cfg.vocab_size}), "
                          f"got {cfg.num_classes}; leave it as ${{.vocab_size}}")


def _matrix(rng: np.random.Generator, cfg: Any) -> np.ndarray:
    size = int(cfg.vocab_size)
    return rng.dirichlet(np.full(size, float(cfg.alpha)), size=size)


def transition_matrix(cfg: Any) -> np.ndarray:
    """P (float64, ``vocab_size`` x ``vocab_size``): ``P[i, j]`` = Pr(next = j | current = i)."""
    _check(cfg)
    return _matrix(np.random.default_rng(int(cfg.seed)), cfg)


def stationary(matrix: np.ndarray) -> np.ndarray:
    """The stationary distribution pi of ``matrix`` (pi P = pi, sum 1)."""
    size = len(matrix)
    system = matrix.T - np.eye(size)
    system[-1] = 1.0  # replace one (redundant) balance equation by sum(pi) = 1
    rhs = np.zeros(size)
    rhs[-1] = 1.0
    pi = np.linalg.solve(system, rhs)
    return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()


def stationary_distribution(cfg: Any) -> np.ndarray:
    """pi, the chain's stationary distribution (the distribution of every token)."""
    return stationary(transition_matrix(cfg))


def entropy_rate(cfg: Any) -> float:
    """``sum_i pi_i * H(P_i)`` in nats per token: the lowest achievable test loss."""
    matrix = transition_matrix(cfg)
    logs = np.log(np.where(matrix > 0, matrix, 1.0))
    row_entropy = -(matrix * logs).sum(axis=1)
    return float(stationary(matrix) @ row_entropy)


def perplexity_floor(cfg: Any) -> float:
    """``exp(entropy_rate(cfg))``: the lowest achievable test perplexity."""
    return math.exp(entropy_rate(cfg))


def sample(matrix: np.ndarray, pi: np.ndarray, length: int,
           rng: np.random.Generator) -> torch.Tensor:
    """A stream of ``length`` tokens of the chain, its first token drawn from ``pi``."""
    cumulative = np.cumsum(matrix, axis=1)
    cumulative[:, -1] = 1.0  # no rounding can push a draw past the last state
    rows = cumulative.tolist()
    start = np.cumsum(pi)
    start[-1] = 1.0
    uniforms = rng.random(length).tolist()
    state = bisect_right(start.tolist(), uniforms[0])
    out = [state]
    for u in uniforms[1:]:
        state = bisect_right(rows[state], u)
        out.append(state)
    return torch.tensor(out, dtype=torch.int64)


@register("synthetic_text", check=_check, fixed={"task": "language_model"})
def build(cfg: Any) -> DataBundle:
    """Independent train and test streams of the chain; ``num_classes`` = ``vocab_size``."""
    rng = np.random.default_rng(int(cfg.seed))
    matrix = _matrix(rng, cfg)
    pi = stationary(matrix)
    train = sample(matrix, pi, int(cfg.train_tokens), rng)
    test = sample(matrix, pi, int(cfg.test_tokens), rng)
    return DataBundle("language_model", int(cfg.vocab_size), train, test)
