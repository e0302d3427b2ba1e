"""The documentation's generated parts and its checks: README.md and docs/ as one set of pages.

    python -m tools.docs refresh     # rewrite every generated block from its source file
    python -m tools.docs check       # stale blocks, broken links or anchors, copied numbers
    python -m tools.docs stage DIR   # the pages and every file they link, for mkdocs (make docs)

**Generated blocks.** Results are never typed into a page: a page embeds the file a command
wrote, between two markers, and ``refresh`` copies it in again::

    <!-- generated from results/claims/batch/table.md by `make claim-batch`; refresh: make docs -->
    ...the file's text, byte for byte...
    <!-- end of generated block -->

A figure is embedded the same way (``generated from results/x.png (caption) by ...``: the block
holds the image link). A source that does not exist yet renders as one line that names the
command which writes it.

**Measured numbers** (a mean with its spread, a decimal with a unit of measure: 97.10 %, 1.24x,
13.2 min, 0.339 Gbit; milliseconds; a test count) may stand only inside generated blocks. Code,
commands, links and thresholds (``<= 1.05x``) are not read; neither are ``docs/notes/`` (dated
lab notes of earlier sessions, which say so in their first lines) and the generated
configuration reference.

**Links.** Every relative link and image of every page resolves to a file of the repository, and
every anchor to a heading of its page, as GitHub and the site (Python-Markdown's ``toc``) both
spell it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTES = DOCS / "notes"
NOTES_HEADER = "> **Historical notes.**"  # how every page of docs/notes/ starts (after its title)
NOT_CHECKED_FOR_NUMBERS = ("docs/config-reference.md",)  # generated from conf/: config values

BLOCK = re.compile(
    r"(?P<open><!-- generated from (?P<path>\S+?)(?: \((?P<caption>[^)]*)\))? by `(?P<cmd>[^`]+)`"
    r"[^>]*-->\n)(?P<body>.*?)(?P<close><!-- end of generated block -->)", re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1", re.S)
LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target><[^>]+>|[^)\s]+)"
                  r"(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif")

# Measured numbers (see the module docstring). A threshold (a comparison before the number) is
# a target, not a measurement.
UNITS = (r"%|x\b|×|ms\b|s\b|sec\b|seconds\b|min\b|minutes\b|h\b|hours\b|GPU-h\b|MiB\b|GiB\b|"
         r"KiB\b|MB\b|GB\b|kB\b|Gbit\b|Mbit\b|points\b|GFLOP/s\b|TFLOP/s\b|PFLOP\b")
MEASURED = [
    re.compile(r"\d+(?:\.\d+)?\s*(?:±|\+-|\+/-)\s*\d"),            # 97.10 ± 0.69
    re.compile(r"(?<![\w.])\d+\.\d+\s*(?:" + UNITS + ")"),          # 1.24x, 13.2 min, 0.34 Gbit
    re.compile(r"(?<![\w.])\d+\s*ms\b"),                             # 597 ms
    re.compile(r"(?<![\w.])\d+\s*min\s+\d+\s*s\b"),                  # 3 min 45 s
    re.compile(r"(?<![\w.])\d[\d,]*\s+(?:passed|failed|skipped)\b"),  # 1537 passed
]
THRESHOLD = re.compile(r"(?:<=|>=|<|>|≤|≥|&lt;|&gt;)\s*$")


@dataclass
class Block:
    """A generated block of a page."""

    page: Path
    source: str          # relative to the repository
    caption: str | None
    command: str
    body: str
    start: int           # offsets of the body in the page's text
    end: int
    level: int = 0       # the level of the last heading above it on the page (0: none)


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The generated blocks of ``page``, each with the level of the last heading above it."""
    text = page.read_text() if text is None else text
    headings = [(m.start(), len(m.group(1))) for m in HEADING.finditer(prose(text))]

    def level_above(offset: int) -> int:
        above = [level for at, level in headings if at < offset]
        return above[-1] if above else 0

    return [Block(page, m["path"], m["caption"], m["cmd"], m["body"], m.start("body"),
                  m.end("body"), level_above(m.start())) for m in BLOCK.finditer(text)]


def render(block: Block) -> str:
    """What a block holds: its source's text, a figure link, or what writes the missing source."""
    source = ROOT / block.source
    if not source.is_file():
        return f"*Not generated yet: `{block.command}` writes `{block.source}`.*\n"
    if source.suffix in IMAGES:
        link = Path(os.path.relpath(source, block.page.parent)).as_posix()
        return f"![{block.caption or source.stem}]({link})\n"
    text = nest_headings(source.read_text(), block.level)
    return text if text.endswith("\n") else text + "\n"


def nest_headings(text: str, level: int) -> str:
    """``text``'s headings (outside fenced code) moved down so that its top one is at ``level``
    + 1, as a subsection of where it is shown (at most level 6)."""
    found = list(HEADING.finditer(prose(text)))  # offsets kept: they point into text
    if not found:
        return text
    shift = level + 1 - min(len(m.group(1)) for m in found)
    if shift <= 0:
        return text
    for m in reversed(found):
        hashes = "#" * min(6, len(m.group(1)) + shift)
        text = text[:m.start()] + hashes + text[m.end(1):]
    return text


