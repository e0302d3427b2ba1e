"""Real run records for the analysis tests: ten tiny runs of `run.py`, trained once.

The runs of one `python run.py -m` sweep over a config group written here, each option one run
(forked by ``run_cli``: ``tests.conftest.run_options``), with the run identity of
docs/run-record.md:

- ``table1``: PowerSGD rank 2 (the baseline), rank 1 and Accordion 2 <-> 1 (interval 1: epochs
  0-1 critical, epoch 2 decided by the norms), seeds 0 and 1; seed 0 with an offline W&B run;
- ``table5``: no compression, batch 32 (the baseline) and Accordion batch 32 <-> 64, seed 0;
- ``adacomp``: no compression (the baseline) and AdaComp (conv bin 50, FC bin 500), seed 0.

Every run: ResNet-18 at width 8 on 64 digits (2 steps an epoch), tested on 64, 3 epochs; a few
seconds of CPU each. Directory names are the runs' numbers: the analysis never reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from core import record
from tests.conftest import run_options

GROUP = "analysis_fixture"
COMMON = ["model.width=8", "dataset.subset=64", "dataset.test_subset=64", "trainer.batch_size=32",
          "trainer.epochs=3", "trainer.progress=false", "trainer.device=cpu", "optimizer.lr=0.1",
          "optimizer.schedule.warmup_epochs=0"]  # the optimizer pinned, as TINY pins it


@dataclass
class Spec:
    """One run group of the fixture."""

    sweep: str
    method: str
    baseline: str
    seeds: tuple[int, ...] = (0,)
    defaults: dict[str, str] = field(default_factory=dict)  # config group -> option
    keys: dict[str, dict[str, object]] = field(default_factory=dict)  # group -> key -> value
    wandb: bool = False  # an offline W&B run (seed 0 only)

    def option(self, seed: int) -> str:
        """The config file of this group's run with ``seed``."""
        defaults = [f"  - override /{g}: {c}" for g, c in self.defaults.items()]
        if not (self.wandb and seed == 0):
            defaults.append("  - override /logger: none")
        lines = ["# @package _global_", "defaults:", *defaults,
                 f"sweep: {self.sweep}", "scale: tiny", f"method: {self.method}",
                 "variant: ours", f"baseline: {self.baseline}", f"seed: {seed}"]
        for group, values in self.keys.items():
            lines += [f"{group}:", *(f"  {k}: {v}" for k, v in values.items())]
        return "\n".join(lines) + "\n"


POWERSGD = {"compressor": "powersgd"}
SPECS = [
    Spec("table1", "rank2", "rank2", (0, 1), POWERSGD, {"compressor": {"rank": 2}}, True),
    Spec("table1", "rank1", "rank2", (0, 1), POWERSGD, {"compressor": {"rank": 1}}, True),
    Spec("table1", "accordion_rank2_rank1", "rank2", (0, 1),
         {**POWERSGD, "scheduler": "accordion"},
         {"scheduler": {"low": 2, "high": 1, "interval": 1}}, True),
    Spec("table5", "batch512", "batch512"),
    Spec("table5", "accordion_batch512_batch4096", "batch512",
         defaults={"scheduler": "accordion_batch"},
         keys={"scheduler": {"batch_low": 32, "batch_high": 64, "interval": 1}}),
    Spec("adacomp", "none", "none"),
    Spec("adacomp", "adacomp", "none", defaults={"compressor": "adacomp"}),
]


def train_fixture_runs(root: Path) -> Path:
    """Train every run below ``root`` in one process; returns the runs dir."""
    conf = root / "conf" / GROUP
    conf.mkdir(parents=True)
    options = []
    for i, spec in enumerate(SPECS):
        for seed in spec.seeds:
            options.append(f"g{i}_s{seed}")
            (conf / f"{options[-1]}.yaml").write_text(spec.option(seed))
    return run_options(root / "conf", GROUP, options, COMMON, root / "runs",
                       env={"WANDB_MODE": "offline"})


# ---- run records written by hand (fast tests of what real runs rarely show) -----------------
MACHINE_A = {"fingerprint": "a1b2c3d4e5f6", "machine": "Intel Xeon (AVX512) x2, cpu"}
MACHINE_B = {"fingerprint": "0f1e2d3c4b5a", "machine": "AMD EPYC (AVX2) x2, cpu"}
COMMIT_1, COMMIT_2 = "1" * 40, "2" * 40


def provenance(machine: dict[str, str], commit: str | None = COMMIT_1, dirty: bool = False,
               numerics: str = "portable") -> dict:
    """A ``summary.json`` ``provenance`` dict as docs/run-record.md specifies it (the keys
    core/provenance.py writes; a few of the versions and CPU fields)."""
    return {**machine, "git": {"commit": commit, "dirty": dirty,
                               "diff_sha256": "d1ff" * 16 if dirty else None},
            "versions": {"python": "3.11.9", "torch": "2.14.1"},
            "cpu": {"isa": "AVX2", "flags": ["avx", "avx2"], "logical_cpus": 2},
            "numerics": {"mode": numerics, "intra_op_threads": 1}, "cuda": None,
            "world_size": 2, "launcher": "torchrun", "hostname": "node1"}


def epoch_row(epoch: int, accuracy: float, bits: float = 1e6, loss: float = 1.0) -> dict:
    """One ``metrics.jsonl`` row with the keys the tables read."""
    return {"epoch": epoch, "train/loss": loss, "test/accuracy": accuracy, "comm/bits": bits,
            "comm/bits_dense": 1e8, "time/epoch_s": 1.0, "lr": 0.1, "batch_size": 32}


def write_record(root: Path, name: str, run: dict, rows: list[dict], status: str = "completed",
                 **summary: object) -> Path:
    """A run directory as run.py leaves it: ``.hydra/config.yaml`` (``run``: ``sweep``,
    ``method``, ``seed``, ..., and ``model``/``dataset``/``compressor`` names), ``metrics.jsonl``
    and ``summary.json`` (``status``; ``summary`` adds keys, e.g. ``provenance``, ``starts``)."""
    run_dir = root / name
    (run_dir / ".hydra").mkdir(parents=True)
    config = {"scale": "tiny", "variant": "ours", "seed": 0, "model": {"name": "resnet18"},
              "dataset": {"name": "synthetic"}, "compressor": {"name": "powersgd"},
              "scheduler": {"name": "static"}, **run}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = {**record.summarize(rows, status, "test/accuracy", 1.0), "params_in_sync": True,
               **summary}
    (run_dir / "summary.json").write_text(json.dumps(written))
    return run_dir


# ---- reading the records by hand (the tests' independent view) -----------------------------
def read_by_hand(runs: Path) -> list[dict]:
    """Every run below ``runs``: its dir, resolved-enough config keys and metrics rows, read with
    plain json / yaml (not the analysis code)."""
    out = []
    for config in sorted(runs.glob("*/.hydra/config.yaml")):
        run_dir = config.parent.parent
        cfg = yaml.safe_load(config.read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((run_dir / "summary.json").read_text())
        out.append({"dir": run_dir, "cfg": cfg, "rows": rows, "summary": summary})
    return out


if __name__ == "__main__":  # python -m tests.analysis_fixture DIR: the same runs, to look at
    import sys

    print(train_fixture_runs(Path(sys.argv[1])))
