"""One code path for a single process, `torchrun` (env://), Slurm (`srun`) and submitit.

:func:`detect` reads rank, world size and local rank from the environment *without* touching
``torch.distributed``, so `run.py` can validate the config against the world size before any
process group starts. :func:`init` then starts the group: nccl on CUDA, gloo on CPU, always with
a timeout so that a dead rank ends the job with an error instead of a hang. A single process also
gets a (world-size-1) group, so the training code and the communication hooks never branch on it.

On several nodes, the master address must reach rank 0 from every node (a loopback address is
refused with one line saying what to set), and gloo must bind to the interface that reaches it
(``GLOO_SOCKET_IFNAME``, inferred from the route to the master address: :mod:`core.netif`).

When a run ends by an error, each rank posts how it ended in the job's key-value store
(:func:`post_ending`), which outlives the workers under torchrun (its agent holds it); a rank
that saw a collective fail reads the others' posts (:func:`endings`) to tell a peer that failed
on its own from one that is gone (killed, its node lost) or stopped.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from core import netif
from core.errors import ConfigError

_JOB: dict[str, dist.Store] = {}  # "store": this job's key-value store, once init() ran
POLL_S = 0.05


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "single", "torchrun", "submitit" or "slurm"

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run record and talks to W&B."""
        return self.rank == 0


def detect() -> DistEnv:
    """Read the job layout from torchrun's, submitit's or Slurm's variables, in that order.

    Under hydra-submitit-launcher every task runs the job function itself; submitit's
    ``JobEnvironment`` gives its rank and the job's tasks, from Slurm's variables on a cluster
    and from its own (``SUBMITIT_LOCAL_*``) under the local executor.
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]),
                       int(env.get("LOCAL_RANK", 0)), "torchrun")
    if "SUBMITIT_EXECUTOR" in env:
        job = _submitit_job()
        if job.num_tasks > 1:
            return DistEnv(job.global_rank, job.num_tasks, job.local_rank, "submitit")
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return DistEnv(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]),
                       int(env.get("SLURM_LOCALID", 0)), "slurm")
    return DistEnv(0, 1, 0, "single")


def device_for(env: DistEnv, requested: str) -> torch.device:
    """``trainer.device``: "auto" takes this rank's GPU when CUDA is present, else the CPU.

    This rank's GPU is :func:`cuda_index` of those this process sees; a rank without one of
    its own is a ConfigError (one line), raised before any process group starts."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        index = cuda_index(env.local_rank, torch.cuda.device_count(), slurm_binds_gpus(env))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(requested)


def slurm_binds_gpus(env: DistEnv) -> bool:
    """Whether Slurm started this task (srun, or submitit's Slurm executor), and so may have
    bound GPUs to it alone (``--gpus-per-task``, ``--gpu-bind``): then each task sees only its
    own. torchrun and submitit's local executor show every rank the same devices."""
    return env.launcher == "slurm" or os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


def cuda_index(local_rank: int, visible: int, slurm_binds: bool) -> int:
    """The index, among the ``visible`` CUDA devices this process sees, of the one the rank of
    local rank ``local_rank`` trains on.

    Ranks that see every GPU of their node take the ``local_rank``-th. A Slurm task that sees
    exactly one has been bound to it (Slurm sets ``CUDA_VISIBLE_DEVICES`` per task): index 0,
    whatever its local rank. Any other rank has no GPU of its own: a ConfigError that says so.
    """
    if slurm_binds and visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    bind = ", or have Slurm bind one GPU to each task (--gpus-per-task=1)" if slurm_binds else ""
    raise ConfigError(f"trainer.device: local rank {local_rank} has no GPU of its own: this "
                      f"process sees {visible} CUDA device{'' if visible == 1 else 's'} "
                      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                      f"start at most {visible} rank{'' if visible == 1 else 's'} per node"
                      f"{bind}, or set trainer.device=cpu")


