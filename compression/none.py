"""``compressor=none``: plain fp32 all-reduce through the same hook path (the fair baseline).

One all-reduce per DDP bucket, exactly what DDP does without a hook; the hook still
accumulates the per-layer gradient sums and counts 32 bits per gradient element per step.
"""

from __future__ import annotations

from compression import register
from compression.base import Compressor


@register("none")
class NoCompression(Compressor):
    """Sends every gradient element as fp32."""

    compresses = False
    wire = "all-reduce in fp32 (the bucket whole)"
