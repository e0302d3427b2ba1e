"""The zoo (conf/sweep/zoo.yaml, analysis/zoo.py): the sweep is generated from the registry and
composes into every compressor's light / heavy / Accordion runs; the report, on hand-written run
records, ranks them, models the time over the link and answers the recovery question."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

import compression
from analysis import zoo
from core import record
from jobs import sweeps
from tests.conftest import CONF, ROOT
from tests.figure_checks import problems
from training.config import validate


def zoo_runs(*arguments: str) -> list:
    """The zoo's runs at tiny scale (filtered by ``arguments``), composed as the sweeper does."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["sweep=zoo", "scale=tiny"], return_hydra_config=True)
        todo = sweeps.expand(cfg.hydra.sweeper.groups, cfg.hydra.sweeper.params,
                             ["sweep=zoo", "scale=tiny", *arguments], "tiny")
        return [compose("config", overrides=j, return_hydra_config=True) for j in todo]


def test_the_sweep_file_is_the_registry_s() -> None:
    assert (CONF / "sweep" / "zoo.yaml").read_text() == zoo.sweep_text(), \
        "conf/sweep/zoo.yaml is stale: run `make zoo-sweep`"
    assert "reproduce-zoo:" in (ROOT / "Makefile").read_text()


@pytest.mark.slow
def test_every_compressor_runs_light_heavy_and_accordion_in_distinct_directories(tmp_path):
    runs = zoo_runs("seed=0", "benchmark=cifar10")
    dirs = {Path(str(c.hydra.sweep.dir)) / str(c.hydra.sweep.subdir) for c in runs}
    assert len(dirs) == len(runs)
    seen = {}
    for c in runs:
        seen.setdefault(c.compressor.name, {})[c.method] = c
    assert set(seen) == set(compression.available())
    for name, methods in seen.items():
        levels = compression.create(name).accordion_levels
        if levels is None:
            assert set(methods) == {name} and methods[name].scheduler.name == "static"
            continue
        roles = {"dgc-warmup"} if name == "dgc" else set()
        assert set(methods) == {f"{name}-{r}" for r in zoo.ROLES} | roles
        assert list(methods[f"{name}-light"].scheduler.levels) == [levels[0]]
        assert list(methods[f"{name}-heavy"].scheduler.levels) == [levels[1]]
        accordion = methods[f"{name}-accordion"].scheduler
        assert (accordion.name, accordion.low, accordion.high) == ("accordion", None, None)
        task = methods[f"{name}-accordion"]
        validate(OmegaConf.masked_copy(task, [k for k in task if k != "hydra"]), world_size=2,
                 run_dir=tmp_path)
    for sign in ("signsgd", "signum"):
        assert seen[sign][sign].optimizer.momentum == 0.0
        assert seen[sign][sign].optimizer.lr == zoo.SIGN_OPTIMIZER["optimizer.lr"]


# ---- the report, on hand-written run records --------------------------------------------------
T0 = 2.0            # the none run's seconds per epoch: the compute
DENSE = 32e6        # comm/bits_dense per epoch
EPOCHS = 4
# Final accuracies by method and seed; every run climbs to it linearly from 40 (epoch 0).
FINAL = {"none": (90.0, 91.0, 89.0), "qsgd-light": (88.0, 88.5, 87.5),
         "qsgd-heavy": (80.0, 81.0, 79.0), "qsgd-accordion": (88.1, 88.4, 87.6),
         "terngrad-light": (85.0, 85.5, 84.5), "terngrad-heavy": (84.0, 84.2, 84.1),
         "terngrad-accordion": (80.0, 80.5, 79.8)}
BITS = {"none": 32e6, "qsgd-light": 10e6, "qsgd-heavy": 4e6, "qsgd-accordion": 7e6,
        "terngrad-light": 4e6, "terngrad-heavy": 2e6, "terngrad-accordion": 3e6}
