"""``run.py`` with phase timers: where one run's wall time goes, on every process of the run.

    PROFILE_OUT=<dir> PROFILE_T0=<time.time() at launch> \
        torchrun --standalone --nproc-per-node 2 benchmarks/profiled_run.py <run.py's overrides>
    PROFILE_OUT=<dir> python benchmarks/profiled_run.py <overrides> launcher=simulated \
        trainer.workers=2

Runs run.py unchanged, as ``python run.py`` runs it (``runpy``, as ``__main__``). When its Hydra
app is called, by which time run.py has defined every function, the functions each phase
consists of are wrapped (:func:`install`): the objects are the real ones, the wrappers only
read the clock. Time is attributed exclusively, on the process's training thread: a phase
entered inside another pauses the outer one (the hook's calls inside backward count as hook,
not as backward). Each process writes ``$PROFILE_OUT/rank<r>.json`` (seconds per phase, its
CPU seconds) when the app returns. :data:`PHASES` says what each phase holds;
``make bench-tiny-profile`` (benchmarks/tiny_profile.py) runs it and writes the table.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ENTERED = time.time()  # before the imports below: they are start-up too
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402

# Phase -> what it holds (the page's words; benchmarks/tiny_profile.py prints them).
PHASES = {
    "start-up": "from the launch to the first data built: the interpreter (and torchrun's agent "
                "for real ranks), imports, Hydra composing the config, numerics and config "
                "checks; then the process group's rendezvous",
    "data": "building the dataset (`data.build`: the generated stand-in)",
    "set-up": "the model, each worker's task and data loaders, DDP and its buckets (settled by "
              "one probe backward), the compressor's state, the optimizer and the scheduler",
    "loading": "reading each training batch: the sampler, indexing the dataset and collating "
               "(augmentation too, where a dataset has it)",
    "forward+backward": "each worker's forward, loss and backward, without the hook's time",
    "hook": "the compression on the training thread. Real ranks: the comm hook's calls during "
            "backward. Simulated learners: each bucket copied during backward, then the "
            "aggregation (the compressor, the in-memory collectives) and the step's "
            "bookkeeping",
    "collectives": "real ranks: from the last bucket's hook call to the end of backward, the "
                   "wait for the buckets' collectives (and for the compressor steps that gloo's "
                   "threads run as collectives complete); simulated learners have none",
    "signal check": "the per-step check for a preemption signal: an all-reduce, which also "
                    "waits for the slower rank",
    "optimizer": "zero_grad, gradient clipping and the optimizer's step",
    "evaluation": "BatchNorm buffers from rank 0, the test set's forward passes and their sum",
    "records": "the metrics row, the Delta_e norms gathered for the scheduler, provenance, the "
               "summary, W&B",
    "checkpoint": "writing checkpoint.pt at every epoch's end",
    "other": "the rest of the loop (progress, the scheduler's levels) and the process group's "
             "shutdown",
}


class Clock:
    """Exclusive wall time and CPU time (this process's, all its threads) per phase: the phase
    on top of the stack is charged."""

    def __init__(self, started: float, base: str) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.cpu: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.stack = [base]
        # perf_counter's value at ``started`` (a time.time() taken by whoever launched us)
        self.last = time.perf_counter() - (time.time() - started)
        self.last_cpu = 0.0  # the process's CPU time starts at 0
        self.hook_returned: float | None = None  # when the last comm hook call returned

    def _charge(self) -> float:
        now, cpu = time.perf_counter(), time.process_time()
        self.seconds[self.stack[-1]] += now - self.last
        self.cpu[self.stack[-1]] += cpu - self.last_cpu
        self.last, self.last_cpu = now, cpu
        return now

    def enter(self, phase: str) -> None:
        """``phase`` starts (the current one pauses)."""
        self._charge()
        self.stack.append(phase)

    def leave(self) -> float:
        """The innermost phase ends (the one it paused goes on); returns the time."""
        now = self._charge()
        self.stack.pop()
        return now

    def rebase(self, phase: str) -> None:
        """From now on, time outside every wrapped call is ``phase``'s."""
        self._charge()
        self.stack[0] = phase

    def move(self, src: str, dst: str, seconds: float) -> None:
        """Re-attribute ``seconds`` of wall time already charged to ``src`` (a wait: its CPU
        time stays where it was)."""
        self.seconds[src] -= seconds
        self.seconds[dst] += seconds

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, its calls charged to ``phase``."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        return timed

    def total(self) -> float:
        """Seconds since the launch."""
        self._charge()
        return sum(self.seconds.values())


def _patch(clock: Clock, owner: Any, name: str, phase: str) -> None:
    """``owner.name`` (or ``owner[name]``, run.py's globals) charged to ``phase``."""
    if isinstance(owner, dict):
        owner[name] = clock.wrap(phase, owner[name])
    else:
        setattr(owner, name, clock.wrap(phase, getattr(owner, name)))


def install(clock: Clock, app: dict[str, Any]) -> None:
    """Wrap the functions of every phase; ``app``: run.py's globals."""
    import torch

    import data
    import models
    import schedulers
    import training.workers
    from core import distributed, record
    from jobs import signals
    from training import checkpoint, optim, simulated, tasks, wandb_logger

    def first_data(*args: Any, **kwargs: Any) -> Any:
        clock.rebase("other")  # start-up ends where the run's own work begins
        return build_data(*args, **kwargs)

    build_data = clock.wrap("data", data.build)
    data.build = first_data
    _patch(clock, distributed, "init", "start-up")
    for owner, name in ((models, "build"), (schedulers, "build"), (training.workers, "build"),
                        (checkpoint, "load")):
        _patch(clock, owner, name, "set-up")
    build_optimizer = optim.build

    def optimizer(*args: Any, **kwargs: Any) -> Any:
        opt = build_optimizer(*args, **kwargs)
        opt.step = clock.wrap("optimizer", opt.step)
        opt.zero_grad = clock.wrap("optimizer", opt.zero_grad)
        return opt

    optim.build = clock.wrap("set-up", optimizer)
    _patch(clock, torch.nn.utils, "clip_grad_norm_", "optimizer")
    _time_batches(clock, tasks.Classification)
    _time_batches(clock, tasks.LanguageModel)
    _time_hook(clock, training.workers)
    _patch(clock, simulated, "_record", "hook")
    _patch(clock, simulated.SimulatedWorkers, "step", "hook")
    _time_backward(clock, app)
    _patch(clock, signals.StopCheck, "due", "signal check")
    for owner, name in ((app, "_sync_buffers"), (training.workers.Rank, "evaluate"),
                        (simulated.SimulatedWorkers, "evaluate")):
        _patch(clock, owner, name, "evaluation")
    for owner, name in ((app, "_end_of_epoch"), (app, "_make_logger"), (app, "_finish"),
                        (record.MetricsLog, "write"), (record, "record_start"),
                        (app["provenance"], "collect"), (wandb_logger.WandbLogger, "log"),
                        (wandb_logger.WandbLogger, "finish")):
        _patch(clock, owner, name, "records")
    _patch(clock, checkpoint, "save", "checkpoint")


def _time_batches(clock: Clock, task: type) -> None:
    """Each ``next`` of a task's training batches is loading."""
    batches = task.batches

    def timed(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        it = batches(self, *args, **kwargs)
        while True:
            clock.enter("loading")
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                clock.leave()
            yield item

    task.batches = timed


def _time_hook(clock: Clock, workers: Any) -> None:
    """Real ranks' comm hook: its calls are hook time; when the last one returned tells the
    wait for the collectives at the end of backward (:func:`_time_backward`)."""
    hook = workers.comm_hook

    @functools.wraps(hook)
    def timed(state: Any, bucket: Any) -> Any:
        clock.enter("hook")
        try:
            return hook(state, bucket)
        finally:
            clock.hook_returned = clock.leave()

    workers.comm_hook = timed


def _time_backward(clock: Clock, app: dict[str, Any]) -> None:
    """run.py's ``_forward_backward``; the time from the last comm hook call to its end is the
    wait for the collectives (DDP waits for every bucket's future at the end of backward)."""
    forward_backward = clock.wrap("forward+backward", app["_forward_backward"])

    def timed(*args: Any, **kwargs: Any) -> Any:
        clock.hook_returned = None
        out = forward_backward(*args, **kwargs)
        if clock.hook_returned is not None:
            clock.move("forward+backward", "collectives", clock.last - clock.hook_returned)
        return out

    app["_forward_backward"] = timed


def _with_timers(clock: Clock) -> Callable[..., Any]:
    """A stand-in for ``hydra.main`` that installs the timers when the app is called and writes
    this process's profile when it returns."""
    hydra_main = hydra.main

    def main(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        decorate = hydra_main(*args, **kwargs)

        def apply(task: Callable[..., Any]) -> Callable[..., Any]:
            app = decorate(task)

            @functools.wraps(app)
            def start(*a: Any, **k: Any) -> Any:
                install(clock, task.__globals__)
                try:
                    return app(*a, **k)
                finally:
                    _write(clock)

            return start

        return apply

    return main


def _write(clock: Clock) -> None:
    """``$PROFILE_OUT/rank<r>.json``."""
    rank = int(os.environ.get("RANK", "0"))
    total = clock.total()
    out = {"rank": rank, "seconds": clock.seconds, "cpu": clock.cpu, "wall_s": total,
           "cpu_s": time.process_time()}
    Path(os.environ["PROFILE_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    hydra.main = _with_timers(Clock(float(os.environ.get("PROFILE_T0", ENTERED)), "start-up"))
    sys.argv[0] = str(ROOT / "run.py")
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")  # as `python run.py ...`
