"""The top-k support overlap (Accordion Fig. 4a, compression/overlap.py): against a naive
reference, through the hook, in a real 2-rank run, and its config checks."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from omegaconf import OmegaConf

from compression import overlap
from compression.comm import SimComm
from compression.hook import HookState
from compression.none import NoCompression
from core.errors import ConfigError
from tests.conftest import TINY, assert_ok, read_rows, run_cli


def naive_support(x: torch.Tensor, top: float) -> set[int]:
    """The k = ceil(top n) indices of largest |x|, by sorting a Python list."""
    values = [abs(v) for v in x.reshape(-1).tolist()]
    k = max(1, math.ceil(top * len(values)))
    return set(sorted(range(len(values)), key=lambda i: -values[i])[:k])


def naive_overlaps(grads: list[torch.Tensor], top: float) -> tuple[float | None, float]:
    sets = [naive_support(g, top) for g in grads]
    k = len(sets[0])
    pairs = [len(a & b) / k for a, b in itertools.combinations(sets, 2)]
    mean = sum(grads) / len(grads)
    large = naive_support(mean, top)
    batch = sum(len(s & large) / k for s in sets) / len(sets)
    return (sum(pairs) / len(pairs) if pairs else None), batch


@pytest.mark.parametrize(("workers", "n", "top"), [(1, 50, 0.1), (2, 103, 0.1), (3, 40, 0.25),
                                                     (4, 7, 0.5)])
def test_overlaps_match_a_naive_reference(workers: int, n: int, top: float) -> None:
    gen = torch.Generator().manual_seed(workers * 100 + n)
    shared = torch.randn(n, generator=gen) * (torch.rand(n, generator=gen) < 0.2) * 5
    grads = [shared + torch.randn(n, generator=gen) for _ in range(workers)]
    got = overlap.layer_overlaps(torch.stack(grads), top)
    want = naive_overlaps(grads, top)
    assert got[0] == pytest.approx(want[0]) if want[0] is not None else got[0] is None
    assert got[1] == pytest.approx(want[1])


def test_overlap_extremes() -> None:
    x = torch.arange(1.0, 21.0)
    assert overlap.support_overlap(x, x.flip(0), 0.1) == 0.0   # top 2 of each: disjoint
    assert overlap.support_overlap(x, -3 * x, 0.1) == 1.0      # |x| ranks, scale-free
    assert overlap.support_overlap(x, x, 1.0) == 1.0


@pytest.mark.parametrize("follower", [False, True])
def test_hook_measures_only_chosen_epochs_and_steps(follower: bool) -> None:
    # Two simulated workers through the hook's own path: the overlap is taken from the local
    # gradients before aggregation, on the first `steps` steps of the chosen epochs only.
    # follower: worker 1 only joins the gathers (gather_only, as simulated learners > 0 do);
    # worker 0 measures the same.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 5))
    comms = SimComm.group(2)
    params = list(model.named_parameters())
    probes = [overlap.OverlapProbe([1], top=0.1, steps=2) for _ in range(2)]
    if follower:
        probes[1] = probes[0].gather_only()
    states = [HookState(NoCompression(), params, comm=comms[w], overlap=probes[w])
              for w in range(2)]
    gen = torch.Generator().manual_seed(1)
    seen: list[list[torch.Tensor]] = []
    for epoch in range(3):
        for state in states:
            state.reset_epoch(epoch)
        for step in range(3):
            buffers = [torch.randn(sum(p.numel() for _, p in params), generator=gen)
                       for _ in range(2)]
            if epoch == 1 and step < 2:
                seen.append([b.clone() for b in buffers])
            futures = []
            for state, buffer in zip(states, buffers, strict=True):
                grads = [g.view_as(p) for g, (_, p) in
                         zip(buffer.split([p.numel() for _, p in params]), params, strict=True)]
                futures.append(state.aggregate([n for n, _ in params], grads, buffer))
                state.stats.step += 1
            for f in futures:
                f.wait()
        stats = states[0].epoch_stats()
        if epoch != 1:
            assert not any(k.startswith("overlap") for k in stats)
            continue
        theirs = {k: v for k, v in states[1].epoch_stats().items() if k.startswith("overlap")}
        assert theirs == ({} if follower else
                          {k: v for k, v in stats.items() if k.startswith("overlap")})
        matrices = [(offset, p.numel()) for (_, p), offset in zip(
            params, itertools.accumulate([0] + [p.numel() for _, p in params]), strict=False)
            if p.ndim > 1]
        model = [naive_overlaps([torch.cat([b[o:o + n] for o, n in matrices]) for b in bufs],
                                0.1) for bufs in seen]
        assert stats["overlap_model"] == pytest.approx(sum(m[0] for m in model) / 2)
        assert stats["overlap_batch_model"] == pytest.approx(sum(m[1] for m in model) / 2)
        offset = 0
        for name, p in params:
            if p.ndim < 2:
                offset += p.numel()
                assert f"overlap/{name}" not in stats
                continue
            per_step = [naive_overlaps([b[offset:offset + p.numel()] for b in bufs], 0.1)
                        for bufs in seen]
            assert stats[f"overlap/{name}"] == pytest.approx(
                sum(s[0] for s in per_step) / 2)
            assert stats[f"overlap_batch/{name}"] == pytest.approx(
                sum(s[1] for s in per_step) / 2)
            offset += p.numel()


@pytest.mark.parametrize(("observe", "field"), [
    ({"overlap_epochs": "3"}, "observe.overlap_epochs"),
    ({"overlap_epochs": [-1]}, "observe.overlap_epochs"),
    ({"overlap_epochs": [1], "overlap_top": 0}, "observe.overlap_top"),
    ({"overlap_epochs": [1], "overlap_steps": 0}, "observe.overlap_steps"),
    ({"overlap_epoch": [1]}, "observe.overlap_epoch"),
])
def test_bad_observe_config_names_the_field(observe: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        overlap.from_config(OmegaConf.create(observe))


def test_off_by_default(compose_cfg) -> None:
    assert overlap.from_config(compose_cfg().observe) is None


@pytest.mark.slow
def test_two_rank_run_logs_overlap_keys(tmp_path) -> None:
    assert_ok(run_cli([*TINY, "compressor=topk", "trainer.epochs=3", "observe.overlap_epochs=[0,2]",
                       "observe.overlap_steps=2", f"hydra.run.dir={tmp_path}"], nproc=2))
    rows = read_rows(tmp_path)
    matrices = [k[len("level/"):] for k in rows[0] if k.startswith("level/")]
    assert matrices
    for row in rows:
        keys = {k for k in row if k.startswith(("overlap/", "overlap_batch/"))}
        if row["epoch"] == 1:
            assert not keys and "overlap_model" not in row
            continue
        assert keys == {f"{kind}/{n}" for kind in ("overlap", "overlap_batch") for n in matrices}
        assert all(0 <= row[k] <= 1 for k in keys)
        pairs = sum(row[f"overlap/{n}"] for n in matrices) / len(matrices)
        batch = sum(row[f"overlap_batch/{n}"] for n in matrices) / len(matrices)
        # Above chance (0.1 for independent supports); each worker's gradient is half the
        # global batch's, so it is closer to that than to the other worker's.
        assert 0.1 < pairs < batch
        assert 0 < row["overlap_model"] <= 1 and 0 < row["overlap_batch_model"] <= 1
