"""``make bench-portable-step`` at one step: each setting runs under the knobs it names, the
portable one computes the bits a portable run computes, and the shares add up. Nothing here
asserts a time."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

import pytest
import torch

from benchmarks import portable_step
from tests.conftest import ROOT

# One portable step computed apart from the benchmark: its gradients' hash.
REFERENCE = """
import hashlib, torch
from core import numerics
numerics.apply("portable")
from torch.nn import functional as F
from models import build
torch.manual_seed(0)
model = build("resnet18", 10, width=8)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
F.cross_entropy(model(x), y).backward()
print(hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in model.parameters()))
      .hexdigest()[:12])
"""


@pytest.mark.slow
def test_each_setting_runs_as_named_and_portable_gives_a_portable_runs_bits(tmp_path):
    # one model (each setting a process of its own; GoogLeNet's rows come the same way)
    portable_step.main(["--steps", "1", "--rounds", "2", "--profiled", "1", "--models",
                        "resnet18", "--out", str(tmp_path)])
    with open(tmp_path / "portable_step.csv") as f:
        rows = {(r["model"], r["setting"]): r for r in csv.DictReader(f)}
    assert list(rows) == [("resnet18", s) for s in portable_step.SETTINGS]
    reference = subprocess.run([sys.executable, "-c", REFERENCE], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.strip()
    portable, own, avx2, native = (rows["resnet18", s] for s in portable_step.SETTINGS)
    for row in (portable, own):
        assert (row["capability"], row["mkl"], row["mkldnn"]) == (
            "DEFAULT", "COMPATIBLE", "False")
    assert (portable["exact_ops"], own["exact_ops"], avx2["exact_ops"]) == (
        "True", "False", "False")
    assert own["grad_hash"] == portable["grad_hash"]  # core/exact_ops.py: the same bits
    assert (avx2["mkl"], avx2["mkldnn"]) == ("COMPATIBLE", "False")
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # the machine has AVX2
        assert avx2["capability"] == "AVX2"
    assert native["mkldnn"] == str(torch.backends.mkldnn.is_available())
    assert portable["grad_hash"] == reference
    assert all(len(r["ms_rounds"].split(" / ")) == 2 for r in rows.values())  # each round
    for row in rows.values():
        shares = [float(v) for k, v in row.items() if k.startswith("share ")]
        assert math.isclose(sum(shares), 1.0, rel_tol=1e-6) and min(shares) >= 0
    text = (tmp_path / "portable_step.md").read_text()
    assert f"(fingerprint {portable['fingerprint']})" in text
