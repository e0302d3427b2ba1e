"""How a rank reacts to the signals that end jobs early: the one place for it.

Preemption (``trainer.preempt_signals``, default SIGTERM and SIGUSR1: Slurm's warning before
the time limit with ``--signal=USR1@<seconds>``). While the training loop runs
(:func:`defer`), such a signal only asks the run to stop: every ``trainer.preempt_check_every``
steps the ranks all-reduce the signal they hold (:class:`StopCheck`, MAX of one integer), so a
signal that reaches the ranks at different times still stops them all at the same step. They
save a mid-epoch checkpoint there (training/progress.py) and end through :class:`Preempted`:

- under submitit (hydra-submitit-launcher on Slurm, or its local executor), rank 0 then takes
  submitit's own requeue path (:func:`exit_preempted`: the launcher's ``checkpoint()``, ``scontrol
  requeue`` or the local executor's requeue status); the requeued job finds the run
  interrupted and ``resume: auto`` continues it mid-epoch. SIGTERM is the exception: Slurm sends
  it on ``scancel`` too, so it ends the job (exit 143) without a requeue of its own (a preempted
  job that Slurm requeues itself resumes as well). Submitit's own signal
  (``SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2) is always one of the preemption signals there;
- elsewhere (`kill`, torchrun, srun), the job exits with status 128 + the signal, and
  ``summary.json`` says ``preempted: ...``: an interruption, which ``resume=true`` or a relaunch
  of the sweep (``resume=auto``) continues mid-epoch.

A second preemption signal while the first is pending ends the run at once, and so does SIGTERM
outside the training loop (starting up, or after the last epoch): ``SystemExit(128 +
signal)``, and the summary says ``failed: SystemExit: <status>`` (also an interruption, resumed
from the last checkpoint). While the run writes down how it ended (:func:`shield`), signals are
held, not acted on.

Under submitit, a preemption warning may come while the job starts (a short time limit, a
preemption): submitit's own signal and SIGUSR1 (:data:`STARTUP`) are held blocked from the
task's first instruction (hydra_plugins/accordion_bench/task.py, before submitit has loaded the
job) and noted from :func:`install` on, so one that comes early stops the ranks at the training
loop's first check, checkpointed and requeued, instead of killing the tasks or requeueing rank 0
alone. After the loop submitit's handlers are back, unless the run ended by itself: then
these signals and :data:`QUIET` are ignored to the task's exit (:func:`undefer`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from core.errors import ConfigError

ALLOWED = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT")
# Slurm sends the tasks SIGCONT along with the signals it gives a job step (seen here with the
# time-limit warning and a requeue's SIGTERM; its CI log too), and submitit's handler for it only
# logs ("Bypassing signal SIGCONT"). A log call from a Python signal handler that lands while the
# process writes a line to a buffered file (Hydra's run.log) fails as a reentrant write, and
# logging prints a "--- Logging error ---" traceback into the task's log (chained to the
# exception being handled: after a preemption, the Preempted line again). So under submitit
# SIGCONT keeps its default action (continue a stopped process, nothing else), and a process
# ending after a preemption ignores these and the preemption signals: its checkpoint is written,
# nothing they ask for can still happen.
QUIET = (signal.SIGCONT, *(signal.Signals[name] for name in ALLOWED))
# Under submitit, noted from the task's start, with submitit's own signal (see the module doc).
STARTUP = (signal.SIGUSR1,)
_state: dict[str, Any] = {"shielded": False, "deferring": False, "requested": 0,
                          "requeue": None, "signals": (), "before": {}}
_held: list[int] = []


class Preempted(Exception):  # noqa: N818 (what happened, not an error)
    """The ranks stopped at a step boundary on a preemption signal, their checkpoint written."""

    def __init__(self, signum: int, epoch: int, step: int) -> None:
        self.signum, self.epoch, self.step = signum, epoch, step
        super().__init__(f"preempted: {signal.Signals(signum).name} at epoch {epoch}, step {step}")

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by the signal."""
        return 128 + self.signum


def check_names(names: Any, field: str = "trainer.preempt_signals") -> tuple[signal.Signals, ...]:
    """The signals named in ``names`` (a list of ``ALLOWED`` names); ConfigError otherwise."""
    if not isinstance(names, Sequence) or isinstance(names, str):
        raise ConfigError(f"{field}: expected a list of signal names from {list(ALLOWED)}, "
                          f"got {names!r}")
    for name in names:
        if name not in ALLOWED:
            raise ConfigError(f"{field}: {name!r} is not one of {list(ALLOWED)}")
    return tuple(signal.Signals[str(n)] for n in names)


def under_submitit() -> bool:
    """Whether this process is a submitit job's task."""
    return "SUBMITIT_EXECUTOR" in os.environ


def submitit_signal() -> signal.Signals:
    """The signal submitit asks Slurm for before the time limit (``SUBMITIT_PREEMPT_SIGNAL``,
    SIGUSR2 by default)."""
    from submitit import JobEnvironment

    return signal.Signals(JobEnvironment._usr_sig())  # noqa: SLF001 (submitit's own choice)


