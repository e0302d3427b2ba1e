"""The claim sweeps (conf/sweep/claim_*.yaml): each composes into the runs its claim needs, with
a make target and an analysis module; the analyses on hand-written run records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import analysis.claims
import schedulers
from core import record
from jobs import sweeps
from tests.analysis_fixture import MACHINE_A, MACHINE_B, provenance
from tests.conftest import CONF, ROOT
from tests.figure_checks import problems
from training.config import validate

CLAIMS = ("residues", "fig2b", "overlap", "batch")


def claim_runs(name: str, *arguments: str) -> list:
    """Every run of claim ``name`` at tiny scale, composed as the sweeper composes it."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"sweep=claim_{name}", "scale=tiny"],
                      return_hydra_config=True)
        todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params,
                             [f"sweep=claim_{name}", "scale=tiny", *arguments], "tiny")
        return [compose("config", overrides=j, return_hydra_config=True) for j in todo]


def test_every_claim_has_a_sweep_a_make_target_and_an_analysis():
    simulated = ("learners", "minibatch")  # tests/e2e/test_simulated.py
    assert sorted(p.stem for p in (CONF / "sweep").glob("claim_*.yaml")) == \
        sorted(f"claim_{c}" for c in (*CLAIMS, *simulated)) == \
        sorted(f"claim_{c}" for c in analysis.claims.NAMES)
    makefile = (ROOT / "Makefile").read_text()
    assert f"CLAIMS := {' '.join(CLAIMS)}" in makefile
    assert f"SIM_CLAIMS := {' '.join(simulated)}" in makefile
    for name in analysis.claims.NAMES:
        module = analysis.claims.module(name)
        assert f"claim_{name}" == module.SWEEP and module.FIGURE.endswith(".png")
        assert set(module.KEEP) <= {"completed", "diverged"}
        assert all(callable(getattr(module, f)) for f in ("data", "plot", "table"))


@pytest.mark.parametrize("name", CLAIMS)
def test_claim_runs_validate_for_two_ranks_in_distinct_directories(name, tmp_path):
    runs = claim_runs(name)
    dirs = {Path(str(c.hydra.sweep.dir)) / str(c.hydra.sweep.subdir) for c in runs}
    assert len(dirs) == len(runs)
    assert {(c.sweep, c.scale) for c in runs} == {(f"claim_{name}", "tiny")}
    for c in runs:
        validate(OmegaConf.masked_copy(c, [k for k in c if k != "hydra"]), world_size=2,
                 run_dir=tmp_path)


def test_residue_runs_are_soft_and_hard_selection_at_three_bin_sizes():
    got = {(c.method, c.compressor.name, c.compressor.soft_threshold, c.compressor.conv_bin_size,
            c.compressor.fc_bin_size, c.dataset.name, tuple(c.model.channels))
           for c in claim_runs("residues")}
    assert got == {(f"{'soft' if soft else 'ls'}_L{size}", "adacomp", soft, size, size, "digits",
                    (32, 32, 64)) for soft in (True, False) for size in (50, 500, 5000)}


def test_fig2b_plans_high_compression_early_late_or_throughout():
    by_method = {c.method: c for c in claim_runs("fig2b")}
    assert set(by_method) == {"rank4", "rank1", "rank1_first_rank4", "rank4_first_rank1"}
    epochs = by_method["rank4"].trainer.epochs
    k = by_method["rank4"].recipe.batch_switch_epoch
    assert 0 < k < epochs and all(c.trainer.epochs == epochs for c in by_method.values())

    def ranks(c) -> list[int]:
        if c.scheduler.name == "static":
            return [c.compressor.rank] * epochs
        plan = schedulers.build(c.scheduler)
        return [plan.levels[plan.phase(e)] for e in range(epochs)]

    assert ranks(by_method["rank4"]) == [4] * epochs
    assert ranks(by_method["rank1"]) == [1] * epochs
    assert ranks(by_method["rank1_first_rank4"]) == [1] * k + [4] * (epochs - k)
    assert ranks(by_method["rank4_first_rank1"]) == [4] * k + [1] * (epochs - k)


