"""CUDA paths (nccl, AMP, pinned memory, the hook's stream, no host syncs): run only where a GPU
is present (``make smoke-gpu`` runs the multi-GPU checks: benchmarks/smoke_gpu.py)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
import models
from compression import _adacomp_kernel as adacomp_kernel
from compression.comm import CudaTimer
from compression.hook import HookState, comm_hook
from compression.topk import TopK
from core import distributed
from tests.conftest import TINY, read_rows, run_cli
from tests.references import bits_of, random_steps, require_kernel

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def test_cuda_single_process_run_with_amp(tmp_path):
    proc = run_cli([*[a for a in TINY if not a.startswith("trainer.device")],
                    "trainer.device=cuda", "trainer.amp=true", "trainer.epochs=2",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path)
    assert rows[1]["train/loss"] < rows[0]["train/loss"]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for nccl")
def test_two_rank_nccl_run(tmp_path):
    proc = run_cli([*[a for a in TINY if not a.startswith("trainer.device")],
                    "trainer.device=cuda", "trainer.epochs=1", f"hydra.run.dir={tmp_path}"],
                   nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["params_in_sync"] is True


def test_a_single_process_takes_gpu_0():
    env = distributed.DistEnv(0, 1, 0, "single")
    assert distributed.device_for(env, "cuda") == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0


# ---- the hook on CUDA: a world-size-1 NCCL group in this process -----------------------------
@pytest.fixture
def nccl() -> Iterator[None]:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


class WhereTopK(TopK):
    """Top-K that notes the CUDA stream its compression is queued on."""

    def compress(self, layer, grad, message):
        self.streams.add(torch.cuda.current_stream().cuda_stream)
        return super().compress(layer, grad, message)


def _step(ddp: DDP, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(ddp(x), y).backward()
    optimizer.step()


def _ddp(compressor: compression.Compressor, hook: Callable[..., Any] = comm_hook
         ) -> tuple[DDP, HookState, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width=8).cuda()
    state = HookState(compressor, model.named_parameters())
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.05)  # several buckets
    ddp.register_comm_hook(state, hook)
    return ddp, state, torch.optim.SGD(model.parameters(), lr=0.01)


def test_the_hook_queues_its_work_off_the_backward_stream(nccl):
    compressor = WhereTopK(ratio=0.1)
    compressor.streams = set()
    ddp, state, optimizer = _ddp(compressor)
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    for _ in range(3):
        _step(ddp, optimizer, x, y)
    assert compressor.streams == {state._stream.cuda_stream}
    assert state._stream.cuda_stream != torch.cuda.default_stream().cuda_stream
    assert isinstance(state.stats.timer, CudaTimer)
    stats = state.epoch_stats()
    assert stats["time/compress_s"] > 0 and stats["comm/bits"] > 0


@pytest.mark.parametrize("name", ["none", "topk", "adacomp", "powersgd", "ef_signsgd"])
def test_the_hook_gives_ddp_the_aggregate_the_cpu_gives(nccl, name):
    # One process: the aggregate is this worker's own decompressed gradient. DDP must read what
    # the same compressor makes on the CPU (one simulated worker) of the bucket's local
    # gradients (copied on the backward stream as the hook is called), that is, read the bucket
    # only after the hook's stream is done with it.
    local = {}

    def capture(state, bucket):  # DDP refuses a hook whose bucket annotation is not the class
        # itself (this file's annotations are strings: from __future__ import annotations)
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            local[id(p)] = g.detach().clone()
        return comm_hook(state, bucket)

    ddp, _, _ = _ddp(compression.create(name), capture)
    model = ddp.module
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    F.cross_entropy(ddp(x), y).backward()
    for pname, p in model.named_parameters():
        g = local[id(p)].cpu()
        if g.ndim <= 1 or name == "none":
            assert torch.equal(p.grad.cpu(), g), pname  # dense: the mean of one worker
            continue
        want, _ = compression.Simulation(name, 1, g.shape, layer_name=pname).step([g])
        tolerance = 0 if name in ("topk", "adacomp") else 1e-5 * float(want.abs().max())
        assert float((p.grad.cpu() - want).abs().max()) <= tolerance, pname


@pytest.mark.parametrize("name", ["none", "topk", "adacomp", "powersgd", "ef_signsgd"])
def test_no_host_sync_from_the_hook_in_the_steady_state(nccl, name):
    ddp, state, optimizer = _ddp(compression.create(name))
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    pair = state.compressor.accordion_levels
    for epoch in range(2):
        if pair is not None:
            state.set_levels(dict.fromkeys(state.compressed_layers(), pair[epoch]))
        state.reset_epoch(epoch)
        for step in range(4):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    _step(ddp, optimizer, x, y)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            ours = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
                    and Path(w.filename).resolve().is_relative_to(ROOT / "compression")]
            assert step < 2 or not ours, ours
        state.epoch_stats()


@pytest.mark.parametrize("name", ["topk", "adacomp"])
@pytest.mark.parametrize("workers", [3, 4])
def test_cuda_aggregates_are_the_cpus_bit_for_bit(name, workers):
    steps = random_steps((64, 3, 3, 3), workers, steps=3)
    cpu = compression.simulate(name, steps)
    cuda = compression.simulate(name, [[g.cuda() for g in grads] for grads in steps])
    for (out, bits), (out_c, bits_c) in zip(cpu, cuda, strict=True):
        assert [int(b) for b in bits_c] == bits
        assert torch.equal(bits_of(out), bits_of(out_c.cpu()))


def test_a_cpu_written_adacomp_state_resumes_on_cuda(tmp_path):
    # The memory as the CPU kernel leaves it between steps (G_q owed), loaded on CUDA as a
    # checkpoint loads it: settled in torch ops there, bit for bit the CPU run that went on.
    require_kernel(adacomp_kernel.LIBRARY)
    shape, steps = (30, 17), random_steps((30, 17), 2, steps=6)

    def run() -> compression.Simulation:
        return compression.Simulation("adacomp", 2, shape, conv_bin_size=5, fc_bin_size=5)

    whole, first = run(), run()
    want = [whole.step(grads) for grads in steps]
    for grads in steps[:3]:
        first.step(grads)
    torch.save([dict(layer.memory) for layer in first.layers], tmp_path / "memories.pt")
    resumed = run()
    for layer, memory in zip(resumed.layers, torch.load(tmp_path / "memories.pt"), strict=True):
        assert "owed" in memory
        layer.memory = {k: v.cuda() for k, v in memory.items()}
    for grads, (out_w, bits_w) in zip(steps[3:], want[3:], strict=True):
        out, bits = resumed.step([g.cuda() for g in grads])
        assert [int(b) for b in bits] == bits_w and torch.equal(bits_of(out.cpu()),
                                                                 bits_of(out_w))
