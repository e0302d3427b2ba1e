"""Analyses of finished runs, no retraining.

``load`` (run records -> ``runs`` / ``epochs`` frames), ``wandb_runs`` (the same from W&B: the
API or the offline run files), ``tables`` and ``reference`` (the papers' tables next to the
published numbers), ``figures``, ``report`` (the per-sweep report and its command line) and
``whatif`` (Accordion's detector replayed at other eta / interval).
"""
