"""The documentation: README.md and docs/ link only what exists, quote measured numbers only from
the files commands wrote (generated blocks, byte for byte), document every config key, and build
as a site (tools/docs.py, tools/config_reference.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tools import config_reference, docs

# ---- the repository's own pages -------------------------------------------------------------

def test_every_link_and_anchor_resolves():
    assert docs.broken_links() == []


def test_generated_blocks_hold_their_sources():
    assert docs.stale_blocks() == []


# Targets whose help says they write under results/ (the pattern rules by one of their targets).
RESULT_TARGET = re.compile(r"^(?:\$\(addprefix (?P<prefix>[\w-]+),[^)]*\)\)?: [\w%-]*"
                           r"|(?P<name>[\w-]+)):[^#]*## .*-> [^ ]*results/", re.M)


def _writers() -> list[str]:
    found = []
    for m in RESULT_TARGET.finditer((ROOT / "Makefile").read_text()):
        found.append(m["name"] or {"reproduce-": "reproduce-table1",
                                   "claim-": "claim-learners"}.get(m["prefix"], m["prefix"]))
    return found


def test_every_target_that_writes_results_refreshes_the_blocks_after():
    """A clone that regenerates a result (make demo rewrites results/demo/ and machines.md) keeps
    its pages' generated blocks current: each such target's commands, as `make -n` lists them,
    end with tools.docs refresh (pytest aside; caught: machines, hence demo, without it)."""
    writers = _writers()
    assert {"demo", "machines", "reproduce-table1", "bench-e2e", "reproduce-auto"} <= set(writers)
    for target in writers:
        listed = subprocess.run(["make", "-n", "--no-print-directory", target, "SCALE=tiny"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
        commands = [line for line in listed.splitlines()  # what runs python, tests aside
                    if ".venv/bin/python" in line and "-m pytest" not in line]
        assert commands and "-m tools.docs refresh" in commands[-1], (target, commands[-3:])


def test_no_measured_number_outside_a_generated_block():
    assert docs.copied_numbers() == []


def test_lab_notes_say_first_that_they_are_historical():
    assert docs.notes_without_header() == []


def test_every_config_key_has_a_comment():
    assert config_reference.problems() == []


def test_the_config_reference_is_current():
    assert config_reference.PAGE.read_text() == config_reference.render(), \
        "run `python -m tools.config_reference` (make docs)"


def test_readme_is_a_short_entry_point():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    linked = {target.partition("#")[0] for _, target in docs.links(ROOT / "README.md")}
    pages = {p.relative_to(ROOT).as_posix() for p in docs.pages()[1:]}
    assert pages <= linked, f"pages missing from the README's map: {sorted(pages - linked)}"


def test_every_page_is_in_the_site_navigation():
    def entries(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [e for item in node for e in entries(item)]
        return [e for value in node.values() for e in entries(value)]

    nav = entries(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = [p.relative_to(ROOT).as_posix() for p in docs.pages()]
    assert sorted(nav) == sorted(pages)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]'; make docs)")
def test_the_site_builds_strictly(tmp_path):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs.stage(tmp_path / "src")
    config.update(docs_dir=str(tmp_path / "src"), site_dir=str(tmp_path / "site"))
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(tmp_path / "mkdocs.yml")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "docs" / "getting-started.html").is_file()


# ---- the checks themselves, on pages written here ------------------------------------------

@pytest.mark.parametrize("text", [
    "rank 2 reaches 97.10 ± 0.69 over three seeds", "9.21 +- 0.02 perplexity", "a 1.24x speed-up",
    "13.2 min beside another sweep", "it sent 0.339 Gbit", "a 597 ms step", "in 3 min 45 s",
    "1537 passed, 24 skipped", "96.4% at L_T 5000", "up to 2.6 points", "peak 3.2 GiB",
])
def test_a_measured_number_is_found(text):
    assert docs.measured_numbers(f"Some prose: {text}.\n")


@pytest.mark.parametrize("text", [
    "`lr=0.02` and `trainer.epochs=16`", "torch 2.14.1 and hydra-core 1.3", "eta = 0.5 every 10 "
    "epochs", "top 10% of the coordinates", "rank 2 / rank 1, L_T 50/500", "300 epochs of batch "
    "512", "the target is <= 1.05x DDP", "at most >= 0.9 of the ideal", "11,173,962 parameters",
    "5 TFLOP/s per GPU assumed", "```\n97.10 ± 0.69\n```", "[the table](results/1.24x/t.md)",
    "<!-- generated from results/x.md by `make x`; refresh: make docs -->\n97.1 ± 0.7 and 1.2x\n"
    "<!-- end of generated block -->",
])
def test_config_values_versions_thresholds_code_and_blocks_are_not(text):
    assert docs.measured_numbers(f"Some prose: {text}.\n") == []


def _page(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_broken_links_and_anchors_are_named(tmp_path):
    _page(tmp_path / "docs" / "other.md", "# Other\n\n## A section (`make x`)\n\n## Ünïcode ±\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.md").write_text("| a |\n")
    page = _page(tmp_path / "docs" / "page.md", "\n".join([
        "# Page", "", "[ok](other.md) [ok](other.md#a-section-make-x) [ok](#page)",
        "[ok](../results/t.md) [ok](https://example.org/x) `[code](missing.md)`",
        "[gone](missing.md)", "[bad anchor](other.md#nope)", "[folder](../results)",
        "[unicode](other.md#nicode-)", "[outside](../../elsewhere.md)", ""]))
    found = docs.broken_links([page], root=tmp_path)
    assert [line.split(": ", 2)[1:] for line in found] == [
        ["missing.md", "no such file"], ["other.md#nope", "no heading with this anchor"],
        ["../results", "a folder (the site cannot serve it): link a file in it"],
        ["other.md#nicode-", "no heading with this anchor"],
        ["../../elsewhere.md", "outside the repository"]]
    assert all(line.startswith("docs/page.md:") for line in found)


def test_refresh_copies_sources_in_and_check_finds_stale_blocks(tmp_path):
    source = "results/claims/batch/table.md"
    page = _page(tmp_path / "page.md", "\n".join([
        "# Page", "", f"<!-- generated from {source} by `make claim-batch`; refresh: make docs -->",
        "old text", "<!-- end of generated block -->", "",
        "<!-- generated from results/claims/batch/batch.png (the figure) by `make claim-batch`; "
        "refresh: make docs -->", "<!-- end of generated block -->", "",
        "<!-- generated from results/none/yet.md by `make nothing`; refresh: make docs -->",
        "<!-- end of generated block -->", ""]))
    assert len(docs.stale_blocks([page])) == 3
    assert docs.refresh([page]) == [page]
    text = page.read_text()
    assert (ROOT / source).read_text() in text
    figure = Path(os.path.relpath(ROOT / "results/claims/batch/batch.png", tmp_path))
    assert f"![the figure]({figure.as_posix()})\n" in text
    assert "*Not generated yet: `make nothing` writes `results/none/yet.md`.*\n" in text
    assert docs.stale_blocks([page]) == [] and docs.refresh([page]) == []
    page.write_text(text.replace("| batch |", "| typed by hand |", 1))
    assert len(docs.stale_blocks([page])) == 1


def test_a_shown_file_s_headings_nest_under_the_section_showing_it():
    # A scorecard starts with "# Scorecard": shown under a "##" section it becomes "###", its
    # deeper headings follow, and a "#" line in fenced code is not a heading.
    text = "# Scorecard\n\n## Rows\n\n```\n# a comment\n```\n"
    assert docs.nest_headings(text, 2) == "### Scorecard\n\n#### Rows\n\n```\n# a comment\n```\n"
    assert docs.nest_headings(text, 0) == text
    assert docs.nest_headings("### Already deep\n", 1) == "### Already deep\n"  # never raised
    assert docs.nest_headings("##### Deep\n\n# Top\n", 5) == "###### Deep\n\n###### Top\n"


def test_stage_copies_the_pages_and_what_they_link(tmp_path):
    staged = {p.relative_to(ROOT).as_posix() for p in docs.stage(tmp_path / "site-src")}
    assert {"README.md", "docs/getting-started.md", "results/claims/batch/batch.png"} <= staged
    assert (tmp_path / "site-src" / "docs" / "config-reference.md").is_file()
    assert not (tmp_path / "site-src" / "run.py").exists()  # not linked from any page


def _conf(tmp_path: Path, files: dict[str, str]) -> list[config_reference.Option]:
    for name, text in files.items():
        _page(tmp_path / "conf" / name, text)
    return config_reference.options(tmp_path / "conf")


def test_a_key_without_a_comment_is_named(tmp_path):
    opts = _conf(tmp_path, {
        "config.yaml": "# The top.\nseed: 0   # seeds everything\nrecipe:\n  interval: 10\n",
        "model/a.yaml": "# Model a.\nname: a\nwidth: 64   # channels\n  # continued here\n"
                        "depth: 3\n",
        "model/b.yaml": "# Model b.\nname: b\n# how deep\ndepth: 5\nwidth: 8\n",
        "method/m.yaml": "# @package _global_\n# Method m.\nmodel:\n  width: 4\nseed: 1\n"
                         "extra:\n  thing: 2\n",
        "method/n.yaml": "# @package _global_\nseed: 2   # its own seed\n",
    })
    assert config_reference.problems(opts) == [
        "conf/method/n.yaml: no header comment (what the option is)",
        "conf/config.yaml: recipe.interval: no comment",
        "conf/method/m.yaml: extra.thing: no comment"]
    docs_of = config_reference.group_docs(opts)
    assert docs_of["model"] == {"width": "channels continued here", "depth": "how deep"}
    page = config_reference.render(opts)
    assert "| `depth` | `3` | how deep |" in page  # b's comment documents a's key
    assert "| `model.width` | `4` | channels continued here |" in page  # global: the group's
