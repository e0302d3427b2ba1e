"""Which machine and which code made each run, and what a cell of several runs says about them.

A run record's ``summary.json`` holds ``provenance`` (``fingerprint``: 12 hex digits naming the
machine and numeric environment; ``machine``: a short label; ``git``: ``commit``, ``dirty``,
``diff_sha256``; ``numerics`` with its ``mode``; versions, CPU, CUDA, ...: core/provenance.py)
and ``starts`` (the same dict per start of a resumed run, with the ``epoch`` it started at); a
W&B run holds the provenance in its config, flattened as ``provenance.fingerprint``,
``provenance.git.commit``, ... (docs/run-record.md). Both become the same columns of the runs
frame (:func:`columns`): the provenance flattened under ``provenance.``, and
``provenance.starts``, a tuple of ``(fingerprint, code, epoch)`` per start. Runs recorded
before provenance existed have fingerprint and commit ``unknown``.

:func:`cell` says what a table cell (or a claim's runs) aggregated: its fingerprints, its code
(commit, and the diff's hash when the checkout was dirty) and a warning when it mixes machines or
code, or when one of its runs was resumed on another machine or code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core.record import flatten

PREFIX = "provenance."
FINGERPRINT = "provenance.fingerprint"
MACHINE = "provenance.machine"
COMMIT = "provenance.git.commit"
DIRTY = "provenance.git.dirty"
DIFF = "provenance.git.diff_sha256"
STARTS = "provenance.starts"
NUMERICS = "provenance.numerics.mode"
COLUMNS = (FINGERPRINT, MACHINE, COMMIT, DIRTY, DIFF, NUMERICS, STARTS)
UNKNOWN = "unknown"
SHORT = 12  # hex digits of a commit or diff hash shown


def columns(flat: Mapping[str, Any], starts: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The provenance columns of one run from its ``provenance.*`` keys (``flat``: flattened
    with the ``provenance.`` prefix) and its starts (each a flattened provenance dict plus
    ``epoch``, keys without the prefix); unknown fingerprint and commit where there are none."""
    out = {key: tuple(v) if isinstance(v, list) else v for key, v in flat.items()
           if key.startswith(PREFIX) and key != PREFIX + "epoch"}  # the start's: in STARTS
    if isinstance(out.get("provenance.numerics"), str):  # {"numerics": "portable"} as well
        out[NUMERICS] = out.pop("provenance.numerics")
    for key in COLUMNS:
        out.setdefault(key, None)
    for key in (FINGERPRINT, COMMIT):
        out[key] = out[key] or UNKNOWN
    out[STARTS] = tuple((start.get("fingerprint") or UNKNOWN,
                         code(start.get("git.commit"), start.get("git.dirty"),
                              start.get("git.diff_sha256")), start.get("epoch"))
                        for start in starts)
    return out


def from_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance columns from a ``summary.json`` (or ``{}``: a run without one)."""
    provenance = summary.get("provenance")
    flat = flatten(dict(provenance), PREFIX) if isinstance(provenance, Mapping) else {}
    starts = [flatten(dict(s)) for s in summary.get("starts") or [] if isinstance(s, Mapping)]
    return columns(flat, starts)


def code(commit: Any, dirty: Any = False, diff: Any = None) -> str:
    """A run's code: the commit's first digits, ``+dirty <diff hash>`` for uncommitted changes."""
    label = str(commit)[:SHORT] if commit else UNKNOWN
    if dirty:
        label += f"+dirty {str(diff)[:8] if diff else UNKNOWN}"
    return label


def _runs_code(runs: pd.DataFrame) -> pd.Series:
    def value(column: str) -> pd.Series:
        return runs[column] if column in runs else pd.Series(None, index=runs.index)

    return pd.Series([code(c if c != UNKNOWN else None, _true(d), h) for c, d, h in
                      zip(value(COMMIT), value(DIRTY), value(DIFF), strict=True)],
                     index=runs.index, dtype=object)


def _true(value: Any) -> bool:
    """A flag read from a frame: True only for a true boolean (None and NaN are not)."""
    return isinstance(value, bool | np.bool_) and bool(value)


def cell(runs: pd.DataFrame) -> dict[str, str]:
    """What the runs of one cell were made by: ``fingerprints`` and ``commits`` (sorted, joined
    by ``, ``), ``machines`` (``fingerprint: label`` of each known one) and ``provenance_warning``
    ('' when the cell is of one machine and one code, and no run changed machine or code)."""
    fingerprints = runs[FINGERPRINT].fillna(UNKNOWN) if FINGERPRINT in runs else \
        pd.Series(UNKNOWN, index=runs.index)
    codes = _runs_code(runs)
    labels = runs[MACHINE] if MACHINE in runs else pd.Series(None, index=runs.index)
    machines = {f: m for f, m in zip(fingerprints, labels, strict=True) if isinstance(m, str)}
    warnings = []
    if fingerprints.nunique() > 1:
        warnings.append(f"mixes {fingerprints.nunique()} machines")
    if codes.nunique() > 1:
        warnings.append(f"mixes {codes.nunique()} commits")
    for _, run in runs.iterrows():
        moved = resumed_elsewhere(run.get(STARTS))
        if moved:
            warnings.append(f"seed {run.get('seed')} {moved}")
    return {"fingerprints": ", ".join(sorted(set(fingerprints))),
            "commits": ", ".join(sorted(set(codes))),
            "machines": "; ".join(f"{f}: {m}" for f, m in sorted(machines.items())),
            "provenance_warning": "; ".join(warnings)}


def resumed_elsewhere(starts: Any) -> str:
    """'' if every start of a run ran on the first start's machine and code; else what changed
    and from which epoch (``resumed on another machine at epoch 3``)."""
    if not isinstance(starts, Sequence) or len(starts) < 2:
        return ""
    first_fingerprint, first_code, _ = starts[0]
    changed = []
    for fingerprint, code_label, epoch in starts[1:]:
        what = [w for w, same in (("machine", fingerprint == first_fingerprint),
                                  ("commit", code_label == first_code)) if not same]
        if what:
            changed.append(f"resumed on another {' and '.join(what)} at epoch {epoch}")
    return "; ".join(changed)
