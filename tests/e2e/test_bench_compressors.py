"""``make bench-compressors`` at a tiny size: every method it times runs, each of the zoo's
compressors stands beside its peer, both sides of a baseline comparison are written, and the
compression programs ``make bench-e2e`` charges are recorded. Nothing here asserts a time."""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys

import pytest
import torch

from benchmarks import compressor_peers, kernel_ab
from benchmarks.compressors import (
    FLOOR_PHASES,
    FLOORS,
    GOALS,
    Recorder,
    combine,
    compressor_methods,
    floor_ops,
    floor_pass,
    goal_of,
    main,
    record,
    resnet18_buckets,
    run_step,
    time_sides,
)
from benchmarks.ranks import run_ranks
from compression.base import Layer
from compression.comm import SimComm
from compression.hook import aggregate_bucket
from compression.powersgd import PowerSGD
from compression.topk import TopK
from tests.conftest import ROOT


@pytest.mark.parametrize("compressor", [PowerSGD(2), TopK(0.5)])
def test_a_program_notes_every_start_and_wait_in_order(compressor: object) -> None:
    # A bucket of a bias (the hook's dense all-reduce, started first and waited for last) and
    # two matrices: PowerSGD waits for P then Q, Top-K for its one all-gather.
    comm = Recorder(SimComm.group(1)[0])
    grads = [torch.randn(7), torch.randn(12, 30), torch.randn(8, 3, 3, 3)]
    layers = [Layer(f"l{i}", g.shape, 2 if isinstance(compressor, PowerSGD) else 0.5)
              for i, g in enumerate(grads[1:])]
    ops = record(aggregate_bucket(compressor, grads[:1], layers, grads[1:], comm), comm)
    kinds = [(op, x) for op, x in ops if op != "cpu"]
    if isinstance(compressor, PowerSGD):
        assert kinds == [("start", 0), ("start", 1), ("wait", 1), ("start", 2), ("wait", 2),
                         ("wait", 0)]
    else:
        assert kinds == [("start", 0), ("start", 1), ("wait", 1), ("wait", 0)]
    assert [op for op, _ in ops][0::2] == ["cpu"] * (len(kinds) + 1)  # work between each
    assert all(x >= 0 for op, x in ops if op == "cpu")


BASELINE = "598decd"  # the commit before issue 27's work (and before the zoo and CUDA timers)


