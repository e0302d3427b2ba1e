"""``scheduler=static``: every layer keeps the compressor's configured level all run."""

from __future__ import annotations

from schedulers import register
from schedulers.base import Scheduler


@register("static")
class Static(Scheduler):
    """The papers' fixed-level baselines."""