def install() -> None:
    """Outside the training loop: SIGTERM ends the run at once. Under submitit (whose SIGTERM
    handler stays), submitit's signal and :data:`STARTUP` are noted from here on, and let through
    if the task held them (see the module doc), and SIGCONT is left to its default action
    (:data:`QUIET`)."""
    if not under_submitit():
        signal.signal(signal.SIGTERM, _on_signal)
        return
    held = (submitit_signal(), *STARTUP)
    _note(held)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)  # not submitit's log line: see QUIET


def _note(signums: Sequence[int]) -> None:
    """From now on, ``signums`` are noted for :class:`StopCheck` (the handlers they had are
    kept for :func:`undefer`; under submitit, its requeue handler for :func:`exit_preempted`)."""
    for signum in signums:
        handler = signal.getsignal(signum)
        if getattr(handler, "__name__", "") == "checkpoint_and_try_requeue":
            _state["requeue"] = handler
        if signum not in _state["before"]:
            _state["before"][signum] = handler
        signal.signal(signum, _on_signal)
    _state["signals"] = tuple(dict.fromkeys((*_state["signals"], *signums)))
    _state["deferring"] = True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state["shielded"]:
        _held.append(signum)
        return
    if _state["deferring"] and signum in _state["signals"] and not _state["requested"]:
        _state["requested"] = signum  # acted on at the next step boundary (StopCheck)
        return
    sys.exit(128 + signum)


def defer(names: Any) -> None:
    """From now on (the training loop), a preemption signal (``names``, plus submitit's own
    under submitit) is noted for :class:`StopCheck` instead of ending the run, until
    :func:`undefer` restores the handlers before. A signal noted since :func:`install` stays
    requested if it is one of them."""
    signums = [signal.Signals[str(n)] for n in names]
    if under_submitit():
        signums.append(submitit_signal())
    for signum in [s for s in _state["signals"] if s not in signums]:  # not this run's
        signal.signal(signum, _state["before"].pop(signum))
    early, _state["signals"] = _state["requested"], ()
    _note(signums)
    _state["requested"] = early if early in signums else 0


def undefer(ended: bool = False) -> None:
    """End :func:`defer` (and :func:`install`'s noting): the handlers before them again. Under
    submitit, a run that ``ended`` by itself (completed or diverged) ignores the preemption
    signals and :data:`QUIET` instead, to the process's exit: nothing is left to checkpoint, and
    a time-limit warning that Slurm sends late (it checks limits every 30 s or so, so the
    warning for a short attempt may come after the run) would otherwise requeue a finished job
    through submitit's handler, or kill the task while the interpreter exits (Python's
    finalization puts back the default action, which terminates, for every signal with a Python
    handler; an ignored signal stays ignored); submitit's SIGTERM handler, where SIGTERM is not a
    preemption signal of the run, would log from inside a signal handler (see QUIET)."""
    _state["deferring"], _state["requested"], _state["signals"] = False, 0, ()
    if ended and under_submitit():
        _ignore((*_state["before"], *QUIET))
    else:
        for signum, handler in _state["before"].items():
            signal.signal(signum, handler)
    _state["before"] = {}


def _ignore(signums: Sequence[int]) -> None:
    """Ignore ``signums`` from now on, process-wide (torch's threads take signals the main
    thread blocks)."""
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


def requested() -> int:
    """The preemption signal this rank holds (0: none)."""
    return int(_state["requested"])


@contextmanager
def shield() -> Iterator[None]:
    """Hold the handled signals inside the block. Use it where the run is ending already (an
    exception on its way out): what a held signal asked for then happens anyway."""
    before = _state["shielded"]
    _state["shielded"] = True
    try:
        yield
    finally:
        _state["shielded"] = before


def held() -> list[int]:
    """Signals that arrived inside :func:`shield` blocks, in order."""
    return list(_held)


def exit_preempted(preempted: Preempted, rank: int) -> None:
    """End this process after a preemption (its checkpoint written, the process group shut
    down). Under submitit, rank 0 takes submitit's own path (the launcher's ``checkpoint()``,
    then the cluster's requeue; it exits the process), except after SIGTERM; every other case
    exits with the signal's status (128 + its number). :data:`QUIET` are ignored to the exit
    (the requeue's SIGCONT and SIGTERM, a second warning)."""
    _ignore(QUIET)
    handler: Callable[[int, FrameType | None], None] | None = _state["requeue"]
    if rank == 0 and handler is not None and preempted.signum != signal.SIGTERM:
        handler(preempted.signum, None)
    sys.exit(preempted.exit_status)


class StopCheck:
    """The ranks' agreement on when to stop: every ``every`` steps, one all-reduce (MAX) of the
    signal each rank holds; a CPU tensor through gloo (a gloo group of its own under NCCL, so
    that the check never waits for the GPU). Collective: every rank calls :meth:`due` at the
    same steps. With no preemption signals configured it does nothing."""

    def __init__(self, every: int, enabled: bool) -> None:
        self.every, self.enabled = every, enabled
        self.group = None
        if enabled and dist.get_backend() != "gloo":
            self.group = dist.new_group(backend="gloo")
        self._flag = torch.zeros(1, dtype=torch.int64)

    def due(self, steps_done: int) -> int:
        """After ``steps_done`` steps of an epoch: the signal the ranks agree to stop on (the
        largest held by any rank), or 0 to go on."""
        if not self.enabled or steps_done % self.every:
            return 0
        self._flag.fill_(requested())
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(self._flag.item())