EPOCH_S = {"none": T0, "qsgd-light": 2.4, "qsgd-heavy": 2.2, "qsgd-accordion": 2.3,
           "terngrad-light": 2.1, "terngrad-heavy": 2.1, "terngrad-accordion": 2.1}


def accuracies(final: float) -> list[float]:
    return [40 + (final - 40) * e / (EPOCHS - 1) for e in range(EPOCHS)]


def write_records(root: Path, seeds: tuple[int, ...] = (0, 1, 2),
                  compressors: str = "none,qsgd,terngrad",
                  final: dict[str, tuple[float, ...]] = FINAL,
                  provenance: dict | None = None,
                  methods: str = "zoo_fixed,zoo_light,zoo_heavy,zoo_accordion") -> None:
    """Run records as run.py leaves them (.hydra/config.yaml, metrics.jsonl, summary.json);
    ``provenance``: the summary's (machine and commit), none by default."""
    configs = zoo_runs("seed=0", "benchmark=cifar10", f"compressor={compressors}",
                       f"method={methods}")
    for base in configs:
        method = str(base.method)
        for seed in seeds:
            cfg = copy.deepcopy(base)
            with open_dict(cfg):
                cfg.seed = seed
            run_dir = root / str(cfg.hydra.sweep.subdir)
            (run_dir / ".hydra").mkdir(parents=True)
            task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            OmegaConf.save(task, run_dir / ".hydra" / "config.yaml", resolve=True)
            rows = [{"epoch": e, "test/accuracy": acc, "comm/bits": BITS[method],
                     "comm/wire_bits": 2 * BITS[method] if method != "none" else DENSE,
                     "comm/bits_dense": DENSE, "time/epoch_s": EPOCH_S[method], "lr": 0.1}
                    for e, acc in enumerate(accuracies(final[method][seed]))]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            summary = record.summarize(rows, "completed", "test/accuracy", 1.0)
            if provenance:
                summary["provenance"] = provenance
            (run_dir / "summary.json").write_text(json.dumps(summary))


EARLIER_MACHINE = {"fingerprint": "0e0df49c5009", "machine": "an earlier machine",
                   "git": {"commit": "d0ec50ad10b9" * 3, "dirty": False}}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    write_records(root / "runs", provenance=EARLIER_MACHINE)
    zoo.main(["report", str(root / "runs"), "--scale", "tiny", "--out", str(root / "out")])
    return root / "out"


def test_the_leaderboard_ranks_by_final_metric(reported: Path) -> None:
    board = pd.read_csv(reported / "leaderboard.csv")
    means = {m: sum(v) / 3 for m, v in FINAL.items()}
    assert board["method"].tolist() == sorted(means, key=means.get, reverse=True)
    assert board["rank"].tolist() == list(range(1, 8))
    row = board.set_index("method").loc["qsgd-accordion"]
    assert row["gbit"] == pytest.approx(EPOCHS * 7e6 / 1e9)
    assert row["wire_gbit"] == pytest.approx(EPOCHS * 14e6 / 1e9)
    assert row["final_std"] == pytest.approx(pd.Series(FINAL["qsgd-accordion"]).std())
    # Over the link: measured epoch + 4 x t0 x wire / dense.
    link = 2.3 + zoo.RATIO * T0 * 14e6 / DENSE
    assert row["link_epoch_s"] == pytest.approx(link)
    # It reaches qsgd-light's final in the last epoch for seeds 0 and 2; seed 1 (88.4 < 88.5) never.
    assert row["tta_s"] == pytest.approx(EPOCHS * link) and row["reached"] == 2
    assert ("| 2 | qsgd-accordion | 88.03 ± 0.40 | 0.028 | 0.056 | 2.30 | 5.80 | "
            "23.2 (2 of 3 seeds) | 3 |") in (reported / "leaderboard.md").read_text()
    assert (reported / "pareto.png").stat().st_size > 10_000


