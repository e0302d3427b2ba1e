"""Faults, in process: the record's files, the resume checks, non-finite gradients, the Accordion
ratio, how a failure is worded. (Real processes killed, stopped, starved: test_faults_e2e.py.)"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from omegaconf import OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
from compression import _grad_sum_kernel
from compression.hook import comm_hook
from core import record
from core.errors import ConfigError
from core.native import PORTABLE_ENV
from jobs import faults
from schedulers.accordion import History, replay
from tests.conftest import ROOT, TINY, assert_ok, read_rows, run_cli
from tests.references import bits_of, require_kernel
from training import checkpoint

# ---- the run record's files ------------------------------------------------------------------
ROWS = [{"epoch": 0, "train/loss": 2.0}, {"epoch": 1, "train/loss": 1.5}]


def _write_metrics(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_torn_last_metrics_line_is_dropped(tmp_path):
    whole = "".join(json.dumps(r) + "\n" for r in ROWS)
    path = _write_metrics(tmp_path / "metrics.jsonl", whole + '{"epoch": 2, "train/lo')
    assert record.read_metrics(path) == ROWS
    # A whole object whose newline was cut off is kept: its data is complete.
    _write_metrics(path, whole + json.dumps({"epoch": 2}))
    assert record.read_metrics(path) == [*ROWS, {"epoch": 2}]


def test_corrupt_metrics_line_names_the_file_and_line(tmp_path):
    path = _write_metrics(tmp_path / "metrics.jsonl",
                          json.dumps(ROWS[0]) + "\n\x00\x00garbage\n" + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: not a JSON object"):
        record.read_metrics(path)


def test_failed_atomic_write_keeps_the_old_file_and_removes_the_temp(tmp_path):
    path = tmp_path / "summary.json"
    record.write_summary(tmp_path, {"status": "completed"})

    def fail(f):
        f.write(b"{partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(record.RecordError, match=rf"cannot write {path}: No space left"):
        record.atomic_write_bytes(path, fail)
    assert json.loads(path.read_text()) == {"status": "completed"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_metrics_append_to_a_full_device_is_a_record_error(tmp_path):
    log = record.MetricsLog(tmp_path)
    log.write(ROWS[0])
    log._file.close()
    log._file = open("/dev/full", "a", encoding="utf-8")  # noqa: SIM115 (the kernel's ENOSPC)
    with pytest.raises(record.RecordError, match="No space left on device"):
        log.write(ROWS[1])
    assert log.rows == ROWS[:1]
    assert record.read_metrics(tmp_path / "metrics.jsonl") == ROWS[:1]


# ---- resume checks (before the group starts) --------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real one-process run of 2 epochs (its checkpoint and record)."""
    run_dir = tmp_path_factory.mktemp("run")
    assert_ok(run_cli([*TINY, "trainer.epochs=2", f"hydra.run.dir={run_dir}"]))
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


def _cfg(run_dir: Path, *changes: str):
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    for change in changes:
        key, value = change.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    return cfg


def test_intact_checkpoint_resumes(run_copy):
    assert checkpoint.check_resumable(run_copy, _cfg(run_copy, "trainer.epochs=9"), 1) == 2
    (run_copy / "summary.json").unlink()  # a run killed before its summary: still resumable
    assert checkpoint.check_resumable(run_copy, _cfg(run_copy), 1) == 2


UNREADABLE = re.escape("is not a readable checkpoint (truncated or corrupt")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:len(b) // 2], UNREADABLE),
    (lambda b: b"", UNREADABLE),
    (lambda b: os.urandom(len(b)), UNREADABLE),
    (lambda b: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 0xFF]) + b[len(b) // 2 + 1:],
     r"is corrupt \(its record \S+ fails its CRC check\)"),  # one flipped bit in the data
])
def test_damaged_checkpoint_is_refused_with_one_line(run_copy, damage, message):
    path = run_copy / "checkpoint.pt"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ConfigError, match=rf"^resume: {re.escape(str(path))} {message}") as caught:
        checkpoint.check_resumable(run_copy, _cfg(run_copy), 1)
    assert "\n" not in str(caught.value)


def test_foreign_file_is_not_a_checkpoint(run_copy):
    torch.save({"model": {}}, run_copy / "checkpoint.pt")
    with pytest.raises(ConfigError, match=r"not a checkpoint of this suite \(no epoch, "):
        checkpoint.check_resumable(run_copy, _cfg(run_copy), 1)


