"""DDP's gradient buckets, laid out for good before the first training step.

Why: DDP's first backward runs with every parameter in one bucket, and only then are the
buckets rebuilt, once, in the order the gradients became ready (torch 2.14.1,
``torch/nn/parallel/distributed.py``: ``_BucketConfig.compute_bucket_size_limits`` returns
``[sys.maxsize]`` "when static_graph or not finding unused params", and the ``Reducer``
rebuilds from the order its autograd hooks fired, at the next forward's ``_rebuild_buckets``).
A process that resumes a run therefore starts with the single bucket again where the run that
never stopped had the rebuilt ones, and the compressor sees other buckets: other layers
together, in another order, at other offsets of the bucket's buffer. That is harmless for an
elementwise all-reduce, but not for PowerSGD: its products ``P = M Q`` and ``P Q^T`` (written
into the bucket) round differently at other offsets when MKL runs them on several threads, and
the resumed run drifts from the one that never stopped from its first step on.

:func:`settle` gives every process, fresh or resumed, the final buckets before its first step:
one backward on a small probe batch (the first examples of the rank's test shard) with DDP's
plain all-reduce, before the compression hook is registered, then the rebuild. Nothing of it
survives: gradients, BatchNorm statistics, the RNG streams (dropout) and the task's carry (an
LSTM's hidden state) are put back as they were. Every rank calls it: the rebuild broadcasts
rank 0's layout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from core import rng


def settle(ddp: DDP, task: Any) -> None:
    """Run one backward of ``task.probe_batch()`` through ``ddp`` (no comm hook registered
    yet) and rebuild its buckets in the order the gradients became ready; collective."""
    module = ddp.module
    buffers = [b.detach().clone() for b in module.buffers()]
    streams = rng.capture(cuda=True)
    carry = task.carry()
    loss, _ = task.loss(ddp, task.probe_batch())
    loss.backward()
    ddp.reducer._rebuild_buckets()  # as DDP's forward and its Join hook call it
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(module.buffers(), buffers, strict=True):
            b.copy_(saved)
    rng.restore(streams)
    task.set_carry(carry)
