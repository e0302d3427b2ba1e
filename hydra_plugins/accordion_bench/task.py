"""The command every task of a submitit job runs (the submitit launchers' ``python``):

    python -u -m hydra_plugins.accordion_bench.task -u -m submitit.core._submit <folder>

It blocks SIGUSR1 and submitit's own signal (SIGUSR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says
otherwise) as its first instruction, then runs the module submitit asked for, as ``python -u
-m`` would. A preemption or time-limit warning that Slurm sends while the task starts (before
submitit has loaded the job, whose handler would requeue rank 0 alone, or before it has any
handler, when the signal's default action would kill the task) stays pending until run.py's
:func:`jobs.signals.install` lets it through to the handler that stops every rank at one
step boundary. Importing this module does nothing (Hydra imports every plugin module).
"""

import os
import runpy
import signal
import sys

SUBMITIT_MODULE = "submitit.core._submit"


def held() -> set[signal.Signals]:
    """SIGUSR1 and submitit's signal (read as submitit reads it, without importing it)."""
    own = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    return {signal.SIGUSR1, signal.Signals(own)}


def main(argv: list[str]) -> None:
    """Block :func:`held`, then run ``-m <module> <args>`` from ``argv`` (after this module's
    own name; a leading ``-u`` is dropped: this interpreter runs unbuffered already). A command
    it does not know is refused before anything is blocked."""
    args = argv[1:]
    if args[:1] == ["-u"]:
        args = args[1:]
    if len(args) < 2 or args[0] != "-m" or args[1] != SUBMITIT_MODULE:
        sys.exit(f"usage: python -u -m hydra_plugins.accordion_bench.task -u -m "
                 f"{SUBMITIT_MODULE} <folder>; got {' '.join(argv[1:])!r}")
    signal.pthread_sigmask(signal.SIG_BLOCK, held())
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