@pytest.mark.parametrize(("change", "key"), [
    ("model.width=16", "model.width: 8 in the checkpoint, 16 now"),
    ("compressor.name=topk", "compressor.name: 'none' in the checkpoint, 'topk' now"),
    ("optimizer.schedule.milestones=[1]", "optimizer.schedule.milestones: [] in the checkpoint"),
    ("trainer.num_workers=2", "trainer.num_workers: None in the checkpoint, 2 now"),
    ("seed=1", "seed: 0 in the checkpoint, 1 now"),
])
def test_checkpoint_of_another_config_is_refused_naming_the_key(run_copy, change, key):
    with pytest.raises(ConfigError, match=rf"^resume: {re.escape(key)}"):
        checkpoint.check_resumable(run_copy, _cfg(run_copy, change), 1)


def test_result_neutral_keys_may_differ(run_copy):
    cfg = _cfg(run_copy, "trainer.epochs=5", "logger.project=other", "trainer.progress=true",
               "trainer.dist_timeout_s=9", "name=renamed", "dataset.root=/elsewhere")
    assert checkpoint.check_resumable(run_copy, cfg, 1) == 2


def test_config_difference_sees_added_and_removed_keys():
    assert checkpoint.config_difference({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == \
        "a.c: '(absent)' in the checkpoint, 2 now"
    assert checkpoint.config_difference({"a": 1, "z": 3}, {"a": 1}) == \
        "z: 3 in the checkpoint, '(absent)' now"
    assert checkpoint.config_difference({"logger": {"x": 1}}, {"logger": {"x": 2}}) is None


def test_other_world_size_and_lost_epochs_are_refused(run_copy):
    with pytest.raises(ConfigError, match=r"written by 1 ranks; resume it with the same number"):
        checkpoint.check_resumable(run_copy, _cfg(run_copy), 2)
    rows = record.read_metrics(run_copy / "metrics.jsonl")
    (run_copy / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(ConfigError, match=r"holds 1 complete epochs but .* continues from epoch 2"):
        checkpoint.check_resumable(run_copy, _cfg(run_copy), 1)


def test_cli_resume_of_a_truncated_checkpoint_is_one_line_exit_2(run_copy):
    path = run_copy / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:1000])
    proc = run_cli([*TINY, "trainer.epochs=3", "resume=true", f"hydra.run.dir={run_copy}"],
                   timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: resume: {path} is not a readable checkpoint")


@pytest.mark.slow
def test_cli_resume_after_a_torn_line_and_no_summary_keeps_every_epoch(run_copy):
    before = read_rows(run_copy)
    with (run_copy / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 2, "lr": 0.1, "train/lo')  # a write cut short
    (run_copy / "summary.json").unlink()              # killed before its summary
    assert_ok(run_cli([*TINY, "trainer.epochs=3", "resume=true", f"hydra.run.dir={run_copy}"]))
    after = read_rows(run_copy)
    assert [r["epoch"] for r in after] == [0, 1, 2] and after[:2] == before
    assert json.loads((run_copy / "summary.json").read_text())["status"] == "completed"


# ---- non-finite gradients ------------------------------------------------------------------
def test_grad_sum_kernel_is_bitwise_add_and_sees_inf_and_nan():
    require_kernel(_grad_sum_kernel.LIBRARY)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 8, 9, 1000, 4099):
        acc, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
        acc[0], grad[-1] = -0.0, 1e-45  # -0 and a denormal add as torch adds them
        expected = acc + grad
        assert _grad_sum_kernel.add_finite(acc, grad) is True
        assert torch.equal(bits_of(acc), bits_of(expected))
        for bad in (math.inf, -math.inf, math.nan):
            for at in {0, n // 2, n - 1}:
                a, g = torch.zeros(n), torch.zeros(n)
                g[at] = bad
                assert _grad_sum_kernel.add_finite(a, g) is False, (n, bad, at)
    big = torch.full((16,), 3e38)
    assert _grad_sum_kernel.add_finite(big, big.clone()) is False  # overflow to inf
    assert _grad_sum_kernel.add_finite(torch.zeros(4, dtype=torch.float64),
                                       torch.zeros(4, dtype=torch.float64)) is None


@pytest.mark.slow
def test_grad_sum_portable_loop_is_the_same():
    require_kernel(_grad_sum_kernel.LIBRARY)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::test_grad_sum_kernel_is_bitwise_add_and_sees_inf_and_nan"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, PORTABLE_ENV: "1"})
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-2000:]


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train_steps(compressor: str, poison: dict[int, list[tuple[str, float]]], steps: int = 4,
                 dtype: torch.dtype = torch.float32, asked: int | None = None
                 ) -> compression.HookState:
    """A real (world-size-1) DDP model with the hook; ``poison[step] = [(parameter, factor),
    ...]`` multiplies those parameters' gradients at that step; after step ``asked`` the
    state's ``nonfinite()`` is asked (as a mid-epoch checkpoint does) and must be None."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.Linear(16, 3)).to(dtype)
    state = compression.build(OmegaConf.create({"name": compressor}), model.named_parameters())
    ddp = DDP(model)
    ddp.register_comm_hook(state, comm_hook)
    params = dict(model.named_parameters())
    for step in range(steps):
        handles = [params[name].register_hook(lambda g, f=factor: g * f)
                   for name, factor in poison.get(step, [])]
        ddp(torch.randn(5, 2, 4, 4, dtype=dtype)).sum().backward()
        for handle in handles:
            handle.remove()
        if step == asked:
            assert state.nonfinite() is None
    return state


@pytest.mark.parametrize("compressor", ["none", "topk", "adacomp"])
def test_hook_names_the_first_step_and_layer_whose_sum_stops_being_finite(group, compressor):
    _first_nonfinite_step_and_layers(compressor, torch.float32)


def test_hook_checks_without_the_kernel_too(group):
    # float64: no kernel; the sums are checked together when nonfinite() is asked
    _first_nonfinite_step_and_layers("none", torch.float64)


def _first_nonfinite_step_and_layers(compressor: str, dtype: torch.dtype) -> None:
    assert _train_steps(compressor, {}, dtype=dtype).nonfinite() is None
    state = _train_steps(compressor, {1: [("0.bias", math.nan)],
                                      2: [("2.weight", math.inf), ("0.weight", math.nan)],
                                      3: [("2.bias", math.nan)]}, dtype=dtype, asked=0)
    # each layer named once, with the first step only (0.bias stays NaN at steps 2 and 3)
    assert state.nonfinite() == (1, ["0.bias"]) == state.nonfinite()
    state.reset_epoch()
    steps = _train_steps(compressor, {2: [("2.weight", math.inf), ("0.weight", math.nan)],
                                      3: [("2.bias", math.nan)]}, dtype=dtype)
    assert steps.nonfinite()[0] == 2 and sorted(steps.nonfinite()[1]) == ["0.weight", "2.weight"]
    steps.reset_epoch()
    assert steps.nonfinite() is None


def test_describe_nonfinite_names_layer_rank_epoch_and_step():
    text = faults.describe_nonfinite(3, [(0, 5, ["a", "b"]), (1, 4, ["conv1.weight"])])
    assert text.startswith("non-finite gradient in layer conv1.weight on rank 1 at epoch 3, "
                           "step 4")
    assert "(and 1 more)" in faults.describe_nonfinite(0, [(0, 1, ["a", "b"])])


def test_injection_is_off_unless_asked(monkeypatch):
    model = nn.Linear(2, 2)
    monkeypatch.delenv(faults.INJECT_ENV, raising=False)
    faults.inject_from_env(model, 0)
    assert not model.weight._backward_hooks
    monkeypatch.setenv(faults.INJECT_ENV, "weight@0:1=nan")
    faults.inject_from_env(model, 0)
    grads = []
    for _ in range(3):
        model.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        grads.append(bool(model.weight.grad.isnan().all()))
    assert grads == [False, True, False]
    monkeypatch.setenv(faults.INJECT_ENV, "nope@0:1=nan")
    with pytest.raises(ConfigError, match=rf"^{faults.INJECT_ENV}: expected"):
        faults.inject_from_env(model, 0)


def test_nan_ratio_is_critical_and_logged(caplog):
    # Epoch 2 is a check epoch (interval 2) whose ratio is NaN (the norms of epochs 0 and 2 are
    # inf): critical, where ratio >= eta would say it is not.
    norms = [{"w": math.inf}, {"w": 1.0}, {"w": math.inf}]  # |inf - inf| / inf
    assert replay(norms, [0.1] * 4, interval=2)[3] == {"w": True}
    calm = [{"w": 1.0}, {"w": 1.0}, {"w": 1.1}]
    assert replay(calm, [0.1] * 4, interval=2)[3] == {"w": False}
    history = History(0.5, 2)
    for epoch, n in enumerate(norms):
        history.record(epoch, n, 0.1, 0.1)
    assert math.isnan(history.ratios(2, ["w"])["w"])
    assert "NaN ratio at epoch 2 for w" in caplog.text


# ---- how a failure is worded -----------------------------------------------------------------
def test_gloo_errors_read_as_their_gist():
    closed = RuntimeError("Unable to cast [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                          "tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:41672. This is "
                          "typically caused by a remote worker crashing. GLHF! to Tensor")
    assert faults.is_peer_failure(closed)
    assert faults.reason(closed) == "RuntimeError: Connection closed by peer [127.0.0.1]:41672"
    later = RuntimeError("Unable to cast Application timeout caused pair closure to Tensor")
    assert faults.reason(later) == "RuntimeError: Application timeout caused pair closure"
    assert not faults.is_peer_failure(RuntimeError("DataLoader timed out"))
    assert faults.reason(ValueError("a\nb")) == "ValueError: a"