def init(env: DistEnv, device: torch.device, timeout_s: float) -> None:
    """Start the default process group for ``env`` (nccl on CUDA, gloo otherwise)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if env.launcher == "single":
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        _JOB["store"] = dist.PrefixStore("accordion-bench/0", store)
        return
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        warnings.warn("OMP_NUM_THREADS is not set: set it (torchrun sets 1) so that every thread "
                      "of a rank uses the same number of intra-op threads; otherwise ranks can "
                      "round differently and drift apart (summary.json's params_in_sync tells)",
                      RuntimeWarning, stacklevel=2)
    if env.launcher == "slurm":
        os.environ.setdefault("MASTER_ADDR", _slurm_master_addr())
        os.environ.setdefault("MASTER_PORT", str(_slurm_port()))
    if env.launcher == "submitit":
        job = _submitit_job()
        local = os.environ["SUBMITIT_EXECUTOR"] == "local"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1" if local else job.hostnames[0])
        os.environ.setdefault("MASTER_PORT", str(_port_for(str(job.job_id))))
    check_master(_nodes(env))
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = netif.interface_to(os.environ["MASTER_ADDR"])
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    kwargs = {"device_id": device} if backend == "nccl" else {}
    # env:// as init_process_group does it, keeping the store: torchrun's agent holds it (so it
    # outlives any worker), otherwise rank 0 does.
    store, _, _ = next(dist.rendezvous("env://", env.rank, env.world_size, timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=env.rank,
                            world_size=env.world_size, timeout=timeout, **kwargs)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun restarts reuse it
    _JOB["store"] = dist.PrefixStore(f"accordion-bench/{attempt}", store)


def shutdown() -> None:
    """Destroy the process group if one is up."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _JOB.pop("store", None)


def post_ending(rank: int, reason: str, own: bool, timeout_s: float) -> bool:
    """Post in the job's store how this rank ended: ``own`` if by its own error (or a signal),
    not because a collective failed. False if there is no store or it cannot be reached within
    ``timeout_s``."""
    store = _JOB.get("store")
    if store is None:
        return False
    try:
        store.set_timeout(timedelta(seconds=timeout_s))
        store.set(f"ended/{rank}", json.dumps({"own": own, "reason": reason}))
    except (RuntimeError, OSError):  # the store went with its host (rank 0, not under torchrun)
        return False
    return True


def endings(world_size: int, wait_s: float) -> dict[int, dict[str, object]] | None:
    """The ranks' posts (``{"own": bool, "reason": str}``), waiting up to ``wait_s`` for every
    rank to post; a rank missing from the result posted nothing (gone, or stopped). None if
    the store cannot be reached."""
    store = _JOB.get("store")
    if store is None:
        return None
    keys = [f"ended/{r}" for r in range(world_size)]
    deadline = time.monotonic() + wait_s
    try:
        store.set_timeout(timedelta(seconds=max(wait_s, 1.0)))
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return {r: json.loads(store.get(key)) for r, key in enumerate(keys) if store.check([key])}
    except (RuntimeError, OSError):
        return None


def check_master(nodes: int) -> None:
    """ConfigError if a job of ``nodes`` > 1 nodes has a master address that resolves to a
    loopback address here: the other nodes could not reach it (one line: what to set)."""
    host = os.environ.get("MASTER_ADDR", "")
    if nodes > 1 and netif.is_loopback(host):
        raise ConfigError(
            f"MASTER_ADDR: {host!r} resolves to {netif.resolve(host)} here, a loopback address, "
            f"but the job spans {nodes} nodes, which cannot reach it: set MASTER_ADDR to rank "
            f"0's address on the nodes' network (torchrun: --local-addr <the node's address> on "
            f"every node, --rdzv-conf is_host=true on the node of --rdzv-endpoint)")


def _nodes(env: DistEnv) -> int:
    """How many nodes the job spans, as its launcher says (1 if it does not)."""
    if env.launcher == "torchrun":
        return env.world_size // int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    if env.launcher == "submitit":
        return int(_submitit_job().num_nodes)
    return int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)


def _slurm_master_addr() -> str:
    """First host of the Slurm allocation (``SLURM_JOB_NODELIST``), resolved without
    `scontrol`."""
    nodelist = (os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
                or os.environ.get("SLURM_NODELIST", ""))
    if not nodelist:
        return socket.gethostname()
    return _first_host(nodelist)


def _first_host(nodelist: str) -> str:
    """``"gpu[012-015,020],cpu3"`` -> ``"gpu012"``: the first host of a Slurm host list."""
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    first = rest.split("]")[0].split(",")[0].split("-")[0]
    return prefix + first


def _slurm_port() -> int:
    """A port derived from the job id, so every task of the job picks the same one."""
    return 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000


def _submitit_job() -> Any:
    """submitit's view of this task (rank, tasks, hosts, job id)."""
    import submitit

    return submitit.JobEnvironment()


def _port_for(job_id: str) -> int:
    """A port in [20000, 40000) derived from the job id (e.g. "4242" or "4242_3"): the same for
    every task of the job."""
    return 20000 + zlib.crc32(job_id.encode()) % 20000
