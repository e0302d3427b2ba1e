"""Add your own compressor: the five steps of docs/compressors.md, run as the page writes them.

The user's class and config file are the page's code blocks whose first line names a file;
step 4 is the page's snippet, run as it is; step 5 is the page's command, as a real 2-rank
``torchrun run.py`` job (with the tests' tiny model and data). So the page cannot drift from
what works.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import compression
from core.errors import ConfigError
from tests.conftest import ROOT, TINY, assert_ok, read_rows, run_cli
from tests.references import random_steps

DOC = ROOT / "docs" / "compressors.md"
NAME = "scaled_sign"


def code_blocks(language: str) -> list[str]:
    """The page's fenced code blocks in ``language``."""
    text = DOC.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with the user's files from the page (step 1's module, step 3's config), on
    sys.path and the working directory; the registry forgets the compressor afterwards."""
    for block in code_blocks("python") + code_blocks("yaml"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.(py|yaml)", first):
            path = tmp_path / first[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block, encoding="utf-8")
    assert (tmp_path / "my_compressors.py").is_file()
    assert (tmp_path / "my_conf" / "compressor" / f"{NAME}.yaml").is_file()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    compression.REGISTRY.entries.pop(NAME, None)
    sys.modules.pop("my_compressors", None)


def scaled_sign_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    """The reference: the workers' mean of mean |g| sign(g) (sign(0) = +)."""
    return torch.stack([g.abs().mean() * torch.where(g < 0, -1.0, 1.0) for g in grads]).mean(0)


def test_step_4_runs_it_on_simulated_workers(user_dir: Path, capsys: pytest.CaptureFixture
                                             ) -> None:
    snippet = next(b for b in code_blocks("python") if f'simulate("{NAME}"' in b)
    exec(compile(snippet, "docs/compressors.md (step 4)", "exec"), {})  # noqa: S102
    assert len(capsys.readouterr().out.splitlines()) == 3
    steps = random_steps((16, 9), 3, 2)
    for (out, bits), grads in zip(compression.simulate(NAME, steps), steps, strict=True):
        torch.testing.assert_close(out, scaled_sign_mean(grads))
        assert bits == [32 + 144] * 3


@pytest.mark.slow
def test_step_5_trains_it_in_a_2_rank_ddp_run(user_dir: Path) -> None:
    command = next(b for b in code_blocks("bash") if f"compressor={NAME}" in b)
    assert "hydra.searchpath=[file://my_conf]" in command and "--nproc-per-node=2" in command
    run_dir = user_dir / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(user_dir), os.environ.get("PYTHONPATH", "")])}
    assert_ok(run_cli([*TINY, f"hydra.searchpath=[file://{user_dir / 'my_conf'}]",
                       f"compressor={NAME}", "trainer.epochs=1", f"hydra.run.dir={run_dir}"],
                      nproc=2, env=env))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["params_in_sync"]
    model = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    params = [v for k, v in model.items() if v.is_floating_point() and "running" not in k]
    per_step = sum(32 + v.numel() if v.ndim > 1 else 32 * v.numel() for v in params)
    wire = sum(32 + 32 * math.ceil(v.numel() / 32) if v.ndim > 1 else 32 * v.numel()
               for v in params)
    row = read_rows(run_dir)[0]
    steps = 128 // 32
    assert (row["comm/bits"], row["comm/wire_bits"]) == (steps * per_step, steps * wire)


def test_a_bad_target_is_one_line_naming_the_field(user_dir: Path) -> None:
    cases = {"no_such_module.Thing": "compressor._target_: cannot import",
             "my_compressors.NoSuchClass": "compressor._target_: cannot import",
             "math.sqrt": "compressor._target_: 'math.sqrt' is not a subclass",
             "my_compressors.ScaledSign": "compressor.name: 'topk' is taken by"}
    for target, message in cases.items():
        cfg = OmegaConf.create({"_target_": target, "name": "topk"})
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}[^\n]*$"):
            compression.build_compressor(cfg)
    with pytest.raises(ConfigError, match="^compressor.name: expected the name"):
        compression.build_compressor(OmegaConf.create({"_target_": "my_compressors.ScaledSign",
                                                       "name": None}))
    with pytest.raises(ConfigError, match="^compressor.level: unknown key"):
        compression.build_compressor(OmegaConf.create({"_target_": "my_compressors.ScaledSign",
                                                       "name": NAME, "level": 3}))
