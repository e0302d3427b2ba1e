"""The papers' claims (``analysis/claims.yaml``) judged on run records: per claim, the values per
seed, their means, the effect with a 95% confidence interval over seeds and a verdict.

    claims = load_claims()                       # analysis/claims.yaml, checked
    rows = evaluate(load_records("results/runs", include_incomplete=True), claims)

A claim compares cell ``a`` with cell ``b`` (or ``a`` alone with its bound); a cell's values are
one per seed (:data:`METRICS`). The interval (:func:`interval`) is Student's t at 95%:

- paired, on the per-seed differences a_s - b_s over the seeds both cells ran (two or more):
  runs of one seed share the initial weights and the data order, so the pairing removes that
  part of the seed-to-seed spread; a seed only one cell ran has no partner and is left out (the
  seeds column names them);
- Welch's, on the two cells' means with Welch-Satterthwaite degrees of freedom, when fewer than
  two seeds are common (two or more runs each);
- one-sample, on the values of ``a``, for a claim about one cell.

``effect: ratio`` computes the same on the logarithms and reports exp() of the estimate and the
ends (a ratio of geometric means). The verdict (:func:`verdict`): ``reproduced`` when the whole
interval lies on the claimed side of the bound, ``not reproduced`` when it lies wholly on the
other side, ``inconclusive`` when it straddles the bound, and always with one seed (no interval).
The t quantile is ``scipy.stats.t.ppf`` (scipy comes with scikit-learn; pyproject names it).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from analysis import provenance, reference, tables
from analysis.claims_overlap import mean_overlap
from analysis.claims_residues import largest_residue
from analysis.load import Frames, usable
from core.errors import ConfigError, check_choice, check_number, check_str

CLAIMS_FILE = Path(__file__).resolve().parent / "claims.yaml"
VERSION = 1  # of the claims file's schema
CONFIDENCE = 0.95
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
SEEDS_LIMIT = 100  # seeds_needed looks no further
EFFECTS = ("difference", "ratio")
DIRECTIONS = ("<", ">")
REQUIRED = ("id", "claim", "sweep", "model", "a", "metric", "effect", "direction", "source")
OPTIONAL = ("b", "bound", "margin", "published", "published_source", "reference_table",
            "statuses", "scales")


def _run_stats(column: str) -> Callable[[Frames], pd.Series]:
    return lambda frames: tables.run_stats(frames).set_index("run_id")[column]


# metric -> per-run values (a Series indexed by run_id)
METRICS: dict[str, Callable[[Frames], pd.Series]] = {
    "final": _run_stats("final"),
    "best": _run_stats("best"),
    "bits": _run_stats("bits"),
    "conv_x": _run_stats("conv_x"),
    "fc_x": _run_stats("fc_x"),
    "residue_absmax": largest_residue,
    "overlap": lambda frames: mean_overlap(frames, "overlap"),
    "overlap_batch": lambda frames: mean_overlap(frames, "overlap_batch"),
}


# ---- the claims file ------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """The runs of one method and variant (of a claim's sweep and model)."""

    method: str
    variant: str = "ours"

    def label(self) -> str:
        """``rank1`` (variant ours) or ``rank1 (authors)``."""
        return self.method if self.variant == "ours" else f"{self.method} ({self.variant})"


@dataclass(frozen=True)
class Claim:
    """One comparison of the claims file (see its header)."""

    id: str
    claim: str
    sweep: str
    model: str
    a: Cell
    b: Cell | None
    metric: str
    effect: str
    direction: str
    bound: float
    margin: str | None
    published: float | str | None  # a number, "reference" or None
    published_source: str
    reference_table: str | None
    statuses: tuple[str, ...]
    scales: tuple[str, ...] | None
    source: str

    def statement(self) -> str:
        """``a - b > -1.12`` style: what must hold."""
        effect = self.a.label() if self.b is None else \
            f"{self.a.label()} {'-' if self.effect == 'difference' else '/'} {self.b.label()}"
        return f"{self.metric}: {effect} {self.direction} {self.bound:g}"


def own_verdicts(path: str | Path | None = None) -> dict[str, str]:
    """The sweeps that ask the suite's own questions rather than the papers' (the claims file's
    ``own_verdicts``): sweep -> the analysis that writes their verdicts."""
    document = yaml.safe_load(Path(path or CLAIMS_FILE).read_text())
    return dict(document.get("own_verdicts") or {})


def load_margins(path: str | Path | None = None) -> dict[str, float]:
    """The claims file's named margins (``margins``: name -> value), each with its source there."""
    path = Path(path) if path is not None else CLAIMS_FILE
    return _margins(yaml.safe_load(path.read_text()).get("margins") or {}, path)


def load_claims(path: str | Path | None = None) -> list[Claim]:
    """The claims of ``path`` (default :data:`CLAIMS_FILE`), templates expanded; a
    ConfigError (one line naming the file, the claim and the field) on anything malformed."""
    path = Path(path) if path is not None else CLAIMS_FILE
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"claims: cannot read {path}: {exc}".splitlines()[0]) from exc
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        raise ConfigError(f"claims: {path} needs a list `claims` (and `version`, `margins`)")
    if document.get("version", VERSION) != VERSION:
        raise ConfigError(f"claims: {path}: version: expected {VERSION} (the schema this "
                          f"analysis reads), got {document['version']!r}")
    margins = _margins(document.get("margins") or {}, path)
    claims = [_claim(entry, margins, f"{path}: claim {entry.get('id', i)}")
              for i, raw in enumerate(document["claims"])
              for entry in _expand(raw, f"{path}: claim {i}")]
    seen: set[str] = set()
    for claim in claims:
        if claim.id in seen:
            raise ConfigError(f"claims: {path}: id {claim.id!r} appears twice")
        seen.add(claim.id)
    return claims


