"""The sweep's W&B workspace (analysis/dashboard.py), built and serialised up to the network call:
its runs filter, its grouping, and panels that plot keys a real run logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from analysis.dashboard import AUTO, SECTIONS, build_workspace
from tests.conftest import ROOT, TINY, assert_ok, read_rows, run_cli, run_make


def _model(workspace) -> dict:
    """The workspace as W&B's API receives it (what ``save()`` would upload)."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True)


def test_workspace_selects_the_sweeps_runs_grouped_by_method():
    model = _model(build_workspace("table1", "someone", "accordion-bench", scale="tiny"))
    assert (model["entity"], model["project"]) == ("someone", "accordion-bench")
    runset = model["spec"]["section"]["runSets"][0]
    filters = [(f["key"]["section"], f["key"]["name"], f["op"], f["value"])
               for f in runset["filters"]["filters"]]
    assert filters == [("run", "group", "=", "table1"), ("config", "scale", "=", "tiny")]
    assert [g["name"] for g in runset["grouping"]] == ["method.value", "variant.value"]
    sections = model["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == list(SECTIONS)
    assert all(p["config"]["xAxis"] == "_step" for s in sections for p in s["panels"])
    unscaled = _model(build_workspace("table5", "someone", "p"))["spec"]["section"]["runSets"][0]
    assert len(unscaled["filters"]["filters"]) == 1


@pytest.mark.slow
def test_panels_plot_keys_that_runs_log(tmp_path):
    assert_ok(run_cli([*TINY, "compressor=powersgd", "scheduler=accordion", "scheduler.interval=1",
                       "trainer.epochs=2", f"hydra.run.dir={tmp_path}"]))
    keys = set(read_rows(tmp_path)[-1])
    for section, panels in SECTIONS.items():
        if section == AUTO:  # accordion_auto's keys: tests/e2e/test_accordion_auto_e2e.py
            continue
        for panel in panels:
            if panel.metric_regex:
                assert any(re.match(panel.metric_regex, k) for k in keys), panel.title
            else:
                wanted = set(panel.y) - {"test/perplexity"}  # the LSTM's metric
                assert wanted <= keys, panel.title


@pytest.mark.parametrize("entity", [[], ["--entity", "someone"]])
def test_without_a_login_one_line_says_what_to_do(tmp_path, entity):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    proc = subprocess.run([sys.executable, "-m", "analysis.dashboard", "table1", *entity],
                          cwd=ROOT, env={**env, "HOME": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: W&B: ") and "`wandb login`" in line and "WANDB_API_KEY" in line


@pytest.mark.parametrize(("scale", "passed"), [([], ""), (["SCALE=tiny"], " --scale tiny")])
def test_make_dashboard_passes_scale(scale, passed):
    proc = run_make("-n", "dashboard", "SWEEP=table1", *scale)
    command = " ".join(proc.stdout.replace("\\\n", " ").split())
    assert command.endswith("-m analysis.dashboard table1" + passed)
