"""The repository stays lean (issue 47 item 5; docs/developer.md, "Keeping the repository
lean"): generated plans are not tracked, no tracked file is large but the shipped profiles and
models listed here, and the tracked tree stays small enough that a fresh clone's pack is well
under 20 MB. Reads the git index (`git ls-files`); skipped outside a git checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
# A tracked file over this needs a reason and a line in ALLOWED.
LARGE = 2 * MiB
# Shipped files over LARGE, each with the ceiling it may grow to (sizes of 2026-12-02: the H100
# profile 5.7 MiB, the H200 profile 3.5 MiB, the encoder-decoder Transformer 2.1 MiB).
ALLOWED = {
    "profiles/h100-80gb-hbm3.json": 8 * MiB,
    "profiles/h200.json": 8 * MiB,
    "models/transformer.onnx": 4 * MiB,
}
# The tracked tree's raw bytes (25 MiB on 2026-12-02, a 7.2 MiB pack): a plain guard well below
# what would bring a depth-1 clone's pack near 20 MB.
TOTAL = 60 * MiB


def tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"git ls-files failed: {done.stderr.decode()[-200:]}")
    return [p for p in done.stdout.decode().split("\0") if p]


def sizes() -> dict[str, int]:
    # a file deleted in the working tree but still in the index has no size to check
    return {p: (ROOT / p).stat().st_size for p in tracked() if (ROOT / p).is_file()}


def test_generated_plans_are_not_tracked():
    plans = [p for p in tracked() if p.startswith("experiments/plans/")]
    assert not plans, (f"{len(plans)} tracked files under experiments/plans/ (e.g. {plans[0]}): "
                       "plans are generated (experiments/README.md, \"Plans\"); a test needs a "
                       "small fixture under tests/fixtures/ instead. Untrack them with "
                       "`git rm -r --cached experiments/plans`")


def test_no_tracked_file_is_large_but_the_shipped_profiles_and_models():
    found = sizes()
    large = {p: n for p, n in found.items() if n > ALLOWED.get(p, LARGE)}
    assert not large, "tracked files over their limit (MiB): " + ", ".join(
        f"{p} {n / MiB:.1f} (limit {ALLOWED.get(p, LARGE) / MiB:.0f})"
        for p, n in sorted(large.items()))
    total = sum(found.values())
    assert total < TOTAL, (f"the tracked tree holds {total / MiB:.1f} MiB (limit "
                           f"{TOTAL / MiB:.0f}): measure the pack (docs/developer.md) and untrack "
                           "or compress what grew")
