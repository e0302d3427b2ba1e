"""PowerSGD's batched passes: the C kernel (compression/kernels/powersgd.c) and the batched torch
path, against each other, and a bucket's layers against each layer alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compression import _powersgd_kernel as psgd_kernel
from compression.base import Layer
from compression.comm import SimComm, drive
from compression.hook import aggregate_bucket
from compression.powersgd import PowerSGD
from core import numerics
from core.native import PORTABLE_ENV
from tests.conftest import ROOT
from tests.references import bits_of, kernel_and_eager, random_steps, require_kernel

# A bucket: three layers of one shape (a batch), two of another n, a shape of its own, one
# that goes dense at rank 2 ((3 + 5) 2 >= 15), a first conv with m = 27 (not a whole number of
# lanes) and one with fewer rows than a block of the second pass.
BUCKET = ((8, 3, 3, 3), (8, 3, 3, 3), (8, 3, 3, 3), (12, 40), (12, 40), (30, 7), (3, 5),
          (16, 3, 3, 3), (3, 50))
WORKERS = 3
# Kernel and batched torch ops sum in different orders: they agree within float32 rounding,
# which error feedback carries from step to step: at most 3e-5 of the output's largest
# magnitude seen over 8 steps of ResNet-18's shapes (Intel Xeon), 2e-5 absolute in this file's
# bucket on an AMD EPYC, where MKL's products take other branches. Allowed: 1e-4 of the
# largest magnitude of the tensor compared.
RTOL, SCALED_ATOL = 1e-4, 1e-4


def assert_agree(x: torch.Tensor, y: torch.Tensor) -> None:
    """x and y within float32 rounding carried over steps (see RTOL, SCALED_ATOL)."""
    torch.testing.assert_close(x, y, rtol=RTOL, atol=SCALED_ATOL * float(y.abs().max()))


def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make PowerSGD take its batched torch path (as on CUDA or without a C compiler)."""
    monkeypatch.setattr(psgd_kernel, "kernel", lambda: None)


def gradient(step: int, worker: int, index: int) -> torch.Tensor:
    """Worker's gradient of layer ``index`` of BUCKET at ``step`` (whatever else is in the
    bucket)."""
    seed = (step * WORKERS + worker) * len(BUCKET) + index
    return torch.randn(BUCKET[index], generator=torch.Generator().manual_seed(seed))


def run_bucket(steps: int, levels: dict[int, int], indices: tuple[int, ...] | None = None,
               settle_at: tuple[int, ...] = (), reload_at: tuple[int, ...] = (),
               **params: object) -> list[list[torch.Tensor]]:
    """One bucket of BUCKET's layers ``indices`` (default all) on simulated workers for
    ``steps`` steps; ``levels``: step -> the rank every layer takes from then on; after the
    steps in ``settle_at`` every memory is settled, after those in ``reload_at`` replaced by
    copies (as a checkpoint's load does). Returns each step's aggregates, then every worker's
    settled memories."""
    indices = tuple(range(len(BUCKET))) if indices is None else indices
    compressor = PowerSGD(**params)
    layers = [[Layer(f"l{i}", torch.Size(BUCKET[i]), compressor.rank) for i in indices]
              for _ in range(WORKERS)]
    comms = SimComm.group(WORKERS)
    outs = []
    for t in range(steps):
        if t in levels:
            for layer in (x for worker in layers for x in worker):
                compressor.set_level(layer, levels[t])
        grads = [[gradient(t, w, i) for i in indices] for w in range(WORKERS)]
        futures = [drive(aggregate_bucket(compressor, [], mine, grads[w], comms[w]))
                   for w, mine in enumerate(layers)]
        assert all(f.done() for f in futures)
        outs.append(grads[0])
        for layer in (x for worker in layers for x in worker):
            if t in settle_at:
                compressor.settle(layer)
            if t in reload_at:
                compressor.settle(layer)
                layer.memory = {k: v.clone() for k, v in layer.memory.items()}
    for layer in (x for worker in layers for x in worker):
        compressor.settle(layer)
    memories = [v for worker in layers for x in worker for _, v in sorted(x.memory.items())]
    return [*outs, memories]


