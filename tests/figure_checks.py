"""What a reader stumbles on in a drawn figure, measured on the matplotlib figure itself (text
extents from its renderer): tick labels that overlap, legends that cover a panel or are wider
than the panels, raw metric keys (``test/accuracy``) or booleans as labels, fractional epochs."""

from __future__ import annotations

import re
from itertools import combinations

import matplotlib.pyplot as plt
from matplotlib.axis import Axis
from matplotlib.transforms import Bbox

RAW_KEY = re.compile(r"\b[a-z_]+/[a-z_]+\b")  # test/accuracy, comm/bits
SLACK = 1.0  # pixels two extents may share before they count as overlapping


def problems(fig: plt.Figure) -> list[str]:
    """Everything :mod:`tests.figure_checks` finds in ``fig``, one sentence each (empty: none)."""
    fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    found = []
    for ax in axes:
        where = ax.get_title() or f"axes {fig.axes.index(ax)}"
        for axis in (ax.xaxis, ax.yaxis):
            found += [f"{where}: tick labels {a!r} and {b!r} overlap"
                      for a, b in overlapping(tick_labels(axis))]
        for text in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()):
            if RAW_KEY.search(text):
                found.append(f"{where}: label {text!r} is a raw metric key")
        if ax.get_xlabel() == "epoch":
            found += [f"{where}: epoch tick {t!r} is not a whole epoch"
                      for t, _ in tick_labels(ax.xaxis) if not re.fullmatch(r"−?\d+", t)]
    legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend())]
    span = Bbox.union([ax.bbox for ax in axes])
    for legend in legends:
        box = legend.get_window_extent()
        found += [f"the legend covers {ax.get_title() or 'a panel'!r}" for ax in axes
                  if _overlap(box, ax.bbox)]
        if box.width > span.width + SLACK:
            found.append(f"the legend ({box.width:.0f} px) is wider than the panels "
                         f"({span.width:.0f} px)")
        found += [f"legend label {t.get_text()!r} is a bare boolean" for t in legend.get_texts()
                  if t.get_text() in ("True", "False")]
    return found


def tick_labels(axis: Axis) -> list[tuple[str, Bbox]]:
    """The drawn tick labels of ``axis`` (major and minor, in view, not empty): text, extent."""
    low, high = sorted(axis.get_view_interval())
    out = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        for text in (tick.label1, tick.label2):
            if (text.get_visible() and text.get_text() and low <= tick.get_loc() <= high):
                out.append((text.get_text(), text.get_window_extent()))
    return out


def overlapping(labels: list[tuple[str, Bbox]]) -> list[tuple[str, str]]:
    """The pairs of labels whose extents overlap."""
    return [(a, b) for (a, box_a), (b, box_b) in combinations(labels, 2)
            if _overlap(box_a, box_b)]


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK
            and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK)
