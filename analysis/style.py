"""The one look of every figure the suite draws: the reports' figures (:mod:`analysis.figures`),
the claims' (``analysis/claims_*.py``), the zoo's and the automatic endpoints'.

- :func:`subplots` starts a figure in the suite's theme and sizes (a panel is
  :data:`PANEL_WIDTH` x :data:`PANEL_HEIGHT` inches, at most :data:`MAX_COLUMNS` to a row);
  :func:`save` writes it at :data:`DPI`;
- :func:`label` turns a metric key (``test/accuracy``) into an axis label (``test accuracy (%)``);
- :class:`Looks` gives every method one colour and marker (the same in every figure drawn with
  the same methods) and every variant one line and fill style, and names them in legends;
- :func:`legend_below` puts one legend under a figure's panels, in as many columns as its width
  holds, so that no legend covers data or takes a panel's width;
- :func:`count_axis`, :func:`epoch_axis` and :func:`band` keep tick labels short and apart
  (``6M`` rather than ``6 x 10^6``; log scale only where the values span a decade or more;
  whole epochs) and draw a mean with its spread over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    EngFormatter,
    FormatStrFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
)
from matplotlib.transforms import Bbox  # noqa: E402

from analysis.tables import METRIC_NAMES  # noqa: E402

THEME = {"context": "paper", "style": "whitegrid", "palette": "colorblind", "font_scale": 1.0}
PANEL_WIDTH, PANEL_HEIGHT, MAX_COLUMNS = 4.2, 3.0, 3  # inches; panels to a row
DPI = 150
BAND_ALPHA = 0.2  # a spread over seeds
MARKS = 10  # about as many markers on a line, whatever its number of points
STRIP = 0.05  # the height of a strip of shaded epochs (axes fraction)
LOG_SPAN = 10.0  # an axis goes log where its largest value is at least this times its smallest
ORDER = (0, 1, 2, 4, 3, 9, 5, 7, 6, 8)  # blue, orange, green, purple, vermilion, sky, ...
MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 markers, 10 colours: 70 distinct pairs
DASHES = {"ours": "-", "authors": "--"}  # other variants: the next of MORE_DASHES
MORE_DASHES = (":", "-.", (0, (5, 1, 1, 1, 1, 1)))
FILLS = {"ours": "full"}  # other variants: hollow markers
LABELS = {"epoch": "epoch", "train/loss": "training loss", "lr": "learning rate",
          "batch_size": "global batch size", "comm/bits": "data sent per worker (bits)",
          "time/epoch_s": "training time per epoch (s)"}


def label(key: str, prefix: str = "") -> str:
    """The axis label of a metric key: ``test/accuracy`` -> ``test accuracy (%)``, with
    ``prefix`` before it (``final test accuracy (%)``); an unknown key with its ``/`` and ``_``
    as spaces."""
    if key in LABELS:
        text = LABELS[key]
    elif key in METRIC_NAMES:
        text = f"{key.split('/')[0]} {METRIC_NAMES[key]}"
    else:
        text = key.replace("/", " ").replace("_", " ")
    return f"{prefix} {text}" if prefix else text


def colors(n: int) -> list[tuple[float, float, float]]:
    """``n`` discrete colours: the colour-blind palette's ten (in :data:`ORDER`: the first few
    far apart); beyond ten series, ``n`` hues evenly around the wheel at three lightnesses in
    turn, so that the nearest hues (the last and the first too) also differ in lightness (a
    golden-ratio turn between neighbours put the 1st and the 9th of fifteen on one hue and one
    lightness)."""
    base = sns.color_palette(THEME["palette"], 10)
    if n <= len(base):
        return [base[i] for i in ORDER][:n]
    return [sns.husl_palette(1, h=i / n, l=(0.45, 0.62, 0.78)[i % 3])[0] for i in range(n)]


class Looks:
    """The colour and marker of each method and the line and fill style of each variant.

    Methods take colours and markers in the order given, so the same list gives the same looks
    in every figure; no two methods share both a colour and a marker."""

    def __init__(self, methods: Iterable[str], variants: Iterable[str] = ()) -> None:
        self.methods = list(dict.fromkeys(methods))
        palette = colors(len(self.methods))
        self.color = {m: palette[i] for i, m in enumerate(self.methods)}
        self.marker = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(self.methods)}
        others = [v for v in dict.fromkeys(variants) if v not in DASHES]
        self.dash = {**DASHES, **{v: MORE_DASHES[i % len(MORE_DASHES)]
                                  for i, v in enumerate(others)}}

    def line(self, method: str, variant: str = "ours") -> dict[str, object]:
        """Keywords of ``Axes.plot`` for a method's line (its variant's dashes and fill)."""
        return {"color": self.color[method], "marker": self.marker[method],
                "linestyle": self.dash.get(variant, "-"),
                "fillstyle": FILLS.get(variant, "none"), "markersize": 5}

    def point(self, method: str, variant: str = "ours") -> dict[str, object]:
        """Keywords of ``Axes.plot`` for a method's points (no line)."""
        return {**self.line(method, variant), "linestyle": "none", "markersize": 6}

    def handle(self, method: str, variant: str = "ours", points: bool = False,
               text: str | None = None) -> Line2D:
        """A legend handle named ``text`` (default: the method), showing the method's line
        (``points``: only its marker)."""
        keywords = self.point(method, variant) if points else self.line(method, variant)
        return Line2D([], [], label=text or method, **keywords)


def band_handle(text: str = "±1 std over seeds") -> Patch:
    """The legend entry of a spread band."""
    return Patch(color="grey", alpha=BAND_ALPHA * 1.5, label=text)


