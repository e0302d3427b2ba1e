"""A job's life around the training loop: which runs a sweep plans, what a run directory's state
means, how a rank reacts to the signals that end jobs early, and how a run that cannot go on
ends.

- :mod:`jobs.sweeps`: a sweep's runs and the plan printed before anything starts;
- :mod:`jobs.runs`: a run directory's state (complete, to resume, failed, to start);
- :mod:`jobs.signals`: preemption and termination signals, on every rank alike;
- :mod:`jobs.faults`: failure summaries, fault injection, the line a user reads.

It imports ``core``, ``data`` and ``models``; ``training`` (the loop), ``run.py`` and the Hydra
plugins import it.
"""
