"""Regenerate the outputs that docs/user-guide.md shows, from the commands it shows.

Every ```console block that follows a line ``<!-- generated -->`` is generated: each line
``$ autotm ...`` in it is run (in document order, in one scratch folder, so that later commands
read the files earlier ones wrote), and the lines after it, up to the next ``$``, are replaced
by what the command printed (stdout and stderr, as a terminal shows them). A block whose
outputs are excerpts says which lines it keeps, one spec per command:

    <!-- generated keep=all|1-22 -->        first command whole, second its lines 1 to 22
    <!-- generated keep=none|1-10,31-34 --> first command's output left out (shown as ...)

A gap in what is kept is shown as one line ``...``.

    python experiments/update_user_guide.py            # run the commands, rewrite the guide
    python experiments/update_user_guide.py --check    # exit 1 and print a diff if stale

The commands run with this checkout's `autotm_py` (`python -m autotm_py`), the scratch folder as
the current directory, and each with an empty profile cache of its own (shown as
`~/.cache/...`): `autotm profile` measures and prints the same counts everywhere, and no
command's prediction depends on times another one just measured on a busy machine; they use
the shipped profiles. Comparisons (`--check`, tests/test_user_guide.py) mask what changes from
run to run without the code changing: measured and elapsed times, solver build and solve
seconds, the machine-specific profile file name and CPU name (`MASKS`); the profiler's warning
that the machine is busy, and the one that CPU profiles of another CPU serve this one's kernels,
are left out of the outputs (`DROPPED`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "user-guide.md"
MARKER = re.compile(r"^<!-- generated(?: keep=(?P<keep>\S+))? -->$")
ELIDED = "..."
TIMEOUT_S = 900

# (pattern, replacement) applied to both sides before comparing: run-to-run noise only.
MASKS = (
    (re.compile(r"build \d+\.\d+ s, solve \d+\.\d+ s"), "build <s> s, solve <s> s"),
    (re.compile(r"one iteration sums to \d+\.\d+ ms"), "one iteration sums to <ms> ms"),
    (re.compile(r"^(cache: .*) \(\d+\.\d+ s\)$", re.M), r"\1 (<s> s)"),
    (re.compile(r"cpu-[a-z0-9-]+\.json"), "cpu-<machine>.json"),
    (re.compile(r"median \d+\.\d+ ms"), "median <ms> ms"),
    (re.compile(r"enqueueing an iteration took \d+\.\d+ ms"), "enqueueing an iteration took "
                                                              "<ms> ms"),
    (re.compile(r"\b\d+:\d\d:\d\d\b"), "<elapsed>"),
    # the device whose profile lacks kernels: this machine's CPU name for --device cpu
    (re.compile(r"(have no profile: roofline estimates on) (?!NVIDIA).+$", re.M),
     r"\1 <this machine's CPU>"),
)
# Lines left out of generated outputs: they depend on the machine's load or its CPU, not on the
# code (the shipped CPU profiles serve another CPU's kernels with a warning that names both,
# and none where the CPU is the one profiled).
DROPPED = (re.compile(r"^warning: load average .* exceeds"),
           re.compile(r"^(warning: )?\d+ kernels of \S+ from profiles of cpu \|.*, the closest "
                      r"to '"))


@dataclass
class Command:
    """One `$ command` of a generated block and the output lines shown under it."""

    line: int  # index of the `$` line in the guide
    text: str  # the command, without "$ "
    shown: list[str]
    keep: str = "all"


@dataclass
class Block:
    start: int  # index of the ```console line
    end: int  # index of the closing ``` line
    commands: list[Command]


def parse(lines: list[str]) -> list[Block]:
    """The generated blocks of the guide, in order."""
    blocks, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        start = i + 1
        if not lines[start].startswith("```console"):
            raise ValueError(f"line {i + 1}: a generated marker must precede a ```console block")
        end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
        commands: list[Command] = []
        for j in range(start + 1, end):
            if lines[j].startswith("$ "):
                commands.append(Command(j, lines[j][2:], []))
            elif commands:
                commands[-1].shown.append(lines[j])
        specs = (m.group("keep") or "").split("|") if m.group("keep") else []
        for cmd, spec in zip(commands, specs, strict=False):
            cmd.keep = spec
        blocks.append(Block(start, end, commands))
        i = end + 1
    return blocks


def excerpt(output: list[str], keep: str) -> list[str]:
    """The lines of `output` that `keep` names (1-based ranges), gaps shown as ...; a trailing
    empty line between commands of one block is kept as the command printed it."""
    if keep == "all":
        return output
    if keep == "none":
        return [ELIDED]
    wanted: set[int] = set()
    for part in keep.split(","):
        lo, _, hi = part.partition("-")
        wanted.update(range(int(lo), int(hi or lo) + 1))
    out, last = [], 0
    for n, line in enumerate(output, start=1):
        if n in wanted:
            if n != last + 1:
                out.append(ELIDED)
            out.append(line)
            last = n
    if last < len(output):
        out.append(ELIDED)
    return out


class Runner:
    """Runs guide commands in one scratch folder with a fresh profile cache."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.runs = 0
        env = {k: v for k, v in os.environ.items()
               if k not in ("AUTOTM_PROFILES", "COLUMNS", "FORCE_COLOR")}
        env.update(PYTHONPATH=str(ROOT), NO_COLOR="1", TERM="dumb")
        self.env = env

    def run(self, text: str) -> list[str]:
        argv = shlex.split(text)
        if not argv or argv[0] != "autotm":
            raise ValueError(f"generated blocks run autotm commands only, not {text!r}")
        self.runs += 1
        cache = self.workdir / f".cache-{self.runs}"
        proc = subprocess.run([sys.executable, "-m", "autotm_py", *argv[1:]], cwd=self.workdir,
                              env={**self.env, "XDG_CACHE_HOME": str(cache)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=TIMEOUT_S, check=False)
        text_out = proc.stdout.replace(str(cache), "~/.cache")
        text_out = text_out.replace(f"{self.workdir}{os.sep}", "")
        lines = text_out.rstrip("\n").split("\n") if text_out.strip() else []
        return [line.rstrip() for line in lines
                if not any(pattern.search(line) for pattern in DROPPED)]


def generate(lines: list[str], runner: Runner) -> list[tuple[Command, list[str]]]:
    """Every command of every generated block with the output it should show now."""
    out = []
    for block in parse(lines):
        for i, cmd in enumerate(block.commands):
            shown = excerpt(runner.run(cmd.text), cmd.keep)
            if i + 1 < len(block.commands):
                shown = [*shown, ""]  # a blank line between commands of one block
            out.append((cmd, shown))
    return out


def rewrite(lines: list[str], results: list[tuple[Command, list[str]]]) -> list[str]:
    """The guide with every generated command's output replaced (bottom up keeps indices)."""
    new = list(lines)
    for cmd, shown in sorted(results, key=lambda r: -r[0].line):
        new[cmd.line + 1: cmd.line + 1 + len(cmd.shown)] = shown
    return new


def masked(lines: list[str]) -> list[str]:
    text = "\n".join(lines)
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text.split("\n")


def stale(results: list[tuple[Command, list[str]]]) -> list[str]:
    """A unified diff per command whose shown output differs from today's (masked)."""
    diffs = []
    for cmd, shown in results:
        old, new = masked(cmd.shown), masked(shown)
        if old != new:
            diffs.append("\n".join(difflib.unified_diff(
                old, new, f"shown under `$ {cmd.text}`", "printed now", lineterm="")))
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="Do not rewrite; exit 1 and print a diff if an output is stale.")
    parser.add_argument("--guide", type=Path, default=GUIDE)
    args = parser.parse_args(argv)
    lines = args.guide.read_text().split("\n")
    with tempfile.TemporaryDirectory(prefix="autotm-guide-") as tmp:
        results = generate(lines, Runner(Path(tmp)))
    if args.check:
        diffs = stale(results)
        print("\n\n".join(diffs) if diffs else f"{args.guide}: every shown output is current")
        return 1 if diffs else 0
    args.guide.write_text("\n".join(rewrite(lines, results)))
    print(f"rewrote the outputs of {len(results)} commands in {args.guide}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
