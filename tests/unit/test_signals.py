"""jobs/signals.py's hold on the signals that come as a job ends: each case in a child process
(a handler there runs at its next instruction; what it ignores stays ignored)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(code: str, **env: str) -> str:
    """What ``code`` prints, run by a fresh interpreter in the repository."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_process_ending_after_a_preemption_runs_no_handler_for_what_slurm_sends_then():
    # A requeue's SIGCONT and SIGTERM, and a second time-limit warning, reach the tasks while
    # they exit: the handlers submitit left (which log) must not run then.
    out = child("""
import os, signal
from jobs import signals
for signum in signals.QUIET:
    signal.signal(signum, lambda s, f: print("handled", signal.Signals(s).name, flush=True))
try:
    signals.exit_preempted(signals.Preempted(signal.SIGUSR2, 1, 96), rank=1)
except SystemExit as exc:
    for signum in (signal.SIGCONT, signal.SIGTERM, signal.SIGUSR2):
        os.kill(os.getpid(), signum)
    print("exit", exc.code)
""")
    assert out.split() == ["exit", "140"], out


def test_under_submitit_sigcont_keeps_its_default_action():
    # submitit's SIGCONT handler logs ("Bypassing signal SIGCONT"); Slurm sends SIGCONT with the
    # time-limit warning, which may land while the rank writes run.log.
    out = child("""
import os, signal
from jobs import signals
signal.signal(signal.SIGCONT, lambda s, f: print("logged", flush=True))
signals.install()
os.kill(os.getpid(), signal.SIGCONT)
print("default" if signal.getsignal(signal.SIGCONT) == signal.SIG_DFL else "handler")
""", SUBMITIT_EXECUTOR="slurm")
    assert out.split() == ["default"], out