def refresh(paths: list[Path] | None = None) -> list[Path]:
    """Rewrite every stale generated block; the pages changed."""
    changed = []
    for page in paths or pages():
        text = page.read_text()
        new = text
        for block in reversed(blocks(page, text)):
            new = new[:block.start] + render(block) + new[block.end:]
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def stale_blocks(paths: list[Path] | None = None) -> list[str]:
    """One line per generated block whose text is not its source's."""
    return [f"{_rel(b.page)}: the block from {b.source} is stale (python -m tools.docs refresh)"
            for page in paths or pages() for b in blocks(page) if b.body != render(b)]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def prose(text: str) -> str:
    """A page's text without what the checks do not read: generated blocks, fenced code, code
    spans, HTML comments and link targets (offsets kept: removed text becomes spaces)."""
    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    for pattern in (BLOCK, FENCE, COMMENT, CODE_SPAN):
        text = pattern.sub(blank, text)
    return LINK.sub(lambda m: m["text"] + " " * (len(m.group(0)) - len(m["text"])), text)


def measured_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, quoted text) of every measured number in ``text`` outside generated blocks
    and code (see the module docstring)."""
    plain = prose(text)
    found = []
    for pattern in MEASURED:
        for match in pattern.finditer(plain):
            if THRESHOLD.search(plain[max(0, match.start() - 6):match.start()]):
                continue
            found.append((plain.count("\n", 0, match.start()) + 1, match.group(0).strip()))
    return sorted(set(found))


def copied_numbers(paths: list[Path] | None = None) -> list[str]:
    """One line per measured number quoted outside a generated block, on every checked page."""
    out = []
    for page in paths or pages():
        rel = _rel(page)
        if rel in NOT_CHECKED_FOR_NUMBERS or page.is_relative_to(NOTES):
            continue
        out += [f"{rel}:{line}: measured number outside a generated block: {quoted!r}"
                for line, quoted in measured_numbers(page.read_text())]
    return out


def notes_without_header() -> list[str]:
    """Pages of docs/notes/ that do not say, first, that they are historical notes."""
    out = []
    for page in sorted(NOTES.rglob("*.md")) if NOTES.is_dir() else []:
        body = [x for x in page.read_text().splitlines() if x.strip()][1:2]
        if not body or not body[0].startswith(NOTES_HEADER):
            out.append(f"{_rel(page)}: a page of docs/notes/ starts with its title, then "
                       f"{NOTES_HEADER!r} (what it is and why its numbers are not current)")
    return out


def _heading_text(markdown: str) -> str:
    """A heading's text as rendered: code, links and emphasis reduced to their text."""
    text = LINK.sub(lambda m: m["text"], markdown)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text)


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def toc_slug(text: str) -> str:
    """Python-Markdown's ``toc`` anchor (the site's), as ``markdown.extensions.toc.slugify``."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings that GitHub and the site spell alike (a repeated
    heading's later anchors differ between the two: GitHub appends -1, the site _1)."""
    out = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        text = _heading_text(match.group(2))
        if github_slug(text) == toc_slug(text):
            out.add(github_slug(text))
    return out


def links(page: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every link and image of a page, outside code."""
    text = page.read_text()
    plain = text
    for pattern in (FENCE, COMMENT, CODE_SPAN):
        plain = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), plain)
    for match in LINK.finditer(plain):
        target = text[match.start("target"):match.end("target")].strip("<>")
        yield plain.count("\n", 0, match.start()) + 1, target


def broken_links(paths: list[Path] | None = None, root: Path = ROOT) -> list[str]:
    """One line per relative link or anchor that does not resolve to a file below ``root`` (no
    network: URLs are not followed)."""
    out = []
    for page in paths or pages():
        for line, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            where = f"{page.relative_to(root).as_posix()}:{line}: {target}"
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_relative_to(root):
                out.append(f"{where}: outside the repository")
            elif not dest.exists():
                out.append(f"{where}: no such file")
            elif dest.is_dir():
                out.append(f"{where}: a folder (the site cannot serve it): link a file in it")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                out.append(f"{where}: no heading with this anchor")
    return out


def problems() -> list[str]:
    """Everything ``check`` reports."""
    return [*stale_blocks(), *broken_links(), *copied_numbers(), *notes_without_header()]


def stage(out: Path) -> list[Path]:
    """Copy README.md, docs/ and every repository file a page links to into ``out`` (at their
    paths in the repository), for mkdocs: the site is the pages as a code host shows them."""
    if out.exists():
        shutil.rmtree(out)
    todo, done = pages(), set()
    while todo:
        path = todo.pop()
        if path in done:
            continue
        done.add(path)
        dest = out / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        if path.suffix == ".md":
            for _, target in links(path):
                file = (path.parent / target.partition("#")[0]).resolve()
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and file.is_file() and \
                        file.is_relative_to(ROOT):
                    todo.append(file)
    return sorted(done)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("refresh", help="rewrite the generated blocks from their sources")
    sub.add_parser("check", help="stale blocks, broken links or anchors, copied numbers")
    staging = sub.add_parser("stage", help="the site's sources, for mkdocs")
    staging.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "refresh":
        for page in refresh():
            print(f"refreshed {_rel(page)}")
        return 0
    if args.command == "stage":
        print(f"{len(stage(args.out))} files staged in {args.out}")
        return 0
    found = problems()
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