def _margins(raw: Any, path: Path) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ConfigError(f"claims: {path}: margins: expected a mapping of name -> value/source")
    out = {}
    for name, margin in raw.items():
        field = f"{path}: margins.{name}"
        if not isinstance(margin, dict):
            raise ConfigError(f"{field}: expected value, unit and source")
        check_str(margin.get("source"), f"{field}.source")
        out[name] = check_number(margin.get("value"), f"{field}.value", 0)
    return out


def _expand(raw: Any, where: str) -> list[dict[str, Any]]:
    """A claim entry with ``{key}`` in its id: one entry per value of each such key's list,
    ``{key}`` replaced by the value in every string field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"claims: {where}: expected a mapping")
    keys = re.findall(r"\{(\w+)\}", str(raw.get("id", "")))
    for key in keys:
        if key not in raw:
            raise ConfigError(f"claims: {where}: id names {{{key}}} but there is no `{key}`")
    lists = [raw[k] if isinstance(raw[k], list) else [raw[k]] for k in keys]
    out = []
    fields = (*REQUIRED, *OPTIONAL)
    for values in itertools.product(*lists):
        fill = dict(zip(keys, map(str, values), strict=True))
        entry = {k: _fill(v, fill) for k, v in raw.items() if k not in keys}
        entry.update({k: v for k, v in zip(keys, values, strict=True) if k in fields})
        out.append(entry)
    return out


def _fill(value: Any, fill: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return re.sub(r"\{(\w+)\}", lambda m: fill.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: _fill(v, fill) for k, v in value.items()}
    return value


def _claim(entry: dict[str, Any], margins: Mapping[str, float], where: str) -> Claim:
    """One expanded entry, checked field by field."""
    unknown = set(entry) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise ConfigError(f"claims: {where}: unknown field(s) {sorted(unknown)}; allowed "
                          f"{[*REQUIRED, *OPTIONAL]}")
    for key in REQUIRED:
        if entry.get(key) is None:
            raise ConfigError(f"claims: {where}: `{key}` is missing")
    metric = check_choice(entry["metric"], f"{where}: metric", tuple(METRICS))
    effect = check_choice(entry["effect"], f"{where}: effect", EFFECTS)
    direction = check_choice(entry["direction"], f"{where}: direction", DIRECTIONS)
    if ("bound" in entry) == ("margin" in entry):
        raise ConfigError(f"claims: {where}: give exactly one of `bound` and `margin`")
    if "margin" in entry:
        check_choice(entry["margin"], f"{where}: margin", tuple(margins))
        if effect != "difference":
            raise ConfigError(f"claims: {where}: margin: only with effect difference")
        size = margins[entry["margin"]]
        bound = -size if direction == ">" else size
    else:
        bound = check_number(entry["bound"], f"{where}: bound",
                             0 if effect == "ratio" else None, low_open=effect == "ratio")
    published = entry.get("published")
    if published != "reference" and published is not None:
        published = check_number(published, f"{where}: published")
    if published == "reference" and (entry.get("b") is None or metric != "final"):
        raise ConfigError(f"claims: {where}: published: reference needs `b` and metric final")
    return Claim(
        id=check_str(entry["id"], f"{where}: id"),
        claim=check_str(entry["claim"], f"{where}: claim"),
        sweep=check_str(entry["sweep"], f"{where}: sweep"),
        model=check_str(entry["model"], f"{where}: model"),
        a=_cell(entry["a"], f"{where}: a"),
        b=_cell(entry["b"], f"{where}: b") if entry.get("b") is not None else None,
        metric=metric, effect=effect, direction=direction, bound=float(bound),
        margin=entry.get("margin"), published=published,
        published_source=str(entry.get("published_source") or ""),
        reference_table=str(entry["reference_table"]) if "reference_table" in entry else None,
        statuses=tuple(_strings(entry.get("statuses", ["completed"]), f"{where}: statuses")),
        scales=tuple(_strings(entry["scales"], f"{where}: scales")) if "scales" in entry
        else None,
        source=check_str(entry["source"], f"{where}: source"))


def _cell(raw: Any, field: str) -> Cell:
    if isinstance(raw, str):
        return Cell(raw)
    if isinstance(raw, dict) and set(raw) <= {"method", "variant"} and "method" in raw:
        return Cell(check_str(raw["method"], f"{field}.method"),
                    check_str(raw.get("variant", "ours"), f"{field}.variant"))
    raise ConfigError(f"claims: {field}: expected a method or {{method, variant}}, got {raw!r}")


def _strings(raw: Any, field: str) -> list[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
        raise ConfigError(f"claims: {field}: expected a non-empty list of strings, got {raw!r}")
    return raw


# ---- statistics -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """An effect and its 95% interval (NaN ends: none), how it was computed, and from how many
    values (``n``: pairs, or runs of ``a`` and of ``b``)."""

    estimate: float
    low: float
    high: float
    kind: str
    n: str


def t_quantile(df: float) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def interval(a: pd.Series, b: pd.Series | None, effect: str) -> Interval:
    """The effect of ``a`` (values by seed) against ``b`` (None: ``a`` alone) with its 95%
    interval (see the module doc); ends NaN where there are fewer than two values."""
    log = effect == "ratio"
    a = np.log(a) if log else a
    b = (np.log(b) if log else b) if b is not None else None
    if b is None:
        result = _one_sample(a.to_numpy(float), "one-sample t")
    elif len(common := paired_seeds(a, b)) >= 2:
        result = _one_sample((a[common] - b[common]).to_numpy(float), "paired t")
    else:
        result = _welch(a.to_numpy(float), b.to_numpy(float))
    if not log:
        return result
    kind = result.kind if math.isnan(result.low) else result.kind + " on logs"
    return Interval(*(math.exp(v) for v in (result.estimate, result.low, result.high)), kind,
                    result.n)


def paired_seeds(a: pd.Series, b: pd.Series) -> list[Any]:
    """The seeds both cells ran (the pairs of a paired interval), in order."""
    return sorted(set(a.index) & set(b.index))


def _one_sample(values: np.ndarray, kind: str) -> Interval:
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    if n < 2:
        return Interval(mean, math.nan, math.nan, "none (one seed)" if n else "none", str(n))
    half = t_quantile(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, kind, str(n))


def _welch(a: np.ndarray, b: np.ndarray) -> Interval:
    estimate = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
    n = f"{len(a)} vs {len(b)}"
    if len(a) < 2 or len(b) < 2:
        return Interval(estimate, math.nan, math.nan, "none (one seed)", n)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(estimate, estimate, estimate, "Welch t", n)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(df) * se
    return Interval(estimate, estimate - half, estimate + half, f"Welch t, df {df:.1f}", n)


def verdict(result: Interval, direction: str, bound: float) -> str:
    """``reproduced`` if the whole interval is on the claimed side of ``bound``, ``not
    reproduced`` if wholly on the other, else (straddling, or no interval) ``inconclusive``."""
    if math.isnan(result.low) or math.isnan(result.high):
        return INCONCLUSIVE
    holds = result.high < bound if direction == "<" else result.low > bound
    fails = result.low >= bound if direction == "<" else result.high <= bound
    return REPRODUCED if holds else NOT_REPRODUCED if fails else INCONCLUSIVE


def seeds_needed(result: Interval, bound: float, effect: str, limit: int = SEEDS_LIMIT
                 ) -> float:
    """How many seeds a paired or one-sample interval would need to lie wholly on one side of
    ``bound`` if its estimate and the spread of its per-seed values stayed as measured: the
    smallest m >= 2 with t(m - 1) s / sqrt(m) < |estimate - bound|, s the per-seed standard
    deviation that ``result``'s half-width implies (on the log scale for ratios). NaN for
    other intervals (Welch's, fewer than two values), inf beyond ``limit``."""
    if math.isnan(result.low) or not result.kind.startswith(("paired t", "one-sample t")):
        return math.nan
    scale = math.log if effect == "ratio" else float
    n, distance = int(result.n), abs(scale(result.estimate) - scale(bound))
    spread = (scale(result.high) - scale(result.low)) / 2 / t_quantile(n - 1) * math.sqrt(n)
    for m in range(2, limit + 1):
        if t_quantile(m - 1) * spread / math.sqrt(m) < distance:
            return float(m)
    return math.inf


# ---- judging the claims on runs ---------------------------------------------------------------
def evaluate(frames: Frames, claims: list[Claim], scales: list[str] | None = None
             ) -> pd.DataFrame:
    """One row per claim and scale at which its cell ``a`` has runs in ``frames`` (loaded with
    ``include_incomplete=True``: a claim picks the statuses it reads): the claim, the published
    effect, ours with its interval and verdict, the values per seed, the machines, commits and
    run directories used. ``scales``: only these (None: every scale found)."""
    ref = reference.load_reference()
    rows = []
    for claim in claims:
        every = frames.runs[(frames.runs["sweep"] == claim.sweep)
                            & (frames.runs["model.name"] == claim.model)]
        runs = every[usable(every, claim.statuses)]
        for scale in sorted(set(every["scale"])):
            if (scales and scale not in scales) or (claim.scales and scale not in claim.scales):
                continue
            if _cell_runs(every[every["scale"] == scale], claim.a).empty:
                continue  # the claim's subject did not run here (in any state)
            mine = runs[runs["scale"] == scale]
            cells = [_cell_runs(mine, c) for c in (claim.a, claim.b) if c is not None]
            rows.append(_row(frames, claim, scale, cells, ref))
    return pd.DataFrame(rows, columns=COLUMNS)


# How a row's interval starts where a cell of its claim has no values (no runs, or none usable).
NO_VALUES = "none (no values of"
COLUMNS = ["id", "claim", "sweep", "scale", "model", "a", "b", "effect", "statement", "published",
           "published_source", "ours", "low", "high", "interval", "n", "seeds", "verdict",
           "seeds_needed",
           "values_a", "values_b", "mean_a", "mean_b", "fingerprints", "commits", "machines",
           "warning", "runs", "source"]


def _cell_runs(runs: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    """One run per seed of ``cell`` (a complete run before one kept for its status)."""
    mine = runs[(runs["method"] == cell.method) & (runs["variant"] == cell.variant)]
    mine = mine.assign(_rank=mine["problem"].notna()).sort_values(["seed", "_rank"])
    return mine.drop_duplicates("seed").drop(columns="_rank")


def _values(frames: Frames, claim: Claim, runs: pd.DataFrame) -> pd.Series:
    """The claim's metric per seed of ``runs`` (seeds without a finite value left out)."""
    if runs.empty:
        return pd.Series(dtype=float)
    values = METRICS[claim.metric](frames.only(runs["run_id"]))
    by_seed = pd.Series(pd.to_numeric(runs["run_id"].map(values), errors="coerce").to_numpy(),
                        index=runs["seed"].to_numpy(), dtype=float)
    by_seed = by_seed[np.isfinite(by_seed)]
    return by_seed[by_seed > 0] if claim.effect == "ratio" else by_seed


def _row(frames: Frames, claim: Claim, scale: str, cells: list[pd.DataFrame],
         ref: pd.DataFrame) -> dict[str, Any]:
    a = _values(frames, claim, cells[0])
    b = _values(frames, claim, cells[1]) if claim.b is not None else None
    missing = [c.label() for c, values in ((claim.a, a), (claim.b, b))
               if c is not None and values is not None and values.empty]
    result = interval(a, b, claim.effect) if not missing else \
        Interval(math.nan, math.nan, math.nan, f"{NO_VALUES} {', '.join(missing)})", "0")
    used = pd.concat(cells)
    made_by = provenance.cell(used)
    published, published_source = _published(claim, ref)
    return {"id": claim.id, "claim": claim.claim, "sweep": claim.sweep, "scale": scale,
            "model": claim.model, "a": claim.a.label(),
            "b": claim.b.label() if claim.b else "", "effect": claim.effect,
            "statement": claim.statement(),
            "published": published, "published_source": published_source,
            "ours": result.estimate, "low": result.low, "high": result.high,
            "interval": result.kind, "n": result.n, "seeds": _seeds(a, b),
            "verdict": verdict(result, claim.direction, claim.bound),
            "seeds_needed": seeds_needed(result, claim.bound, claim.effect),
            "values_a": _per_seed(a), "values_b": _per_seed(b) if b is not None else "",
            "mean_a": float(a.mean()) if len(a) else math.nan,
            "mean_b": float(b.mean()) if b is not None and len(b) else math.nan,
            "fingerprints": made_by["fingerprints"], "commits": made_by["commits"],
            "machines": made_by["machines"], "warning": made_by["provenance_warning"],
            "runs": "; ".join(used["path"]), "source": claim.source}


def _published(claim: Claim, ref: pd.DataFrame) -> tuple[float, str]:
    """The published effect and where it is from (NaN, '' when none is published)."""
    if claim.published is None:
        return math.nan, ""
    if claim.published != "reference":
        return float(claim.published), claim.published_source or claim.source
    table = claim.reference_table or reference.table_label(claim.sweep)
    values, sources = [], []
    for cell in (claim.a, claim.b):
        rows = ref[(ref["table"] == table) & ref["metric"].isin(list(reference.GROUP_METRICS))
                   & ref["model"].map(lambda m: reference.matches(m, claim.model))
                   & (ref["setting"] == cell.method)]
        if rows.empty:
            return math.nan, ""
        values.append(float(rows.iloc[0]["value"]))
        sources.append(str(rows.iloc[0]["source"]))
    origin = ", ".join(sorted(set(sources)))
    return values[0] - values[1], (f"analysis/reference, table {table}: {values[0]:g} - "
                                   f"{values[1]:g} ({origin})")


def _seeds(a: pd.Series, b: pd.Series | None) -> str:
    """The seeds of the values used: ``0 1 2``; ``0 1 2 (paired; a's 5 6 unpaired, left out)``
    where two or more are common; ``0 1 2 vs 3 4`` (Welch's) where fewer are."""
    def names(values: Any) -> str:
        return " ".join(map(str, sorted(values))) or "none"

    if b is None or set(a.index) == set(b.index):
        return names(a.index)
    common = paired_seeds(a, b)
    if len(common) < 2:
        return f"{names(a.index)} vs {names(b.index)}"
    alone = [f"{cell}'s {names(set(v.index) - set(common))}" for cell, v in (("a", a), ("b", b))
             if set(v.index) - set(common)]
    return f"{names(common)} (paired; {' and '.join(alone)} unpaired, left out)"


def _per_seed(values: pd.Series) -> str:
    return ", ".join(f"{seed}: {value:.4g}" for seed, value in sorted(values.items()))