def test_the_recovery_answers_with_intervals_over_seeds(reported: Path) -> None:
    answers = pd.read_csv(reported / "recovery.csv").set_index("compressor")
    assert answers.loc["qsgd", "answer"] == "yes"
    assert answers.loc["terngrad", "answer"] == "no: loses accuracy"
    diffs = [a - b for a, b in zip(FINAL["qsgd-accordion"], FINAL["qsgd-light"], strict=True)]
    mean = sum(diffs) / 3
    half = 4.303 * pd.Series(diffs).std() / math.sqrt(3)
    got = [float(x) for x in answers.loc["qsgd", "accordion_minus_light"].strip("()").split(",")]
    assert got == pytest.approx([mean, mean - half, mean + half])
    text = (reported / "recovery.md").read_text()
    assert "| cifar10 |" not in text and "| resnet18 | qsgd |" in text


def test_the_recovery_needs_fewer_bits_and_two_seeds() -> None:
    assert zoo.answer((0.1, -0.2, 0.4), (0.7, 0.6, 0.8), 1.12) == "yes"
    assert zoo.answer((-0.1, -0.4, 0.2), (0.7, 0.6, 0.8), 1.12) == "yes"  # within the margin
    assert zoo.answer((-0.1, -0.4, 0.2), (0.7, 0.6, 0.8), 0.0).startswith("can't tell")
    assert zoo.answer((0.1, -0.2, 0.4), (0.95, 0.9, 1.02), 1.12) == "no: not fewer bits"
    assert zoo.answer((-2.0, -2.5, -1.5), (0.7, 0.6, 0.8), 1.12) == "no: loses accuracy"
    assert zoo.answer((-1.0, -1.5, -0.5), (0.7, 0.6, 0.8), 1.12).startswith("can't tell")
    assert zoo.answer((-1.2, -1.5, -1.12), (0.7, 0.6, 0.8), 1.12) == "no: loses accuracy"
    assert zoo.answer((0.1, math.nan, math.nan), (0.7, math.nan, math.nan), 0).startswith("n/a")
    assert zoo.interval(pd.Series([1.0, 2.0, 3.0])) == pytest.approx(
        (2.0, 2.0 - 4.303 / math.sqrt(3), 2.0 + 4.303 / math.sqrt(3)))


def test_a_lower_is_better_metric_ranks_lowest_first() -> None:
    numbers = pd.DataFrame({
        "model.name": ["lstm"] * 4, "method": ["a", "a", "b", "b"], "metric": "test/perplexity",
        "compressor.name": ["a", "a", "b", "b"], "role": "fixed", "final": [90.0, 92.0, 80.0, 81.0],
        "bits": 1.0, "wire": 1.0, "epoch_s": 1.0, "link_epoch_s": 1.0, "tta_s": 1.0})
    assert zoo.leaderboard(numbers)["method"].tolist() == ["b", "a"]


def test_the_pareto_figure_reads_cleanly_with_every_compressor() -> None:
    """Every registered compressor on both models: no overlapping tick labels, no legend over
    a panel, human axis labels; each compressor its own colour and one legend entry, each role
    (light, heavy, Accordion, one run, DGC's warm-up) named."""
    rows = []
    for model, metric, base in (("resnet18", "test/accuracy", 90.0),
                                ("lstm", "test/perplexity", 120.0)):
        for i, name in enumerate(compression.available()):
            roles = ("light", "heavy", "accordion") if name in compression.with_levels() \
                else ("fixed",)
            roles += ("warmup",) if name == "dgc" else ()
            for j, role in enumerate(roles):
                rows.append({"model": model, "compressor": name, "role": role, "metric": metric,
                             "gbit": 0.01 * (i + 1) * (4 - j), "final": base - i - j,
                             "final_std": 0.5})
    fig = zoo.pareto(pd.DataFrame(rows))
    assert problems(fig) == []
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    names = compression.available()
    assert labels[:len(names)] == names
    assert labels[len(names):] == ["light level", "heavy level", "Accordion between them",
                                   "no levels: one run", "DGC's warm-up"]
    colours = [h.get_color() for h in fig.legends[0].legend_handles[:len(names)]]
    assert len({tuple(c) for c in colours}) == len(names)
    assert [ax.get_ylabel() for ax in fig.axes] == ["final test perplexity",
                                                    "final test accuracy (%)"]


