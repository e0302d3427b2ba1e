"""CUDA paths (nccl, AMP, pinned memory): run only where a GPU is present."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY, read_rows, run_cli

pytestmark = pytest.mark.gpu


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
