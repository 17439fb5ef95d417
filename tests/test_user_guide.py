"""docs/user-guide.md shows what its commands print (issue 12 item 5).

`experiments/update_user_guide.py` runs every command of the guide's generated blocks and
rewrites their outputs; this test runs them the same way and fails, with a diff per command,
when a shown output no longer matches (measured times, solver seconds and the machine's profile
file name are masked: `MASKS`). Fix a failure by running the script and reviewing the diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import update_user_guide as guide

FIX = "run `python experiments/update_user_guide.py` and review the diff of docs/user-guide.md"


def test_markers_parse_and_excerpts_keep_what_they_say() -> None:
    lines = ["<!-- generated keep=none|2-3 -->", "```console", "$ autotm a", "...", "",
             "$ autotm b", "x", "```"]
    (block,) = guide.parse(lines)
    assert [c.text for c in block.commands] == ["autotm a", "autotm b"]
    assert [c.keep for c in block.commands] == ["none", "2-3"]
    assert block.commands[0].shown == ["...", ""] and block.commands[1].shown == ["x"]
    assert guide.excerpt(["1", "2", "3", "4"], "2-3") == ["...", "2", "3", "..."]
    assert guide.excerpt(["1", "2"], "none") == ["..."]
    assert guide.masked(["build 0.37 s, solve 1.32 s", "cache: ~/x/cpu-amd-epyc.json (87.0 s)"]) \
        == ["build <s> s, solve <s> s", "cache: ~/x/cpu-<machine>.json (<s> s)"]


@pytest.mark.slow
def test_every_shown_output_is_what_the_command_prints(tmp_path: Path) -> None:
    lines = guide.GUIDE.read_text().split("\n")
    blocks = guide.parse(lines)
    assert sum(len(b.commands) for b in blocks) >= 12, "the guide lost its generated blocks"
    diffs = guide.stale(guide.generate(lines, guide.Runner(tmp_path)))
    assert not diffs, f"{len(diffs)} stale outputs in docs/user-guide.md; {FIX}:\n\n" + \
        "\n\n".join(diffs)
