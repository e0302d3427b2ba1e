"""The top layer's wiring for `run.py`: config checks across groups, train/eval tasks, W&B.

It imports the middle layer (``models``, ``data``, ``compression``, ``schedulers``) and ``core``;
nothing below imports it.
"""