@pytest.mark.slow
def test_a_baseline_run_writes_both_sides_and_the_goals(tmp_path) -> None:
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BASELINE}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"not a git checkout with {BASELINE} in its history: no baseline")
    done = subprocess.run([sys.executable, "-m", "benchmarks.compressors", "--width", "8",
                           "--repeats", "1", "--rounds", "2", "--ddp-steps", "1", "--baseline",
                           BASELINE, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    with open(tmp_path / "compressors.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    this = [r["method"] + r["level"] for r in rows if r["side"] == "this"]
    baseline = [r["method"] + r["level"] for r in rows if r["side"] == "baseline"]
    assert this[:len(baseline)] == baseline  # the methods both commits have, in one order
    only_this = [r["method"] for r in rows if r["side"] == "this"][len(baseline):]
    assert {f"ours {n}" for n in (*compressor_peers.ZOO, *compressor_peers.HOOKS)} <= set(
        only_this)  # the zoo, which the baseline predates
    assert [m.startswith("DDP step") for m in only_this[-2:]] == [True, True]
    assert all(float(r["x_clone"]) > 0 for r in rows if r["x_clone"])
    for r in rows:  # the median of two rounds is the lower one's row
        if r["x_clone"]:
            assert float(r["x_clone"]) == min(map(float, r["x_clone_rounds"].split(" / ")))
    text = (tmp_path / "compressors.md").read_text()
    assert "width 8: a check only" in text and "load average (1 min) at the repeats" in text
    assert re.search(r"Machine and code \(this side\): .+ \(fingerprint [0-9a-f]{12}\), "
                     r"commit [0-9a-f]{10}", text)
    others = text.split("**Every other method both sides time**")[1].split("\n\n")[1]
    assert "| ours none (fp32 all-reduce) | - |" in others and "ours powersgd" not in others
    assert "in each of 2 rounds, one after another" in text
    goals = text.split("**Issue 27's goals**")[1].split("\n\n")[1].splitlines()
    assert "| this x clone per round |" in goals[0]
    assert len(goals[2:]) == len(GOALS)
    for row in goals[2:]:  # each round's x clone; met, the floor in clone passes, the work over it
        assert re.fullmatch(r"\d+\.\d\d / \d+\.\d\d", row.split("|")[7].strip())
        met, floor, x_floor = [c.strip() for c in row.split("|")[-4:-1]]
        assert met in ("yes", "no", "no, below the floor", "in 1 of 2 rounds")
        assert float(floor) > 0 < float(x_floor)
    full = text.split("\n\n")[-1].splitlines()
    assert full[0].endswith("| x clone per round |")
    assert {len(row.split("|")) for row in full} == {len(full[0].split("|"))}


def test_the_sides_take_turns_going_first() -> None:
    # Within a repeat each method runs on every side back to back; the side that runs first
    # meets the caches its previous method left (PowerSGD, unchanged, timed 0.95x its own
    # baseline when this side always went first: c5fc41a against f32384c), so the order
    # alternates from repeat to repeat.
    calls: list[tuple[str, str]] = []

    class FakeSide:
        def __init__(self, name: str) -> None:
            self.name, self.rows = name, [{"key": "a"}, {"key": "b"}]

        def run(self, key: str) -> tuple[float, float | None]:
            calls.append((self.name, key))
            return 1.0, None

    time_sides([FakeSide("this"), FakeSide("baseline")], repeats=2, warmup=0)
    assert calls == [("this", "a"), ("baseline", "a"), ("this", "b"), ("baseline", "b"),
                     ("baseline", "a"), ("this", "a"), ("baseline", "b"), ("this", "b")]


def test_bench_kernels_times_every_pass_on_both_sides(tmp_path) -> None:
    # HEAD against itself at width 8: every pass of the three kernels runs on both sides, and
    # their outputs agree bit for bit (a digest that differed would print NO); --only keeps the
    # passes of one kernel.
    assert kernel_ab.main(["--baseline", "HEAD", "--repeats", "1", "--width", "8",
                           "--out", str(tmp_path)]) == 0
    table = (tmp_path / "kernels.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith(("| topk", "| powersgd",
                                                                    "| adacomp"))]
    assert len(rows) == (2 * len(kernel_ab.TOPK_RATIOS) + 3 * len(kernel_ab.POWERSGD_RANKS)
                         + 2 * len(kernel_ab.ADACOMP_BINS))
    assert all(row.endswith("| yes |") for row in rows), table
    assert "`python -m benchmarks.kernel_ab --baseline HEAD --repeats 1`" in table
    assert "(fingerprint " in table
    assert kernel_ab.main(["--baseline", "HEAD", "--repeats", "1", "--width", "8", "--only",
                           "adacomp", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "kernels.md").read_text()
    assert [line.split(",")[0] for line in table.splitlines() if line.startswith("| ")][1:] == \
        ["| adacomp compress", "| adacomp decompress (2 workers)"] * len(kernel_ab.ADACOMP_BINS)
    assert "--only adacomp`" in table


def test_a_goal_below_the_algorithms_floor_says_so() -> None:
    assert goal_of("psgd1", 1.5, 0.5, floor=1.2) == ("<= 2x clone", "yes")
    assert goal_of("psgd1", 3.0, 0.5, floor=1.2) == ("<= 2x clone", "no")
    assert goal_of("psgd1", 3.0, 0.5, floor=2.5) == ("<= 2x clone", "no, below the floor")
    assert goal_of("psgd2", 2.0, 0.5, floor=1.0)[1] == "no"  # the peer's part of the goal
    assert goal_of("none", 1.0, None, floor=9.0) == ("", "")
    assert set(FLOORS) == set(GOALS)


def test_rounds_give_each_goal_its_median_round_and_how_often_it_was_met() -> None:
    def rounds(*x_clones: float) -> list[dict[str, dict]]:
        out = []
        for x in x_clones:
            goal, met = goal_of("psgd1", x, 0.5, floor=1.2)
            out.append({"psgd1": {"x_clone": x, "ms": 10 * x, "goal": goal, "met": met},
                        "none": {"x_clone": x / 5, "ms": x, "goal": "", "met": ""}})
        return out

    some = combine(rounds(2.4, 1.9, 2.1))
    assert some["psgd1"]["ms"] == 21.0 and some["psgd1"]["x_clone"] == 2.1  # the median round
    assert some["psgd1"]["met"] == "in 1 of 3 rounds"
    assert some["psgd1"]["x_clone_rounds"] == "2.40 / 1.90 / 2.10"
    assert some["none"]["met"] == "" and some["none"]["x_clone"] == 2.1 / 5
    assert combine(rounds(1.9, 1.8))["psgd1"] | {"x_clone_rounds": ""} == {
        "x_clone": 1.8, "ms": 18.0, "goal": "<= 2x clone", "met": "yes", "x_clone_rounds": ""}
    assert combine(rounds(2.4, 2.1))["psgd1"]["met"] == "no"
    assert combine(rounds(2.4))["psgd1"]["met"] == "no"


def test_a_floor_makes_the_algorithms_passes() -> None:
    # M = g + e into the floor's own error memory (every step), the output written (zeros);
    # vectors (biases, norms) are not compressed and take no part.
    _, buckets = resnet18_buckets(batch=2, width=4)
    grads = [g for b in buckets for g in b.gradients()]
    for b in buckets:
        b.restore()
    before = [g.clone() for g in grads]
    for key, ratio in (("psgd", None), ("adacomp", None), ("topk", 0.1)):
        for b in buckets:
            b.restore()
        floor_pass(buckets, FLOOR_PHASES[key], ratio)()
        for g, old in zip(grads, before, strict=True):
            assert torch.equal(g, torch.zeros_like(g) if g.ndim > 1 else old)


def test_a_floor_orders_its_passes_as_the_collectives_do() -> None:
    # Within a bucket, every layer takes a phase before any layer takes the next (PowerSGD's M
    # is read after P's all-reduce, not from cache right after the add); buckets one by one.
    _, buckets = resnet18_buckets(batch=2, width=4)
    layers = [sum(g.ndim > 1 for g in b.gradients()) for b in buckets]
    assert max(layers) > 1  # else any order would do
    for key, ratio in (("psgd", None), ("adacomp", None), ("topk", 0.1)):
        names = [name for name, _ in floor_ops(buckets, FLOOR_PHASES[key], ratio)]
        expected = [op for count in layers for phase in FLOOR_PHASES[key]
                    for _ in range(count) for op in phase]
        assert names == expected, key
    assert FLOOR_PHASES["psgd"] == (("add",), ("read",), ("write",))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: it would run")
def test_cuda_without_a_gpu_skips_in_one_line(tmp_path, capsys) -> None:
    assert main(["--device", "cuda", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().count("\n") == 0
    assert not list(tmp_path.iterdir())


def _one_repeat(rank: int, world: int) -> tuple[list[dict], dict[str, float]]:
    model, buckets = resnet18_buckets(batch=2, width=4)
    methods, rows = compressor_methods(model, buckets)
    return rows, {key: run_step(fn, buckets)[0] for key, fn in methods.items()}


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


def test_the_profile_times_every_pass_of_every_goal(tmp_path) -> None:
    # A process of its own (the profile wraps the kernels' module functions for good, and owns
    # a world-size-1 group): every goal gets a row, its kernel's passes are timed (> 0), the
    # rest is the work outside them, and the floor was run.
    done = subprocess.run([sys.executable, "-m", "benchmarks.compressor_profile", "--width", "8",
                           "--repeats", "1", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "compressors_profile.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by = {}
    for row in rows:
        by.setdefault((row["compressor"], row["level"]), {})[row["part"]] = float(row["ms"])
    assert len(by) == len(GOALS)
    for (compressor, _), parts in by.items():
        main_passes = {"powersgd": ("project", "back", "expand"),
                       "topk": ("compress", "decompress"),
                       "adacomp": ("compress", "decompress")}[compressor]
        assert all(parts[p] > 0 for p in main_passes), (compressor, parts)
        passes = sum(v for k, v in parts.items() if k not in ("rest", "work", "floor"))
        assert parts["all_gather" if compressor != "powersgd" else "all_reduce"] > 0
        # the CSV rounds each part to 0.001 ms: up to 11 roundings of 0.0005 apart
        assert math.isclose(parts["rest"], parts["work"] - passes, abs_tol=6e-3)
        assert parts["floor"] > 0
    text = (tmp_path / "compressors_profile.md").read_text()
    assert text.count("\n| powersgd |") == 3 and "work / floor" in text
    assert re.search(r"\(fingerprint [0-9a-f]{12}\), commit [0-9a-f]{10}", text)