def assert_same_bits(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(bits_of(x.contiguous()), bits_of(y.contiguous()))


@pytest.mark.parametrize("error_feedback", [True, False])
def test_kernel_and_batched_torch_agree(error_feedback: bool,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 2, then 1 (rank changes settle what is owed), then 4 (new Q columns).
    require_kernel(psgd_kernel.LIBRARY)
    levels = {0: 2, 3: 1, 5: 4}
    kernel = run_bucket(8, levels, error_feedback=error_feedback)
    eager(monkeypatch)
    torch_ops = run_bucket(8, levels, error_feedback=error_feedback)
    for got, want in zip(kernel, torch_ops, strict=True):
        for x, y in zip(got, want, strict=True):
            assert_agree(x, y)


def check_bucket_against_layers_alone() -> None:
    """Batching the layers (one call per pass, one bmm per shape) changes no layer's numbers."""
    levels = {0: 2, 3: 3}
    bucket = run_bucket(5, levels)
    memories = iter(bucket[-1])
    for i in range(len(BUCKET)):
        alone = run_bucket(5, levels, indices=(i,))
        for got, want in zip(bucket[:-1], alone[:-1], strict=True):
            assert torch.equal(bits_of(got[i]), bits_of(want[0])), f"layer {i}"
        for want in alone[-1][:len(alone[-1]) // WORKERS]:  # worker 0's memories of layer i
            assert torch.equal(bits_of(next(memories).contiguous()), bits_of(want.contiguous()))


def test_a_bucket_gives_each_layer_what_it_gives_alone() -> None:
    require_kernel(psgd_kernel.LIBRARY)
    check_bucket_against_layers_alone()


def test_batched_torch_gives_each_layer_what_it_gives_alone_under_portable_numerics() -> None:
    # The batched torch path: bit for bit where MKL's branch is fixed, as portable numerics (the
    # default of CPU runs) fixes it; with the machine's own branch a batch of 3 and a matrix
    # alone took products that differ in the last bits on an AMD EPYC (not on an Intel Xeon).
    # A process of its own: the branch is fixed before MKL's first call.
    script = ("from compression import _powersgd_kernel as k; k.kernel = lambda: None; "
              "from tests.unit.test_powersgd_kernel import check_bucket_against_layers_alone "
              "as check; check()")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **numerics.PORTABLE_ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_settling_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel owes e = M - P Q^T to the next step's first pass; paying it at once (settle, as
    # before a checkpoint) or reloading the memories must give the same bits afterwards.
    require_kernel(psgd_kernel.LIBRARY)
    straight = run_bucket(5, {0: 2})
    assert_same_bits(run_bucket(5, {0: 2}, settle_at=(1, 2)), straight)
    assert_same_bits(run_bucket(5, {0: 2}, reload_at=(2,)), straight)


def test_batched_torch_memories_survive_a_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    # The batched path keeps a batch's memories as the rows of one tensor; memories loaded from
    # a checkpoint (separate tensors) are copied in once, and nothing changes.
    eager(monkeypatch)
    straight = run_bucket(5, {0: 2, 3: 1})
    assert_same_bits(run_bucket(5, {0: 2, 3: 1}, reload_at=(1, 3)), straight)


@pytest.mark.slow
def test_portable_loops_are_bitwise_the_avx2_ones(tmp_path: Path) -> None:
    # The kernel's lane loops are compiled for AVX2 and portable; with PORTABLE_ENV set the
    # portable build runs. Both must give the same bits (each in a process of its own).
    require_kernel(psgd_kernel.LIBRARY)
    script = ("import sys, torch; from tests.unit.test_powersgd_kernel import run_bucket; "
              "torch.save(run_bucket(6, {0: 2, 2: 5, 4: 1}), sys.argv[1])")
    runs = {}
    for portable in (False, True):
        env = {k: v for k, v in os.environ.items() if k != PORTABLE_ENV}
        runs[portable] = tmp_path / f"{portable}.pt"
        proc = subprocess.run([sys.executable, "-c", script, str(runs[portable])], cwd=ROOT,
                              env={**env, **({PORTABLE_ENV: "1"} if portable else {})},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_bits(torch.load(runs[True]), torch.load(runs[False]))


def test_without_a_compiler_warns_once_and_runs_batched_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = random_steps((30, 40), 2, steps=3)
    fused, torch_ops = kernel_and_eager(psgd_kernel.LIBRARY, "powersgd", steps, tmp_path,
                                        monkeypatch, rank=2)
    for (out, bits), (out_t, bits_t) in zip(fused, torch_ops, strict=True):
        assert_agree(out, out_t)
        assert bits == bits_t == [32 * 70 * 2] * 2

