"""Analyses of finished runs (their ``metrics.jsonl``, config and checkpoint), no retraining."""
