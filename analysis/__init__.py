"""Analyses of finished runs, no retraining.

``load`` (run records -> ``runs`` / ``epochs`` frames), ``wandb_runs`` (the same from W&B: the
API or the offline run files), ``provenance`` (which machines and commits made the runs),
``tables`` and ``reference`` (the papers' tables next to the published numbers), ``figures``
and ``style`` (the report's figures, and the one look of every figure the suite draws),
``report`` (the per-sweep report and its command line), ``whatif`` (Accordion's detector
replayed at other eta / interval), ``claims`` (the figure-level claims' figures and tables, one
``claims_<name>`` module each) and ``verdicts`` / ``scorecard`` (every claim of
``claims.yaml`` judged on the runs). docs/analysis.md and docs/run-record.md describe them.
"""
