"""The report's figures as a reader sees them (analysis/figures.py, analysis/style.py): drawn
from hand-written run records shaped like a tiny Table 1 and Table 5 (two seeds, eight epochs,
Accordion ours and as the authors ran it), then measured with tests/figure_checks.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from matplotlib.colors import to_rgba

from analysis import figures, reference, style
from analysis.load import Frames, load_records
from tests.analysis_fixture import epoch_row, write_record
from tests.figure_checks import problems, tick_labels

EPOCHS, SEEDS = 8, (0, 1)
LAYERS = [f"layer{b}.{i}.conv{c}.weight" for b in (1, 2, 3) for i in (0, 1) for c in (1, 2)]
# method -> floats one worker sends per epoch: 5.9M .. 10.6M in all, less than a decade
FLOATS = {"rank2": 1.32e6, "rank1": 0.74e6, "accordion_rank2_rank1": 0.98e6}
ACCORDION = {"name": "accordion", "eta": 0.5, "low": 2, "high": 1, "interval": 2}


def _levels(epoch: int, seed: int, variant: str) -> dict[str, float]:
    """Per layer: the rank (2 while critical), 0/1 critical, and at check epochs the ratio."""
    row = {}
    for i, layer in enumerate(LAYERS):
        critical = epoch < 2 or (i + epoch + seed) % 3 == 0
        row[f"level/{layer}"] = 2 if critical else 1
        row[f"critical/{layer}"] = float(critical)
        if epoch % 2 == 1:  # authors' ratios run higher: the panels' own ranges would differ
            scale = 1.6 if variant == "authors" else 0.7
            row[f"ratio/{layer}"] = scale * ((i * 7 + epoch + seed) % 10) / 10
    return row


def _table1(root: Path) -> None:
    groups = [("rank2", "ours", {}), ("rank1", "ours", {}),
              ("accordion_rank2_rank1", "ours", ACCORDION),
              ("accordion_rank2_rank1", "authors", ACCORDION)]
    for method, variant, scheduler in groups:
        for seed in SEEDS:
            rows = []
            for epoch in range(EPOCHS):
                accuracy = 10 + 70 * (1 - math.exp(-epoch / 3)) + 2 * seed \
                    - (5 if method == "rank1" else 0)
                row = epoch_row(epoch, accuracy, bits=32 * FLOATS[method] * (1 + 0.01 * seed))
                if scheduler:
                    row.update(_levels(epoch, seed, variant))
                rows.append(row)
            write_record(root, f"t1-{method}-{variant}-{seed}", {
                "sweep": "table1", "benchmark": "cifar10", "method": method, "variant": variant,
                "baseline": "rank2", "seed": seed, "scheduler": scheduler or {"name": "static"}},
                rows)


def _table5(root: Path) -> None:
    for method in ("batch512", "accordion_batch512_batch4096"):
        rows = []
        for epoch in range(EPOCHS):
            critical = method == "batch512" or epoch < 2 or epoch >= 6
            batch = 512 if critical else 4096
            row = {**epoch_row(epoch, 20 + 8 * epoch, bits=1e6 * 512 / batch),
                   "batch_size": batch, "lr": 0.1 * batch / 512}
            if method != "batch512":
                row.update({"critical/model": float(critical), "level/model": batch})
                if epoch % 2 == 1:
                    row["ratio/model"] = 0.2 + 0.1 * epoch
            rows.append(row)
        scheduler = {"name": "accordion_batch", "eta": 0.5} if method != "batch512" \
            else {"name": "static"}
        write_record(root, f"t5-{method}", {
            "sweep": "table5", "benchmark": "cifar10", "method": method,
            "baseline": "batch512", "compressor": {"name": "none"}, "scheduler": scheduler},
            rows)


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Frames]:
    """Each sweep's loaded frames."""
    root = tmp_path_factory.mktemp("figures")
    _table1(root)
    _table5(root)
    loaded = load_records(root)
    return {sweep: loaded.only(loaded.runs.loc[loaded.runs["sweep"] == sweep, "run_id"])
            for sweep in ("table1", "table5")}


def _draw(frames: Frames, name: str):
    """Figure ``name`` of ``frames`` as make_figures draws it: (data, figure)."""
    _, data_of, plot = figures.FIGURES[name]
    data = data_of(frames)
    return data, plot(data, figures.looks(frames.runs))


CASES = [("table1", "curves"), ("table1", "levels"), ("table1", "ratios"),
         ("table1", "cumulative"), ("table1", "pareto"), ("table5", "curves"),
         ("table5", "ratios"), ("table5", "batch"), ("table5", "cumulative")]


