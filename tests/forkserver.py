"""A warm interpreter that starts `run.py` runs for the tests by forking (``run_cli``).

A 2-rank tiny run spends most of its CPU before its first step: torch, Hydra and the suite
imported by torchrun's agent and by every rank, and ``torch._dynamo`` imported by DDP's
constructor in each (about 13 CPU-seconds of a tiny run's 16 here). This server imports all of
that once, then serves one run at a time: it forks a job process, which becomes the run itself
(``nproc`` 1) or does what ``torchrun --standalone --nproc-per-node N`` does for a run
(torch/distributed/run.py and elastic/agent/server/local_elastic_agent.py): hosts the TCPStore
the ranks rendezvous on, forks the N ranks with torchrun's environment variables
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``, ...), and when a rank fails, stops the others (SIGTERM, then
SIGKILL) and exits 1. Each rank runs `run.py` as ``__main__`` in its forked process.

Forking is safe because nothing has run yet: the server only imports (no tensor operation, so
ATen's CPU capability, MKL's branch and the thread pools are still unchosen, and
``trainer.numerics`` pins them in each run as in a fresh process), and it refuses to serve once
the imports have started a second thread or loaded CUDA's driver (a CUDA context does not survive
a fork). Variables read while the interpreter or a library starts (``OMP_NUM_THREADS``,
``PYTHONPATH``, ...) cannot change after a fork: ``run_cli`` runs a call that changes them, and
every ``fresh=True`` call, as a new process.

Protocol (stdin/stdout, a JSON object per line): a request ``{"argv", "nproc", "env", "cwd",
"stdout", "stderr"}`` (the two output files, appended to); replies ``{"pid": job}`` (the job's
process group, for a timeout to kill) and then ``{"returncode": rc}`` (negative: the signal
that ended it, as ``subprocess`` reports it).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 30.0  # torchrun's agent: SIGTERM, then SIGKILL after this many seconds


def warm_up() -> None:
    """Import what every run imports, as a fresh ``python run.py`` would find it."""
    sys.path[0] = str(ROOT)                 # `python run.py` puts run.py's folder first
    import torch._dynamo  # noqa: F401  (DDP's constructor imports it)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import run  # noqa: F401  (the suite's modules; main not called)


def threads() -> int:
    """This process's threads (Python's and native ones)."""
    return len(os.listdir("/proc/self/task"))


def cuda_loaded() -> bool:
    """Whether CUDA's driver library is loaded here (an import asked for a device): a CUDA
    context does not survive a fork, so then no run may be forked from this process."""
    return "libcuda.so" in Path("/proc/self/maps").read_text()


def run_main(argv: list[str]) -> NoReturn:
    """Run `run.py` as ``__main__`` with ``argv`` and exit as that process would: SystemExit's
    status, 1 after an uncaught exception (its traceback on stderr), atexit handlers run."""
    sys.argv = ["run.py", *argv]
    code: Any = 0
    try:
        runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:                   # noqa: BLE001 (what the interpreter would print)
        traceback.print_exc()
        code = 1
    sys.exit(code)


def free_port() -> int:
    """A free TCP port on loopback (as torchrun --standalone picks one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun's agent gives every worker of a single-node job, but the rank."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc),
            "TORCHELASTIC_RUN_ID": f"forkserver-{os.getpid()}",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}


def job(request: dict[str, Any]) -> NoReturn:
    """The forked job: the run itself, or an agent for ``nproc`` ranks."""
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
    nproc = int(request["nproc"])
    if nproc == 1:
        run_main(request["argv"])
    port = free_port()
    os.environ.update(rank_env(nproc, port))
    ranks = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank),
                               "ROLE_RANK": str(rank)})
            run_main(request["argv"])
        ranks[pid] = rank
    import torch.distributed as dist  # imported already: the agent's store, as torchrun's
    store = dist.TCPStore("127.0.0.1", port, nproc, True, wait_for_workers=False)  # noqa: F841
    os._exit(supervise(ranks))                # the store lives until the job exits


def supervise(ranks: dict[int, int]) -> int:
    """Wait for the ranks; at the first failure stop the rest: torchrun's exit status (1)."""
    while ranks:
        pid, status = os.waitpid(-1, 0)
        rank = ranks.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if rank is None or code == 0:
            continue
        print(f"forkserver: rank {rank} exited with {code}; stopping the others",
              file=sys.stderr, flush=True)
        stop(ranks)
        return 1
    return 0


def stop(ranks: dict[int, int]) -> None:
    """SIGTERM the ranks still running, SIGKILL those alive after :data:`STOP_GRACE_S`."""
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while ranks and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            ranks.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def reply(message: dict[str, Any]) -> None:
    """One JSON line to the client."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:
    """Answer requests until stdin closes."""
    warm_up()
    reply({"ready": threads() == 1 and not cuda_loaded(), "threads": threads()})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            job(request)
        # Both sides set the job's group, as shells do: a kill of the group cannot come first
        # (OSError: the job did it first, or has ended).
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        reply({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
