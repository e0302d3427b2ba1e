"""Training plumbing shared by `run.py`: distributed set-up, config checks, run records, logging."""