@pytest.mark.parametrize(("sweep", "name"), CASES)
def test_every_report_figure_reads_cleanly(frames, sweep, name):
    """No overlapping tick labels, no legend over a panel or wider than the panels, human axis
    labels, whole epochs."""
    _, fig = _draw(frames[sweep], name)
    assert problems(fig) == []


def test_the_authors_curves_figure_reads_cleanly(frames):
    table1 = frames["table1"]
    runs = table1.runs.assign(scale="paper", **{"dataset.name": "cifar10"})
    data = figures.official_data(Frames(runs, table1.epochs, table1.problems),
                                 reference.load_curves())
    assert problems(figures.plot_official(data, figures.looks(runs))) == []


def test_curves_give_each_group_its_own_look_and_name_every_shading(frames):
    _, fig = _draw(frames["table1"], "curves")
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:4] == ["rank2", "rank1", "accordion_rank2_rank1 (authors)",
                          "accordion_rank2_rank1"]
    looks = [(to_rgba(h.get_color()), h.get_linestyle(), h.get_marker())
             for h in legend.legend_handles[:4]]
    assert len(set(looks)) == 4
    assert "±1 std over seeds" in labels
    assert [t.split(":")[0] for t in labels if "critical epochs" in t] == [
        "accordion_rank2_rank1 (authors)", "accordion_rank2_rank1"]
    assert fig.axes[0].get_ylabel() == "test accuracy (%)"
    # the strips lie under the data: no line enters them
    ax = fig.axes[0]
    lowest = min(line.get_ydata().min() for line in ax.get_lines())
    assert ax.get_ylim()[0] + 2 * style.STRIP * (ax.get_ylim()[1] - ax.get_ylim()[0]) <= lowest


def test_levels_are_discrete_colours_with_a_legend_of_levels(frames):
    data, fig = _draw(frames["table1"], "levels")
    assert set(data["level"]) == {1, 2}
    assert len(fig.axes) == data["group"].nunique()  # no colour bar
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["rank 1", "rank 2"]
    labels = [text for text, _ in tick_labels(fig.axes[0].xaxis)]
    assert all(label.isdigit() for label in labels) and len(labels) <= 9


def test_ratio_panels_share_their_y_range_and_name_both_regimes(frames):
    _, fig = _draw(frames["table1"], "ratios")
    assert len({ax.get_ylim() for ax in fig.axes}) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["ratio ≥ η: the next interval critical",
                      "ratio < η: the next interval not critical", "η = 0.5"]


def test_one_check_epoch_is_labelled_as_one_whole_epoch(frames):
    """Three epochs, interval 2: every ratio at epoch 1 (caught: ticks 0.76, 0.84, ...)."""
    table1 = frames["table1"]
    short = Frames(table1.runs, table1.epochs[table1.epochs["epoch"] < 3], table1.problems)
    _, fig = _draw(short, "ratios")
    assert problems(fig) == []
    assert [text for text, _ in tick_labels(fig.axes[0].xaxis)] == ["1"]


def test_pareto_labels_a_narrow_range_of_data_in_short_units(frames):
    _, fig = _draw(frames["table1"], "pareto")
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"  # 5.9M .. 10.6M: less than a decade
    assert all(text.endswith("M") for text, _ in tick_labels(ax.xaxis))
    assert ax.get_ylabel() == "final test accuracy (%)"


def test_a_count_axis_goes_log_over_a_decade_with_short_labels():
    fig, axes = style.subplots(1)
    ax = axes[0, 0]
    ax.plot([3e5, 4e7], [1, 2])
    style.count_axis(ax, "x", [3e5, 4e7])
    assert ax.get_xscale() == "log"
    assert problems(fig) == []
    assert {text for text, _ in tick_labels(ax.xaxis)} >= {"1M", "10M"}


def test_labels_of_metric_keys():
    assert style.label("test/accuracy") == "test accuracy (%)"
    assert style.label("test/perplexity", "final") == "final test perplexity"
    assert style.label("batch_size") == "global batch size"
    assert style.label("auto/noise_scale") == "auto noise scale"


def test_looks_never_repeat_a_colour_and_marker_pair():
    methods = [f"m{i}" for i in range(30)]
    looks = style.Looks(methods)
    pairs = {(looks.color[m], looks.marker[m]) for m in methods}
    assert len(pairs) == 30
    assert style.Looks(["a", "b"]).color["b"] == style.Looks(["a", "b", "c"]).color["b"]


def test_run_groups_take_their_looks_in_table_order(frames):
    """The baseline first, Accordion last, the authors' variant named and dashed."""
    looks = figures.looks(frames["table1"].runs)
    assert looks.methods == ["rank2", "rank1", "accordion_rank2_rank1 (authors)",
                             "accordion_rank2_rank1"]
    assert looks.line("accordion_rank2_rank1 (authors)", "authors")["linestyle"] == "--"
    assert looks.line("rank1")["linestyle"] == "-"
