"""End-to-end runs of `run.py`: one process, two real gloo ranks, resume, W&B, logger failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, assert_ok, read_rows, run_cli, same_rows, same_weights

EPOCH_KEYS = {"epoch", "lr", "train/loss", "test/loss", "test/accuracy", "comm/bits",
              "comm/bits_dense", "time/epoch_s", "samples_per_s", "time/compress_s"}
SUMMARY_KEYS = {"status", "final", "best", "total_bits", "total_time_s", "params_in_sync"}


def _check_record(run_dir, epochs: int, world_size: int) -> list[dict]:
    rows = read_rows(run_dir)
    assert [r["epoch"] for r in rows] == list(range(epochs))
    model = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    weights = [k for k, v in model.items() if v.is_floating_point() and "running" not in k]
    for row in rows:
        assert row.keys() >= EPOCH_KEYS
        assert {f"grad_norm/{k}" for k in weights} <= row.keys()
        # fp32 all-reduce of everything: 32 bits per gradient element per step.
        numel = sum(model[k].numel() for k in weights)
        steps = 128 // 32
        assert row["comm/bits"] == row["comm/bits_dense"] == 32 * numel * steps
        assert 0.0 <= row["test/accuracy"] <= 100.0
        assert all(row[f"grad_norm/{k}"] > 0 for k in weights)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["status"] == "completed" and summary["params_in_sync"] is True
    assert summary["final"] == rows[-1]["test/accuracy"]
    assert summary["total_bits"] == sum(r["comm/bits"] for r in rows)
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    return rows


def test_single_process_run_leaves_record(tmp_path):
    proc = run_cli([*TINY, "trainer.epochs=2", f"hydra.run.dir={tmp_path}"], fresh=True)
    assert_ok(proc)
    rows = _check_record(tmp_path, epochs=2, world_size=1)
    assert rows[1]["train/loss"] < rows[0]["train/loss"]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank gloo run of 3 epochs that nothing stops, under the real torchrun (read-only:
    three tests read it)."""
    run_dir = tmp_path_factory.mktemp("two_rank") / "run"
    assert_ok(run_cli([*TINY, "trainer.epochs=3", f"hydra.run.dir={run_dir}"], nproc=2,
                      fresh=True))
    return run_dir


@pytest.mark.slow
def test_two_rank_gloo_run_keeps_ranks_in_sync(two_rank_run):
    _check_record(two_rank_run, epochs=3, world_size=2)
    assert not any(p.name.startswith(".hydra") for p in two_rank_run.parent.iterdir()
                   if p != two_rank_run)


@pytest.mark.slow
def test_forked_ranks_give_torchruns_run_bit_for_bit(tmp_path, two_rank_run):
    # Most of the suite's runs are forked by tests/forkserver.py, not started by torchrun.
    proc = run_cli([*TINY, "trainer.epochs=3", f"hydra.run.dir={tmp_path}"], nproc=2)
    assert_ok(proc)
    assert proc.args[0] == "forkserver"
    same_rows(read_rows(two_rank_run), read_rows(tmp_path))
    same_weights(two_rank_run, tmp_path)
    provenance = [json.loads((d / "summary.json").read_text())["provenance"]
                  for d in (two_rank_run, tmp_path)]
    assert provenance[0]["launcher"] == provenance[1]["launcher"] == "torchrun"
    assert provenance[0]["numerics"] == provenance[1]["numerics"]


