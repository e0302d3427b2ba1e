"""Reference algorithms the compressors are checked against (written from the papers,
independently of compression/), and the helpers that compare a C kernel with its eager torch
path."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import compression
from core.native import Library, compiler


# ---- compressors: simulated gradients, AdaComp's reference (test_compression.py and
# test_adacomp_kernel.py) ------------------------------------------------------------
def random_steps(shape: tuple[int, ...], workers: int, steps: int, seed: int = 0
                 ) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=gen) for _ in range(workers)] for _ in range(steps)]


def ref_adacomp(steps: list[list[torch.Tensor]], bin_size: int, soft: bool = True
                ) -> tuple[list[torch.Tensor], list[list[int]], list[torch.Tensor]]:
    """Chen et al. Alg. 2, bin by bin, element by element (float64).

    Returns the mean outputs, the paper's bits per worker per step, and the final residues.
    """
    n = steps[0][0].numel()
    residues = [torch.zeros(n, dtype=torch.float64) for _ in steps[0]]
    outs, bits = [], []
    for grads in steps:
        quantized, step_bits = [], []
        for w, g in enumerate(grads):
            dw = g.double().reshape(-1)
            big_g = residues[w] + dw
            h = big_g + dw
            bins = [range(i, min(i + bin_size, n)) for i in range(0, n, bin_size)]
            g_max = [max(abs(float(big_g[j])) for j in b) for b in bins]
            s = sum(g_max) / len(g_max)
            g_q = torch.zeros(n, dtype=torch.float64)
            for b, gm in zip(bins, g_max, strict=True):
                if soft:
                    chosen = [j for j in b if abs(float(h[j])) >= gm]
                else:
                    chosen = [max(b, key=lambda j: abs(float(big_g[j])))]
                for j in chosen:
                    g_q[j] = math.copysign(s, float(big_g[j])) if big_g[j] != 0 else 0.0
            residues[w] = big_g - g_q
            sent = int((g_q != 0).sum())
            step_bits.append(sent * (8 if bin_size < 64 else 16) + 32)
            quantized.append(g_q)
        outs.append(torch.stack(quantized).mean(0).reshape(grads[0].shape))
        bits.append(step_bits)
    return outs, bits, residues


def assert_outputs(got: list[tuple[torch.Tensor, list[int]]], want: list[torch.Tensor],
                   atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for (out, _), ref in zip(got, want, strict=True):
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=1e-4)


# ---- compressors: a C kernel against its eager torch path -----------------------------------
def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (float32 as int32), flat: equal means bit for bit."""
    return t.reshape(-1).view(torch.int32)


SimulatedRun = tuple[list[tuple[torch.Tensor, list[int]]], list[torch.Tensor]]


def simulate_run(name: str, shape: tuple[int, ...], steps: list[list[torch.Tensor]], key: str,
                 **params: object) -> SimulatedRun:
    """Run compressor ``name`` on simulated workers over ``steps``: each step's aggregate and
    bits, and each worker's (settled) ``memory[key]`` at the end."""
    sim = compression.Simulation(name, len(steps[0]), shape, **params)
    outs = [sim.step(grads) for grads in steps]
    return outs, [sim.memory(w)[key] for w in range(len(steps[0]))]


def assert_same_bits(got: SimulatedRun, expected: SimulatedRun) -> None:
    """Two :func:`simulate_run` results agree bit for bit: aggregates, bits and memories."""
    for (out, bits), (out_e, bits_e) in zip(got[0], expected[0], strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e)) and bits == bits_e
    for memory, memory_e in zip(got[1], expected[1], strict=True):
        assert torch.equal(bits_of(memory), bits_of(memory_e))


def require_kernel(library: Library) -> None:
    """Skip where there is no C compiler; where there is one, ``library`` must build."""
    if compiler() is None:
        pytest.skip(f"no C compiler: {library.name} runs its eager path only")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a build failure's warning fails the test
        assert library.get() is not None


@contextmanager
def without_a_compiler(library: Library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> Iterator[list[warnings.WarningMessage]]:
    """Inside: ``library`` cannot be built (no compiler); on the way out the list holds the
    warnings ``library`` itself gave (at least one is required; other kernels first built
    inside may warn too, they are left out). Afterwards it is built (or found) anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    library.reset()
    own: list[warnings.WarningMessage] = []
    try:
        with pytest.warns(RuntimeWarning, match="eager torch path") as record:
            yield own
        own += [w for w in record if str(w.message).startswith(f"{library.name}:")]
    finally:
        library.reset()


def kernel_and_eager(library: Library, name: str, steps: list[list[torch.Tensor]],
                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **params: Any
                     ) -> tuple[list[Any], list[Any]]:
    """``compression.simulate(name, steps, **params)`` as it runs here (``library``'s kernel),
    then without a compiler (the eager torch path; ``library`` must warn once): both results."""
    kernel = compression.simulate(name, steps, **params)
    with without_a_compiler(library, tmp_path, monkeypatch) as record:
        eager = compression.simulate(name, steps, **params)
    assert len(record) == 1
    return kernel, eager