def test_the_report_says_which_runs_it_is_of_and_which_are_not_run_yet(reported: Path) -> None:
    head = (reported / "leaderboard.md").read_text().split("\n")[0]
    assert f"21 of its {len(zoo.groups()) * 3} runs" in head
    missing = head.split("Not run yet: ")[1]
    resnet, lstm = missing.split("; lstm: ")
    assert "topk-light" in resnet and "dgc-warmup" in resnet and "lstm-" not in lstm
    assert not {"none", "qsgd-light", "terngrad-accordion"} & set(
        resnet.removeprefix("resnet18: ").split(", "))
    assert "qsgd-light" in lstm
    assert head == (reported / "recovery.md").read_text().split("\n")[0]


def test_a_missing_seed_is_named_with_its_method() -> None:
    numbers = pd.DataFrame({"model.name": "lstm", "method": ["qsgd-light"] * 2 + ["none"],
                            "seed": [0, 2, 1]})
    lstm = zoo.not_run(numbers)["lstm"]
    assert "qsgd-light (seed 1)" in lstm and "none (seeds 0, 2)" in lstm
    assert "qsgd-heavy" in lstm and "resnet18" in zoo.not_run(numbers)


def test_without_the_none_run_the_link_s_times_are_not_available_rather_than_never(
        tmp_path: Path) -> None:
    write_records(tmp_path / "runs")
    for seed_dir in (tmp_path / "runs").rglob("seed*"):
        if "/none/" in str(seed_dir):
            (seed_dir / "summary.json").unlink()
            (seed_dir / "metrics.jsonl").unlink()
    zoo.main(["report", str(tmp_path / "runs"), "--scale", "tiny", "--out", str(tmp_path / "out")])
    row = next(line for line in (tmp_path / "out" / "leaderboard.md").read_text().splitlines()
               if "| qsgd-light |" in line)
    assert row.count(zoo.NO_COMPUTE) == 2 and "never" not in row


# ---- --keep: finishing a sweep whose earlier records are gone ----------------------------------
NEW_MACHINE = {"fingerprint": "0123456789ab", "machine": "a test machine",
               "git": {"commit": "feedc0de" * 5, "dirty": False}}


def report_with_earlier(tmp_path: Path, earlier: Path, final: dict = FINAL) -> Path:
    """The none and QSGD runs again (on NEW_MACHINE), reported with ``--keep earlier``."""
    write_records(tmp_path / "runs", compressors="none,qsgd", final=final,
                  provenance=NEW_MACHINE)
    out = tmp_path / "out"
    assert zoo.main(["report", str(tmp_path / "runs"), "--scale", "tiny", "--out", str(out),
                     "--keep", str(earlier)]) == 0
    return out


def legacy_copy(reported: Path, to: Path) -> Path:
    """The report as one made before the ``made`` column (its heading alone says it)."""
    to.mkdir()
    for name in ("leaderboard.csv", "recovery.csv"):
        pd.read_csv(reported / name).drop(columns="made").to_csv(to / name, index=False)
    (to / "leaderboard.md").write_text((reported / "leaderboard.md").read_text())
    return to


