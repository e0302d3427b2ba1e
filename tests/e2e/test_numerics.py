"""trainer.numerics (core/numerics.py) and the provenance every run record carries
(core/provenance.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core import numerics, provenance
from core.errors import ConfigError
from tests.conftest import ROOT, TIMING, TINY, assert_ok, read_rows, run_cli

# The demo's run (tiny Table 1, ResNet-18 at rank 2), shortened.
DEMO = ["scale=tiny", "benchmark=cifar10", "model=resnet18", "method=rank2",
        "dataset.train_size=256", "dataset.test_size=100", "trainer.epochs=1", "logger=none",
        "trainer.progress=false"]
# Every knob that selects a CPU code path, set otherwise than a plain environment sets it.
KNOBS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
         "OMP_NUM_THREADS": "2"}


def _metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_rows(run_dir)]


@pytest.mark.slow
def test_portable_runs_give_the_same_bits_whatever_the_environment_sets(tmp_path):
    runs = {}
    for mode in ("portable", "native"):
        for name, env in (("plain", {"OMP_NUM_THREADS": "1"}), ("knobs", KNOBS)):
            run_dir = tmp_path / f"{mode}-{name}"
            assert_ok(run_cli([*DEMO, f"trainer.numerics={mode}", f"hydra.run.dir={run_dir}"],
                              nproc=2, env=env))
            runs[mode, name] = _metrics(run_dir)
    assert runs["portable", "plain"] == runs["portable", "knobs"]
    assert runs["native", "plain"] != runs["native", "knobs"]  # what portable protects against


def _in_fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2",
                               "ATEN_CPU_CAPABILITY": "avx2"}, timeout=120)


def test_portable_pins_every_knob_in_a_fresh_process():
    proc = _in_fresh_python("import json; from core import numerics; "
                            "numerics.apply('portable'); print(json.dumps(numerics.state()))")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert (state["cpu_capability"], state["mkl_cbwr"], state["mkldnn_enabled"],
            state["nnpack_enabled"], state["intra_op_threads"], state["inter_op_threads"]) == \
        ("DEFAULT", "COMPATIBLE", False, False, 1, 1)
    assert state["env"]["ATEN_CPU_CAPABILITY"] == "default"


def test_portable_refuses_a_process_where_torch_already_ran():
    proc = _in_fresh_python("import torch; (torch.ones(64) @ torch.ones(64, 64)).sum(); "
                            "from core import numerics; numerics.apply('portable')")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "ConfigError: trainer.numerics: portable could not pin ATen's CPU capability (AVX2), " \
           "MKL's branch (BRANCH_OFF) in this process" in last


def test_native_changes_nothing():
    proc = _in_fresh_python("import json; from core import numerics; "
                            "numerics.apply('native'); print(json.dumps(numerics.state()))")
    state = json.loads(proc.stdout)
    assert (state["cpu_capability"], state["intra_op_threads"]) == ("AVX2", 2)


def test_a_bad_mode_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"^trainer.numerics: 'fast' is not one of "
                                          r"\['portable', 'native'\]$"):
        numerics.check_mode("fast")
    proc = run_cli([*TINY, "trainer.numerics=fast"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "error: trainer.numerics: 'fast' is not one of ['portable', 'native']"


# ---- provenance ----------------------------------------------------------------------------
def test_every_start_is_recorded_with_its_machine_and_code(tmp_path):
    assert_ok(run_cli([*TINY, "trainer.epochs=1", f"hydra.run.dir={tmp_path}"]))
    assert_ok(run_cli([*TINY, "trainer.epochs=2", "resume=true", f"hydra.run.dir={tmp_path}"]))
    summary = json.loads((tmp_path / "summary.json").read_text())
    starts = summary["starts"]
    assert [s["epoch"] for s in starts] == [0, 1] and summary["provenance"] == starts[-1]
    prov = summary["provenance"]
    assert prov["git"]["commit"] == provenance.git_state()["commit"]  # None outside git
    assert prov["numerics"]["mode"] == "portable" and prov["world_size"] == 1
    assert prov["versions"]["torch"] and prov["cpu"]["model"] and prov["cpu"]["logical_cpus"]
    assert prov["fingerprint"] == starts[0]["fingerprint"] == provenance.fingerprint(prov)
    assert len(prov["fingerprint"]) == 12 and prov["machine"].endswith(", portable")
    # a fresh start over the same directory starts the list over
    assert_ok(run_cli([*TINY, "trainer.epochs=2", f"hydra.run.dir={tmp_path}"]))
    assert len(json.loads((tmp_path / "summary.json").read_text())["starts"]) == 1


def test_the_fingerprint_follows_the_machine_not_the_start(tmp_path):
    prov = {"git": {"commit": "a"}, "hostname": "x", "world_size": 2, "launcher": "torchrun",
            "cpu": {"model": "m", "isa": "AVX2"}, "numerics": {"mode": "portable"}}
    same = {**prov, "git": {"commit": "b"}, "hostname": "y", "world_size": 4, "epoch": 3}
    other = {**prov, "numerics": {"mode": "native"}}
    assert provenance.fingerprint(prov) == provenance.fingerprint(same)
    assert provenance.fingerprint(prov) != provenance.fingerprint(other)


def test_git_state_sees_uncommitted_changes(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    assert provenance.git_state(tmp_path) == {"commit": None, "dirty": None, "diff_sha256": None}
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = provenance.git_state(tmp_path)
    assert clean["dirty"] is False and clean["diff_sha256"] is None and len(clean["commit"]) == 40
    (tmp_path / "a.py").write_text("x = 2\n")
    edited = provenance.git_state(tmp_path)
    (tmp_path / "b.py").write_text("")
    added = provenance.git_state(tmp_path)
    assert edited["dirty"] and added["dirty"] and edited["commit"] == clean["commit"]
    assert len({edited["diff_sha256"], added["diff_sha256"]}) == 2
    # results, pages and markdown (what make targets rewrite) change no number: not counted
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    for name in ("results/table.md", "results/curves.png", "docs/page.md", "notes.md"):
        (tmp_path / name).write_text("x")
    assert provenance.git_state(tmp_path) == added