def strip_handle(color: object, text: str) -> Patch:
    """The legend entry of a strip of shaded epochs (:func:`epoch_strips`) in ``color``."""
    return Patch(color=color, alpha=_strip_alpha(1.0), label=text)


def _strip_alpha(share: float) -> float:
    return 0.15 + 0.6 * share


def epoch_strips(ax: plt.Axes, strips: Sequence[tuple[object, pd.Series]]) -> None:
    """Strips along the bottom of ``ax``, one per (colour, share per epoch), each epoch shaded
    darker the higher its share (none at 0): the y range grows downwards to hold them under the
    data, so that they cover no line and no two colours mix."""
    if not strips:
        return
    low, high = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    room = STRIP * len(strips)
    ax.set_ylim(low - (high - low) * room / (1 - room), high)
    ax.set_yticks(ticks)  # none beside the strips
    for row, (color, shares) in enumerate(strips):
        for epoch, share in shares.items():
            if share > 0:
                ax.axvspan(epoch - 0.5, epoch + 0.5, ymin=row * STRIP, ymax=(row + 1) * STRIP,
                           color=color, alpha=_strip_alpha(share), lw=0)


def subplots(panels: int, rows: int = 1, height: float = PANEL_HEIGHT,
             width: float = PANEL_WIDTH, **kwargs: object) -> tuple[plt.Figure, np.ndarray]:
    """A figure of ``panels`` panels (each ``rows`` axes tall) in the suite's theme, at most
    :data:`MAX_COLUMNS` to a row; ``axes`` is 2-D, unused axes hidden; ``kwargs`` go to
    ``plt.subplots`` (``sharey``, ...)."""
    sns.set_theme(**THEME)
    columns = max(1, min(panels, MAX_COLUMNS))
    lines = max(1, math.ceil(panels / columns))
    fig, axes = plt.subplots(lines * rows, columns, squeeze=False,
                             figsize=(width * columns, height * lines * rows), **kwargs)
    for index in range(panels, lines * columns):
        for row in range(rows):
            axes[(index // columns) * rows + row, index % columns].set_visible(False)
    return fig, axes


def legend_below(fig: plt.Figure, handles: Sequence[Artist]) -> Legend | None:
    """One legend for the whole figure, under its panels, in as many columns as fit the
    panels' width (call after ``tight_layout``); None without handles."""
    if not handles:
        return None
    renderer = fig.canvas.get_renderer()
    width = Bbox.union([ax.bbox for ax in fig.axes if ax.get_visible()]).width
    for columns in range(len(handles), 0, -1):
        legend = fig.legend(handles=list(handles), loc="upper center",
                            bbox_to_anchor=(0.5, 0.0), ncol=columns, frameon=False)
        if columns == 1 or legend.get_window_extent(renderer).width <= width:
            return legend
        legend.remove()
    return None


def axis_of(ax: plt.Axes, which: str) -> matplotlib.axis.Axis:
    """``ax.xaxis`` or ``ax.yaxis``."""
    return ax.xaxis if which == "x" else ax.yaxis


def count_axis(ax: plt.Axes, which: str, values: Iterable[float], unit: str = "",
               plain: bool = False) -> None:
    """An axis of counts (bits, floats, bytes) with short SI tick labels (``6M``, ``20k``; or
    ``plain`` numbers, ``0.2``, for ratios): log scale where the positive values span
    :data:`LOG_SPAN` or more, with major ticks at 1-2-5 steps (at 1 over more than two
    decades) and unlabelled minor ones."""
    axis = axis_of(ax, which)
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if finite and max(finite) >= LOG_SPAN * min(finite):
        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        decades = math.log10(max(finite) / min(finite))
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2
                                          else (1.0,)))
        axis.set_minor_formatter(NullFormatter())
    else:
        axis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(FormatStrFormatter("%g") if plain
                             else EngFormatter(unit=unit, sep=""))


def value_axis(ax: plt.Axes, which: str, values: Iterable[float]) -> None:
    """An axis of the few values a setting took (batch sizes 512 and 4096): log2 scale, one
    labelled tick at each value and no other."""
    shown = sorted({float(v) for v in values if math.isfinite(v) and v > 0})
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis = axis_of(ax, which)
    axis.set_ticks(shown, [f"{v:g}" for v in shown])
    axis.set_ticks([], minor=True)


def epoch_axis(ax: plt.Axes, which: str = "x") -> None:
    """Whole epochs only (one tick where one epoch is in view), at most about eight."""
    axis_of(ax, which).set_major_locator(MaxNLocator(nbins=8, integer=True, min_n_ticks=1))


def band(ax: plt.Axes, data: pd.DataFrame, x: str, y: str, look: dict[str, object],
         label_text: str | None = None) -> bool:
    """The mean of ``y`` over the rows of each ``x`` (one per seed) as a line in ``look``, with
    a band of ±1 standard deviation (n - 1) where there are two seeds or more; whether a band
    was drawn."""
    stats = data.groupby(x)[y].agg(["mean", "std", "count"]).sort_index()
    ax.plot(stats.index, stats["mean"], label=label_text,
            markevery=max(1, len(stats) // MARKS), **look)
    spread = stats[stats["count"] > 1]
    if spread.empty:
        return False
    ax.fill_between(spread.index, spread["mean"] - spread["std"], spread["mean"] + spread["std"],
                    color=look["color"], alpha=BAND_ALPHA, lw=0)
    return True


def save(fig: plt.Figure, paths: Iterable[Path]) -> None:
    """Write ``fig`` to each path (its format from the suffix) at :data:`DPI`, cropped to what
    it draws, and close it."""
    for path in paths:
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