def test_keep_ranks_the_earlier_report_s_rows_the_runs_lack_with_theirs(reported: Path,
                                                                         tmp_path: Path) -> None:
    earlier = legacy_copy(reported, tmp_path / "earlier")
    final = {**FINAL, "qsgd-light": tuple(v + 1 for v in FINAL["qsgd-light"])}
    out = report_with_earlier(tmp_path, earlier, final)
    board = pd.read_csv(out / "leaderboard.csv").set_index("method")
    means = {m: sum(v) / 3 for m, v in final.items()}
    assert board.index.tolist() == sorted(means, key=means.get, reverse=True)
    assert board["rank"].tolist() == list(range(1, 8))
    now, then = "feedc0defeed on 0123456789ab", "d0ec50ad10b9 on 0e0df49c5009"
    assert board["made"].to_dict() == {m: then if m.startswith("terngrad") else now
                                       for m in final}
    old = pd.read_csv(reported / "leaderboard.csv").set_index("method")
    kept = ["terngrad-light", "terngrad-heavy", "terngrad-accordion"]
    pd.testing.assert_frame_equal(board.loc[kept, old.columns.drop(["made", "rank"])],
                                  old.loc[kept, old.columns.drop(["made", "rank"])])
    answers = pd.read_csv(out / "recovery.csv").set_index("compressor")
    before = pd.read_csv(reported / "recovery.csv").set_index("compressor")
    assert answers.loc["terngrad", "accordion_minus_light"] == before.loc[
        "terngrad", "accordion_minus_light"]
    assert answers.loc["terngrad", "made"] == then and answers.loc["qsgd", "made"] == now
    head, table = (out / "leaderboard.md").read_text().split("\n\n")[:2]
    assert "--keep " + str(earlier) in head
    assert ("for the methods these runs lack: 3 methods' rows (9 runs, made by d0ec50ad10b9 "
            "on 0e0df49c5009): resnet18: ") in head
    assert "resnet18 none 90.0000 (earlier 90.0000, equal)" in head
    assert "resnet18 qsgd-light 89.0000 (earlier 88.0000)" in head
    assert "terngrad" not in head.split("Not run yet: ")[1].split("; lstm")[0]
    earlier_seeds = pd.read_csv(earlier / "leaderboard.csv").assign(
        seeds=lambda t: t["seeds"].where(t["method"] != "qsgd-heavy", 2))
    earlier_seeds.to_csv(earlier / "leaderboard.csv", index=False)
    assert "qsgd-heavy 80.0000 over 3 seeds (earlier 80.0000 over 2)" in (
        report_with_earlier(tmp_path / "again", earlier, final) / "leaderboard.md").read_text()
    assert "| made |" in (out / "leaderboard.md").read_text()
    assert "| made |" in (out / "recovery.md").read_text()


def test_keep_a_report_made_with_the_made_column_keeps_its_own(reported: Path,
                                                                tmp_path: Path) -> None:
    out = report_with_earlier(tmp_path, reported)
    board = pd.read_csv(out / "leaderboard.csv").set_index("method")
    assert board.loc["terngrad-light", "made"] == "d0ec50ad10b9 on 0e0df49c5009"
    assert (reported / "leaderboard.csv").is_file()  # the earlier report is only read


def test_keep_refuses_what_is_not_an_earlier_report(reported: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    write_records(tmp_path / "runs", compressors="none")
    argv = ["report", str(tmp_path / "runs"), "--scale", "tiny", "--out", str(tmp_path / "o")]
    assert zoo.main([*argv, "--keep", str(tmp_path / "nowhere")]) == 2
    assert "--keep: " in capsys.readouterr().err
    earlier = legacy_copy(reported, tmp_path / "earlier")
    (earlier / "leaderboard.md").write_text("a heading that names no machine\n")
    assert zoo.main([*argv, "--keep", str(earlier)]) == 2
    assert "does not say which commit and machine made it" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_keep_never_pairs_an_answer_across_the_two_reports(reported: Path,
                                                           tmp_path: Path) -> None:
    write_records(tmp_path / "runs", compressors="terngrad", methods="zoo_light")
    out = tmp_path / "out"
    zoo.main(["report", str(tmp_path / "runs"), "--scale", "tiny", "--out", str(out),
              "--keep", str(reported)])
    board = pd.read_csv(out / "leaderboard.csv").set_index("method")
    assert board.loc["terngrad-light", "made"] == "unknown on unknown"       # these runs'
    assert board.loc["terngrad-accordion", "made"] == "d0ec50ad10b9 on 0e0df49c5009"
    assert pd.read_csv(out / "recovery.csv")["compressor"].tolist() == ["qsgd"]
