"""Launcher detection, the process-group timeout (a dead rank must not hang the job), and the
settings several nodes need (a reachable master address, gloo's interface)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core import distributed, netif
from core.errors import ConfigError


def test_detect_single(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.detect() == distributed.DistEnv(0, 1, 0, "single")


def test_detect_torchrun_wins_over_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.detect() == distributed.DistEnv(3, 4, 1, "torchrun")


def test_detect_slurm(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "6")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "2")
    env = distributed.detect()
    assert env == distributed.DistEnv(6, 8, 2, "slurm") and not env.is_main


def test_detect_submitit_local(monkeypatch):
    # What submitit's local executor gives each task (the Slurm executor reads SLURM_* instead).
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    for var, value in (("JOB_ID", "4242"), ("NTASKS", "2"), ("JOB_NUM_NODES", "1"),
                       ("NODEID", "0"), ("GLOBALID", "1"), ("LOCALID", "1")):
        monkeypatch.setenv(f"SUBMITIT_LOCAL_{var}", value)
    env = distributed.detect()
    assert env == distributed.DistEnv(1, 2, 1, "submitit")
    assert distributed._port_for("4242") == distributed._port_for("4242")
    assert 20000 <= distributed._port_for("4242_3") < 40000
    monkeypatch.setenv("SUBMITIT_LOCAL_NTASKS", "1")  # one task: no process group to join
    assert distributed.detect().launcher == "single"


# ---- which GPU a rank takes (before any process group starts) -----------------------------
@pytest.mark.parametrize(("local_rank", "visible", "slurm", "index"), [
    (0, 1, False, 0), (3, 4, False, 3), (3, 8, True, 3),  # every rank sees the node's GPUs
    (0, 1, True, 0), (3, 1, True, 0),                     # Slurm bound one GPU to the task
])
def test_each_rank_takes_its_own_gpu(local_rank, visible, slurm, index):
    assert distributed.cuda_index(local_rank, visible, slurm) == index


@pytest.mark.parametrize(("local_rank", "visible", "slurm", "message"), [
    (1, 1, False, "trainer.device: local rank 1 has no GPU of its own: this process sees 1 CUDA "
                  "device (CUDA_VISIBLE_DEVICES=0); start at most 1 rank per node, or set "
                  "trainer.device=cpu"),
    (2, 0, False, "trainer.device: local rank 2 has no GPU of its own: this process sees 0 CUDA "
                  "devices (CUDA_VISIBLE_DEVICES=0); start at most 0 ranks per node, or set "
                  "trainer.device=cpu"),
    (3, 2, True, "trainer.device: local rank 3 has no GPU of its own: this process sees 2 CUDA "
                 "devices (CUDA_VISIBLE_DEVICES=0); start at most 2 ranks per node, or have "
                 "Slurm bind one GPU to each task (--gpus-per-task=1), or set trainer.device=cpu"),
])
def test_a_rank_without_a_gpu_of_its_own_is_one_line(monkeypatch, local_rank, visible, slurm,
                                                     message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigError) as info:
        distributed.cuda_index(local_rank, visible, slurm)
    assert str(info.value) == message


def test_slurm_may_bind_gpus_to_its_tasks_only(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert distributed.slurm_binds_gpus(distributed.DistEnv(1, 4, 1, "slurm"))
    for launcher in ("torchrun", "single", "submitit"):
        assert not distributed.slurm_binds_gpus(distributed.DistEnv(1, 4, 1, launcher))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # submitit's tasks under srun
    assert distributed.slurm_binds_gpus(distributed.DistEnv(1, 4, 1, "submitit"))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")  # every task sees the same GPUs
    assert not distributed.slurm_binds_gpus(distributed.DistEnv(1, 4, 1, "submitit"))


def test_cpu_runs_take_no_gpu():
    env = distributed.DistEnv(3, 4, 3, "torchrun")
    assert distributed.device_for(env, "cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert distributed.device_for(env, "auto") == torch.device("cpu")


@pytest.mark.parametrize(("nodelist", "host"), [
    ("node7", "node7"), ("gpu[012-015,020]", "gpu012"), ("a[3,5],b1", "a3"),
    ("cpu1,cpu2", "cpu1"), ("x[9]", "x9"),
])
def test_first_host_of_slurm_nodelist(nodelist, host):
    assert distributed._first_host(nodelist) == host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, queue) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    env = distributed.detect()
    distributed.init(env, torch.device("cpu"), timeout_s=3)
    if rank == 1:
        return  # a rank that dies: never joins the next collective
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        queue.put(("no error", time.monotonic() - start))
    except RuntimeError as exc:
        queue.put((type(exc).__name__, time.monotonic() - start))


@pytest.mark.slow
def test_dead_rank_ends_the_job_with_an_error_not_a_hang():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    outcome, waited = queue.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert outcome == "RuntimeError"
    assert waited < 60


def test_the_master_address_of_several_nodes_must_not_be_a_loopback_one(monkeypatch):
    # As torchrun gives every worker the fqdn of node 0's agent when --local-addr is not set:
    # here (Debian, containers) it resolves to 127.x, which the other nodes cannot reach.
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    distributed.check_master(1)  # one node: fine
    with pytest.raises(ConfigError, match=r"^MASTER_ADDR: 'localhost' resolves to 127\.0\.0\.1 "
                                          r"here, a loopback address, but the job spans 2 nodes.*"
                                          r"--local-addr"):
        distributed.check_master(2)
    monkeypatch.setenv("MASTER_ADDR", _routable_address() or "localhost")
    if netif.resolve(os.environ["MASTER_ADDR"]) != "127.0.0.1":
        distributed.check_master(2)


def _routable_address() -> str | None:
    """This host's address on an interface other than lo, if it has one."""
    found = (netif.address_of(name) for _, name in socket.if_nameindex() if name != "lo")
    return next((a for a in found if a is not None), None)


def test_gloo_interface_is_the_one_holding_the_address_that_reaches_the_master():
    assert netif.interface_to("127.0.0.1") is None  # one host: gloo's own choice stands
    assert netif.interface_to("no-such-host.invalid") is None
    address = _routable_address()
    if address is None:
        pytest.skip("this host has no interface but lo")
    (name,) = [n for _, n in socket.if_nameindex() if netif.address_of(n) == address]
    assert netif.local_address_to(address) == address  # this host's own address
    assert netif.interface_to(address) == name


@pytest.mark.parametrize(("variables", "nodes"), [
    ({"LOCAL_WORLD_SIZE": "2"}, 2), ({"LOCAL_WORLD_SIZE": "4"}, 1), ({}, 1),
])
def test_a_torchrun_job_s_nodes(monkeypatch, variables, nodes):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    assert distributed._nodes(distributed.DistEnv(0, 4, 0, "torchrun")) == nodes


def test_an_srun_job_s_master_address_is_the_first_node_of_its_allocation(monkeypatch):
    for var in ("SLURM_STEP_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "accbnode[1-2]")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert distributed._slurm_master_addr() == "accbnode1"
    assert distributed._nodes(distributed.DistEnv(1, 2, 0, "slurm")) == 2