def test_forked_run_past_its_timeout_is_killed_and_the_next_is_served(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli([*TINY, "trainer.epochs=100", f"hydra.run.dir={tmp_path / 'long'}"], nproc=2,
                timeout=4)
    assert not (tmp_path / "long" / "summary.json").exists()  # killed: never ended
    proc = run_cli([*TINY, "trainer.epochs=1", f"hydra.run.dir={tmp_path / 'next'}"], nproc=2)
    assert_ok(proc)
    assert proc.args[0] == "forkserver"
    # A variable read at start-up cannot change in a forked process: such a run starts afresh.
    proc = run_cli([*TINY, "trainer.epochs=0", f"hydra.run.dir={tmp_path / 'bad'}"],
                   env={"OMP_NUM_THREADS": "2"})
    assert proc.args[0] == sys.executable and proc.returncode == 2, proc.stderr[-2000:]


@pytest.mark.slow
def test_resume_is_bit_exact(tmp_path, two_rank_run):
    straight, resumed = two_rank_run, tmp_path / "resumed"
    assert_ok(run_cli([*TINY, "trainer.epochs=1", f"hydra.run.dir={resumed}"], nproc=2))
    assert_ok(run_cli([*TINY, "trainer.epochs=3", "resume=true", f"hydra.run.dir={resumed}"],
                      nproc=2))
    a, b = read_rows(straight), read_rows(resumed)
    assert len(a) == 3
    same_rows(a, b)
    ca = torch.load(straight / "checkpoint.pt", weights_only=True)
    cb = torch.load(resumed / "checkpoint.pt", weights_only=True)
    for key, value in ca["model"].items():
        assert torch.equal(value, cb["model"][key]), key


def test_resume_with_other_world_size_is_refused(tmp_path):
    assert_ok(run_cli([*TINY, "trainer.epochs=1", f"hydra.run.dir={tmp_path}"]))
    proc = run_cli([*TINY, "trainer.epochs=2", "resume=true", f"hydra.run.dir={tmp_path}"],
                   nproc=2)
    assert proc.returncode != 0
    assert "resume: " in proc.stderr and "written by 1 ranks" in proc.stderr


@pytest.mark.slow
def test_wandb_offline_run_records_the_same_keys(tmp_path):
    assert_ok(run_cli([*TINY, "trainer.epochs=1", "logger=wandb", f"hydra.run.dir={tmp_path}"],
                      env={"WANDB_MODE": "offline"}))
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    blob = log.read_bytes()
    for key in ("train/loss", "test/accuracy", "comm/bits", "grad_norm/conv1.weight"):
        assert key.encode() in blob, key
    assert b"resnet18-digits-none-static" in blob  # the group = the experiment name
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("provenance.fingerprint", "provenance.git.commit", "provenance.cpu.model"):
        assert key.encode() in blob, key  # the run's config on W&B holds its provenance
    assert summary["provenance"]["fingerprint"].encode() in blob
    _check_record(tmp_path, epochs=1, world_size=1)


def test_logger_failure_warns_once_and_training_goes_on(tmp_path):
    # Online without an API key: W&B refuses to start (at once, without a network call; its
    # server is a closed loopback port all the same). Too long a tag is a config error now.
    proc = run_cli([*TINY, "trainer.epochs=2", "logger=wandb", "logger.mode=online",
                    f"hydra.run.dir={tmp_path}"],
                   env={"WANDB_API_KEY": "", "HOME": str(tmp_path / "home"),
                        "WANDB_BASE_URL": "http://127.0.0.1:9"})
    assert_ok(proc)
    assert proc.stderr.count("W&B failed to start") == 1
    assert "continuing with the local run record only" in proc.stderr
    _check_record(tmp_path, epochs=2, world_size=1)


@pytest.mark.slow
def test_two_rank_lstm_gets_near_the_perplexity_floor(tmp_path, compose_cfg):
    from data.synthetic_text import perplexity_floor

    proc = run_cli(["experiment=lstm_synthetic_text", "logger=none", "trainer.progress=false",
                    "trainer.device=cpu", f"hydra.run.dir={tmp_path}"], nproc=2)
    assert_ok(proc)
    rows = read_rows(tmp_path)
    floor = perplexity_floor(compose_cfg("experiment=lstm_synthetic_text").dataset)
    final = rows[-1]["test/perplexity"]
    assert floor <= final <= 1.10 * floor, (final, floor)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["params_in_sync"] is True and summary["final"] == final
    assert rows[-1]["comm/bits"] == rows[-1]["comm/bits_dense"] > 0


@pytest.mark.slow
def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    # cifar10_cnn has no BatchNorm, so micro-batches change nothing but the summation order.
    common = ["model=cifar10_cnn", "dataset=synthetic", "dataset.subset=128", "logger=none",
              "trainer.batch_size=32", "trainer.epochs=1", "trainer.progress=false"]
    assert_ok(run_cli([*common, f"hydra.run.dir={tmp_path / 'big'}"], nproc=2))
    assert_ok(run_cli([*common, "trainer.micro_batch_size=4", f"hydra.run.dir={tmp_path / 'acc'}"],
                      nproc=2))
    big, acc = read_rows(tmp_path / "big"), read_rows(tmp_path / "acc")
    assert big[0]["comm/bits"] == acc[0]["comm/bits"]  # one communication per step either way
    # only the summation order differs: the loss agrees to 1e-6 relative and each weight tensor
    # to 1e-5 of its norm (single elements near zero differ more, so per tensor). Unscaled
    # micro-batch gradients, a dropped micro-batch or a convolution that takes another kernel
    # for the bigger batch (NNPACK's, before portable numerics turned it off: 1e-3) miss.
    assert acc[0]["train/loss"] == pytest.approx(big[0]["train/loss"], rel=1e-6)
    ma = torch.load(tmp_path / "big" / "checkpoint.pt", weights_only=True)["model"]
    mb = torch.load(tmp_path / "acc" / "checkpoint.pt", weights_only=True)["model"]
    for key in ma:
        assert (ma[key] - mb[key]).norm() <= 1e-5 * ma[key].norm(), key


def test_divergence_is_recorded_and_stops_the_run(tmp_path):
    assert_ok(run_cli([*TINY, "trainer.epochs=3", "optimizer.lr=1e30",
                       f"hydra.run.dir={tmp_path}"]))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["epochs_completed"] == len(read_rows(tmp_path)) < 3


@pytest.mark.slow
def test_sigterm_checkpoints_mid_epoch_and_the_run_resumes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    args = [sys.executable, "run.py", *TINY, "trainer.epochs=50", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "checkpoint.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("preempted: SIGTERM at epoch ")  # checkpointed mid-epoch
    done = len(read_rows(tmp_path))
    assert 1 <= done == summary["epochs_completed"]
    assert_ok(run_cli([*TINY, f"trainer.epochs={done + 1}", "resume=true",
                       f"hydra.run.dir={tmp_path}"]))
    assert [r["epoch"] for r in read_rows(tmp_path)] == list(range(done + 1))
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


def test_without_a_terminal_progress_comes_as_log_lines(tmp_path):
    # stderr is a pipe here: no bar, one line per progress_every_s (every step at 1e-6 s)
    proc = run_cli([*TINY, "trainer.epochs=1", "trainer.progress=auto",
                    "trainer.progress_every_s=1e-6", f"hydra.run.dir={tmp_path / 'a'}"])
    assert_ok(proc)
    steps = len([line for line in (proc.stdout + proc.stderr).splitlines()
                 if "epoch 0  step " in line and "train/loss" in line and "samples/s" in line])
    assert steps == 128 // 32  # dataset.subset / trainer.batch_size
    quiet = run_cli([*TINY, "trainer.epochs=1", "trainer.progress=false",
                     "trainer.progress_every_s=1e-6", f"hydra.run.dir={tmp_path / 'b'}"])
    assert_ok(quiet)
    assert "epoch 0  step " not in quiet.stdout + quiet.stderr
