"""The documentation's shape (issue 47 item 4): a short README, docs/gpu.md a manual rather than a
lab notebook (the dated record lives in experiments/journal/), and no relative link in README.md
or docs/*.md that points at a file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150
GPU_MANUAL_MAX_LINES = 500
# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text outside fenced code blocks, without web addresses,
    mail addresses and links within the page (`#section`); a target's own `#section` is cut."""
    targets, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            targets.append(target.split("#", 1)[0])
    return targets


def broken_links(path: Path) -> list[str]:
    return [target for target in relative_links(path.read_text(encoding="utf-8"))
            if not (path.parent / target).exists()]


def test_readme_is_short():
    assert _lines(ROOT / "README.md") < README_MAX_LINES


def test_the_gpu_page_is_a_manual():
    assert _lines(ROOT / "docs" / "gpu.md") < GPU_MANUAL_MAX_LINES


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = {page.relative_to(ROOT).as_posix(): links for page in pages
              if (links := broken_links(page))}
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_link_reader_skips_code_web_addresses_and_anchors(tmp_path):
    text = ("[a](there.md#part) [b](https://example.org/x) [c](#here) ![d](img/p.png)\n"
            "```\n[e](in-code.md)\n```\n[f](../up.md \"title\")\n")
    assert relative_links(text) == ["there.md", "img/p.png", "../up.md"]
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    (tmp_path / "there.md").write_text("", encoding="utf-8")
    assert broken_links(page) == ["img/p.png", "../up.md"]
