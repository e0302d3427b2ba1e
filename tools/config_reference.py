"""The configuration reference, written from the comments in ``conf/`` so that it cannot drift.

    python -m tools.config_reference            # rewrite docs/config-reference.md
    python -m tools.config_reference --check    # exit 1: a key without a comment, a stale page

Every option file starts with a comment that says what it is (its header); every key has a
comment: on its line (``epochs: 3   # >= 1``, continued on the following lines indented past the
key), or on the lines just above it. Within a config group (``conf/model/`` ...) a key documented
in one option documents it for all (``num_classes`` of every model), and ``name`` is the option's
own name. Options that set keys of other groups (``# @package _global_``: methods, recipes,
sweeps, ...) are documented by their header; the keys they set take the comment of the file, or of
the group or top-level key they belong to. A sweep's run groups (``hydra.sweeper``) are data:
docs/sweeps.md says how they read.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
PAGE = ROOT / "docs" / "config-reference.md"
GLOBAL = "# @package _global_"
UNDOCUMENTED = ("defaults",)          # Hydra's own key, read as the file's composition
EXEMPT = ("name",)                    # an option's own name: `<group>=<name>`
DATA = ("hydra.sweeper.groups", "hydra.sweeper.params")  # a sweep's runs, not settings


@dataclass
class Key:
    """One key of an option file: its dotted path, its value as written, and its comment."""

    path: str
    value: str
    doc: str | None
    leaf: bool


@dataclass
class Option:
    """One option file of a group (or a top-level file of conf/)."""

    group: str            # "" for conf/config.yaml and conf/sweep_runs.yaml
    name: str             # model/resnet18 -> resnet18; dataset/tiny/cifar10 -> tiny/cifar10
    path: Path
    is_global: bool
    header: list[str]     # the leading comment, line by line (indented lines are commands)
    keys: list[Key] = field(default_factory=list)
    runs: str = ""        # a sweep's run groups and params, as the file writes them

    @property
    def rel(self) -> str:
        """The file, relative to the repository (to its conf/ folder's parent)."""
        parts = self.path.parts
        return "/".join(parts[len(parts) - parts[::-1].index("conf") - 1:])


def _comment_after(line: str, column: int) -> str | None:
    """The comment on ``line`` after ``column`` (a ``#`` that starts a word), if any."""
    for i in range(column, len(line)):
        if line[i] == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[i + 1:].strip()
    return None


def _continued(lines: list[str], start: int, indent: int) -> list[str]:
    """Comment-only lines from ``start`` on that are indented past ``indent`` (a comment that
    goes on below its key)."""
    out = []
    for line in lines[start:]:
        stripped = line.lstrip()
        if not stripped.startswith("#") or len(line) - len(stripped) <= indent:
            break
        out.append(stripped[1:].strip())
    return out


def _above(lines: list[str], line_no: int, indent: int, first: int) -> list[str]:
    """The comment-only lines just above ``line_no`` at the key's own indentation, not before
    line ``first`` (the file's header comes before it)."""
    out: list[str] = []
    i = line_no - 1
    while i >= first and lines[i].strip().startswith("#") and \
            len(lines[i]) - len(lines[i].lstrip()) == indent:
        out.insert(0, lines[i].strip()[1:].strip())
        i -= 1
    return out


def _doc(lines: list[str], key: yaml.Node, value: yaml.Node, first: int) -> str | None:
    """A key's comment: on its line (or after its value), continued below, or just above it."""
    line, column = key.start_mark.line, key.start_mark.column
    block = isinstance(value, yaml.MappingNode) or (isinstance(value, yaml.SequenceNode)
                                                     and not value.flow_style)
    end_line, end_col = (line, key.end_mark.column) if block else (value.end_mark.line,
                                                                  value.end_mark.column)
    inline = _comment_after(lines[end_line], end_col)
    if inline is not None:
        return " ".join([inline, *_continued(lines, end_line + 1, column)]).strip() or None
    return " ".join(_above(lines, line, column, first)) or None


def _source(lines: list[str], node: yaml.Node) -> str:
    """A value as the file writes it, on one line."""
    start, end = node.start_mark, node.end_mark
    if start.line == end.line:
        return lines[start.line][start.column:end.column]
    parts = [lines[start.line][start.column:], *lines[start.line + 1:end.line],
             lines[end.line][:end.column] if end.line < len(lines) else ""]
    return " ".join(" ".join(parts).split())


def _walk(node: yaml.MappingNode, lines: list[str], first: int,
          prefix: str = "") -> Iterator[Key]:
    for key, value in node.value:
        path = f"{prefix}{key.value}"
        if path in UNDOCUMENTED:
            continue
        if isinstance(value, yaml.MappingNode) and path not in DATA:
            yield Key(path, "", _doc(lines, key, value, first), leaf=False)
            yield from _walk(value, lines, first, f"{path}.")
        else:
            yield Key(path, _source(lines, value), _doc(lines, key, value, first),
                      leaf=path not in DATA)


def load(path: Path, conf: Path = CONF) -> Option:
    """An option file of ``conf`` with its header and every key."""
    text = path.read_text()
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    head = [line[2:] if line.startswith("# ") else line[1:]
            for line in lines[:first] if line.strip() != GLOBAL]
    rel = path.relative_to(conf)
    group = rel.parts[0] if len(rel.parts) > 1 else ""
    name = "/".join(rel.with_suffix("").parts[1:]) if group else rel.stem
    option = Option(group, name, path, GLOBAL in lines[:1], head)
    node = yaml.compose(text)
    if isinstance(node, yaml.MappingNode):
        option.keys = list(_walk(node, lines, first))
    option.runs = _sweeper_block(lines)
    return option


def _sweeper_block(lines: list[str]) -> str:
    """The lines below ``sweeper:`` (a sweep's run groups and params), dedented."""
    starts = [i for i, line in enumerate(lines) if line.strip() == "sweeper:"]
    if not starts:
        return ""
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    block = []
    for line in lines[starts[0] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip("\n")


def options(conf: Path = CONF) -> list[Option]:
    """Every file of ``conf``, the top-level ones first, then by group and option."""
    files = sorted(conf.rglob("*.yaml"), key=lambda p: (len(p.relative_to(conf).parts) > 1, p))
    return [load(p, conf) for p in files]


def group_docs(opts: list[Option]) -> dict[str, dict[str, str]]:
    """group -> key -> the first comment of that key in the group's own (non-global) options;
    group "" holds the top-level files' keys."""
    docs: dict[str, dict[str, str]] = {}
    for opt in opts:
        if opt.is_global and opt.group:
            continue
        for key in opt.keys:
            if key.doc:
                docs.setdefault(opt.group, {}).setdefault(key.path, key.doc)
    return docs


def doc_of(opt: Option, key: Key, docs: dict[str, dict[str, str]]) -> str | None:
    """A key's documentation: its own comment, else its group's, else (for keys that a global
    option sets) the comment of the group or top-level key it belongs to."""
    if key.doc:
        return key.doc
    if not opt.is_global or not opt.group:
        return docs.get(opt.group, {}).get(key.path)
    head, _, rest = key.path.partition(".")
    return docs.get(head, {}).get(rest) if rest and head in docs else docs.get("", {}).get(
        key.path)


def problems(opts: list[Option] | None = None) -> list[str]:
    """Every option without a header and every key without a comment, one line each."""
    opts = options() if opts is None else opts
    docs = group_docs(opts)
    out = [f"{o.rel}: no header comment (what the option is)" for o in opts
           if not "".join(o.header).strip()]
    for opt in opts:
        for key in opt.keys:
            exempt = key.path in EXEMPT and not opt.is_global
            if key.leaf and not exempt and not doc_of(opt, key, docs):
                out.append(f"{opt.rel}: {key.path}: no comment")
    return out


def _cell(text: str) -> str:
    """Text for a markdown table cell, as plain text on GitHub and in the site alike."""
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("<", "&lt;"), ("*", "\\*")):
        text = text.replace(char, escaped)
    return text


def _code(value: str) -> str:
    return f"`{value.replace('|', '&#124;')}`" if value else ""


def _header(opt: Option) -> list[str]:
    """The option's header: prose as a paragraph, indented lines (commands) as a code block."""
    out: list[str] = []
    prose: list[str] = []
    code: list[str] = []
    for line in [*opt.header, ""]:
        if line.startswith("  ") and line.strip():
            code.append(line.strip())
            continue
        if code:
            out += [_cell(" ".join(prose)), "", "```text", *code, "```", ""]
            prose, code = [], []
        if line.strip():
            prose.append(line.strip())
    return out + ([_cell(" ".join(prose)), ""] if prose else [])


def _table(opt: Option, docs: dict[str, dict[str, str]]) -> list[str]:
    rows = [key for key in opt.keys if key.leaf]
    if not rows:
        return []
    out = ["| key | value | what it is |", "| --- | --- | --- |"]
    for key in rows:
        doc = doc_of(opt, key, docs) or ("the option's name" if key.path in EXEMPT else "")
        out.append(f"| `{key.path}` | {_code(key.value)} | {_cell(doc)} |")
    return [*out, ""]


GROUP_INTRO = {
    False: "Select one with `{group}=<option>`; its keys are then `{group}.<key>`.",
    True: "Presets that set keys of the whole config (`# @package _global_`); select one with "
          "`{group}=<option>`.",
}


def render(opts: list[Option] | None = None) -> str:
    """The whole reference page."""
    opts = options() if opts is None else opts
    docs = group_docs(opts)
    groups: dict[str, list[Option]] = {}
    for opt in opts:
        groups.setdefault(opt.group, []).append(opt)
    lines = [
        "# Configuration reference", "",
        "<!-- Written by `python -m tools.config_reference` (make docs) from the comments in "
        "conf/: do not edit. -->", "",
        "Look up a config group, an option or a key here: what it is and its value as the file "
        "sets it. [Configuration](configuration.md) says how the groups compose into one run. "
        "This page is written from the comments in `conf/` by `python -m tools.config_reference`"
        " (`make docs`); `tests/unit/test_docs.py` fails when a key has no comment or the page is "
        "stale.", "",
        "Groups: " + ", ".join(f"[`{g}`](#{g})" for g in groups if g) + ".", "",
        "## Top level", "",
    ]
    for opt in groups.pop(""):
        lines += [f"### `{opt.rel}`", "", *_header(opt), *_table(opt, docs)]
    for group, members in groups.items():
        lines += [f"## {group}", "", GROUP_INTRO[members[0].is_global].format(group=group), ""]
        for opt in members:
            runs = ["Its runs (`hydra.sweeper`):", "", "```yaml", opt.runs, "```", ""]
            lines += [f"### `{group}={opt.name}`", "", f"File: `{opt.rel}`.", "",
                      *_header(opt), *_table(opt, docs), *(runs if opt.runs else [])]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` report what is missing or stale."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write: exit 1 if a key lacks a comment or the page is stale")
    args = parser.parse_args(argv)
    opts = options()
    missing = problems(opts)
    for line in missing:
        print(f"error: {line}", file=sys.stderr)
    text = render(opts)
    if args.check:
        stale = not PAGE.is_file() or PAGE.read_text() != text
        if stale:
            print(f"error: {PAGE.relative_to(ROOT)} is stale: run `python -m "
                  f"tools.config_reference`", file=sys.stderr)
        return 1 if missing or stale else 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
