"""The training loop's parts for `run.py`: config checks across groups, the workers (one DDP
rank or W simulated learners) and their buckets, train/eval tasks, the optimizer, checkpoints and
mid-epoch progress, W&B.

It imports the middle layer (``models``, ``data``, ``compression``, ``schedulers``), ``jobs`` (a
job's lifecycle and sweep planning) and ``core``; nothing below imports it.
"""
