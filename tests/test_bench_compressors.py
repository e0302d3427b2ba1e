"""``make bench-compressors`` at a tiny size: every method it times runs, and each of the zoo's
compressors stands beside its peer (no timing is checked: the machine is shared)."""

from __future__ import annotations

import math

import torch

from benchmarks import compressor_peers
from benchmarks.compressors import compressor_methods, resnet18_buckets, time_interleaved
from core.ranks import run_ranks


def _one_repeat(rank: int, world: int) -> tuple[list[dict], dict[str, float]]:
    model, buckets = resnet18_buckets(batch=2, width=4)
    methods, rows = compressor_methods(model, buckets)
    median, _ = time_interleaved(methods, buckets, repeats=1)
    return rows, median


def test_every_zoo_compressor_runs_beside_its_peer() -> None:
    rows, median = run_ranks(_one_repeat, 1)[0]
    ours = {r["method"].removeprefix("ours "): r for r in rows if r["peer"]}
    for name in (*compressor_peers.ZOO, *compressor_peers.HOOKS):
        assert name in ours, name
    for row in rows:
        assert math.isfinite(median[row["key"]]) and median[row["key"]] > 0
        if row["peer"] is not None:
            assert row["peer"] in median
    hooks = [r["method"] for r in rows if r["method"].startswith("PyTorch fp16")]
    assert hooks == ["PyTorch fp16_compress_hook"]


def test_plain_peers_quantize_as_ours_do() -> None:
    # The peers are the same math without the machinery: unbiased quantizers stay unbiased,
    # selections keep k elements, signs are signs.
    torch.manual_seed(0)
    g = torch.randn(16, 64)
    runs = 400
    for peer, tol in ((compressor_peers.qsgd(4), 0.1), (compressor_peers.terngrad(64), 0.15),
                      (compressor_peers.natural(), 0.05)):
        mean = sum(_applied(peer, g) for _ in range(runs)) / runs
        assert float((mean - g).abs().mean()) < tol * float(g.abs().mean())
    assert int((_applied(compressor_peers.randomk(0.25), g) != 0).sum()) == 256
    assert int((_applied(compressor_peers.dgc(0.1), g) != 0).sum()) <= 102
    assert torch.equal(_applied(compressor_peers.signsgd(), g), torch.sign(g))
    onebit = _applied(compressor_peers.onebit(None), g)
    assert onebit.unique().numel() <= 2 * 16  # two values per row


def _applied(peer: compressor_peers.Peer, g: torch.Tensor) -> torch.Tensor:
    out = g.clone()
    peer(out)
    return out