def test_overlap_runs_measure_every_epoch_at_two_batches():
    runs = claim_runs("overlap")
    assert {(c.method, c.compressor.name) for c in runs} == {("batch512", "none"),
                                                            ("batch4096", "none")}
    for c in runs:
        assert list(c.observe.overlap_epochs) == list(range(c.trainer.epochs))
        assert c.observe.overlap_top == 0.1


def test_batch_runs_pair_accordion_on_batch_and_on_compression():
    got = {(c.method, c.compressor.name, c.scheduler.name, c.baseline)
           for c in claim_runs("batch")}
    assert got == {("batch512", "none", "static", "batch512"),
                   ("batch4096", "none", "plan", "batch512"),
                   ("accordion_batch512_batch4096", "none", "accordion_batch", "batch512"),
                   ("k0.99", "topk", "static", "k0.99"), ("k0.10", "topk", "static", "k0.99"),
                   ("accordion_k0.99_k0.10", "topk", "accordion", "k0.99")}
    intervals = {c.scheduler.interval for c in claim_runs("batch") if "accordion" in c.method}
    assert len(intervals) == 1  # the same detector for both


# ---- the analyses, on hand-written run records ----------------------------------------------
def write_run(root: Path, cfg, rows: list[dict], status: str = "completed",
              **summary: object) -> None:
    """A run record as run.py leaves it: .hydra/config.yaml, metrics.jsonl, summary.json (with
    the keys of ``summary`` added)."""
    run_dir = root / str(cfg.hydra.sweep.subdir)
    (run_dir / ".hydra").mkdir(parents=True)
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    OmegaConf.save(task, run_dir / ".hydra" / "config.yaml", resolve=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = {**record.summarize(rows, status, "test/accuracy", 1.0), **summary}
    (run_dir / "summary.json").write_text(json.dumps(written))


def base_row(epoch: int, accuracy: float, bits: float = 1e6) -> dict:
    return {"epoch": epoch, "train/loss": 1.0, "test/accuracy": accuracy, "comm/bits": bits,
            "comm/bits_dense": 1e8, "time/epoch_s": 1.0, "lr": 0.1, "batch_size": 32}


def test_residue_analysis_reads_growth_and_selection(tmp_path, capsys):
    for c in claim_runs("residues", "compressor.conv_bin_size=500"):
        soft = c.compressor.soft_threshold
        growth = [1, 1, 1] if soft else [1, 10, math.inf]  # hard LS: not finite at epoch 2
        rows = [{**base_row(e, 90.0 if soft else 10.0), "residue_min/w": -0.01 * growth[e],
                 "residue_max/w": 0.02 * growth[e], "sent_fraction/w": 0.01 if soft else 0.002}
                for e in range(3)]
        write_run(tmp_path, c, rows, "completed" if soft else "diverged",
                  provenance=provenance(MACHINE_A if soft else MACHINE_B))
        if soft:  # the same run on seed 1, its ranks out of sync: left out, and said so
            twin = OmegaConf.merge(c, {"seed": 1, "hydra": {"sweep": {"subdir": "twin"}}})
            write_run(tmp_path, twin, rows)
            summary = json.loads((tmp_path / "twin" / "summary.json").read_text())
            (tmp_path / "twin" / "summary.json").write_text(
                json.dumps({**summary, "params_in_sync": False}))
    out = tmp_path / "out"
    assert analysis.claims.main(["residues", str(tmp_path), "--out", str(out)]) == 0
    assert "residues: 2 runs" in capsys.readouterr().out
    assert "1 run(s) left out" in (out / "table.md").read_text()
    assert "2 runs, on 0f1e2d3c4b5a: AMD EPYC (AVX2) x2, cpu; a1b2c3d4e5f6: Intel Xeon " \
        "(AVX512) x2, cpu; commit 111111111111. Warning: the set of runs mixes 2 machines." \
        in (out / "table.md").read_text()
    assert (out / "residues.png").stat().st_size > 0
    assert len(pd.read_csv(out / "table.csv")) == 6  # data: one row per run and epoch
    table = (out / "table.md").read_text()
    assert "| 500 | hard LS | 0 | [-0.1, 0.2] (epoch 1) | 0.02 -> 0.2 | 10x | 2 | 0.0020 | " \
        "10.0 / 10.0 | diverged |" in table
    assert "| 500 | soft threshold | 0 | [-0.01, 0.02] (epoch 2) | 0.02 -> 0.02 | 1x | - |" in table


def test_overlap_analysis_averages_layers_per_epoch(tmp_path):
    from analysis import claims_overlap

    for c in claim_runs("overlap", "method=batch512"):
        rows = [{**base_row(e, 50.0), "overlap/a": 0.5, "overlap/b": 0.7 + 0.1 * e,
                 "overlap_batch/a": 0.9, "overlap_batch/b": 0.95, "overlap_model": 0.4,
                 "overlap_batch_model": 0.8 + 0.1 * e} for e in range(2)]
        write_run(tmp_path, c, rows)
    frames = analysis.claims.load_sweep(tmp_path, "claim_overlap")
    points = claims_overlap.data(frames)
    pairs = points[points["kind"] == "worker vs worker"]
    assert pairs["mean"].tolist() == pytest.approx([0.6, 0.65])
    assert pairs["min"].tolist() == pytest.approx([0.5, 0.5])
    assert pairs["model"].tolist() == pytest.approx([0.4, 0.4])
    assert "| 32 | worker vs global batch | 0 | 0.925 | 0.925 | 0.925 | 0.900 | 0.50 | 0.850 " \
        "| 2 |" in claims_overlap.table(frames)


# ---- the claims' figures as a reader sees them (tests/figure_checks.py) ---------------------
def claim_rows(name: str, c, seed: int) -> list[dict]:
    """Plausible epoch rows of run ``c`` of claim ``name`` (the keys its analysis reads)."""
    method, epochs = str(c.method), int(c.trainer.epochs)
    rows = []
    for e in range(epochs):
        accuracy = 10 + 80 * (1 - math.exp(-e / 4)) - 3 * seed - (20 if "4096" in method
                                                                 else 0)
        row = base_row(e, accuracy, bits=1e6 * (2 if "0.99" in method else 1))
        if name == "residues":
            soft = c.compressor.soft_threshold
            grow = 1.0 if soft else 10.0 ** min(e, 6)
            row.update({"residue_min/w": -0.01 * grow * (seed + 1), "residue_max/w": 0.02 * grow,
                        "sent_fraction/w": 0.01})
        elif name == "fig2b":
            row["level/w"] = 4 if method == "rank4" else 1
        elif name == "overlap":
            row.update({"overlap/a": 0.3 + 0.01 * e, "overlap/b": 0.2, "overlap_model": 0.35,
                        "overlap_batch/a": 0.5, "overlap_batch/b": 0.6 - 0.01 * seed,
                        "overlap_batch_model": 0.55, "batch_size": int(c.trainer.batch_size)})
        elif name == "batch" and method.startswith("accordion"):
            row["critical/w"] = float(e < 3 or (e + seed) % 5 == 0)
        rows.append(row)
    return rows


@pytest.mark.parametrize("name", CLAIMS)
def test_every_claim_figure_reads_cleanly(name, tmp_path):
    """Three seeds of every run of the claim's sweep: no overlapping tick labels, no legend over
    a panel or wider than the panels, human axis labels, whole epochs, one legend entry per
    line (not per seed)."""
    for c in claim_runs(name):
        for seed in (0, 1, 2):
            run = OmegaConf.merge(c, {"seed": seed, "hydra": {"sweep": {
                "subdir": f"{c.hydra.sweep.subdir}-{seed}"}}})
            write_run(tmp_path, run, claim_rows(name, run, seed))
    claim = analysis.claims.module(name)
    frames = analysis.claims.load_sweep(tmp_path, claim.SWEEP, keep=claim.KEEP)
    fig = claim.plot(frames)
    assert problems(fig) == []
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels and len(labels) == len(set(labels))
