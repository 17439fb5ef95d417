"""The table of experiments/gpu/ab_versions.sh: per plan, the median iteration of every run of
each version and the ratio new / old of their medians (ratios of runs of one call).

Usage: python3 experiments/gpu/ab_summary.py OUT MODEL=PLAN [MODEL=PLAN ...]
Writes OUT/ab_summary.json and prints one line per plan.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def runs(out: Path, version: str, index: int) -> list[dict]:
    """The RunResults of one version of plan `index`, over every round that wrote one."""
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{version}_{index}_r*.json"))]


def cell_summary(out: Path, index: int, cell: str) -> dict:
    model, _, plan = cell.partition("=")
    row: dict = {"model": model, "plan": Path(plan).name}
    for version in ("old", "new"):
        found = runs(out, version, index)
        row[f"{version}_medians_ms"] = [round(r["median_s"] * 1e3, 3) for r in found]
        row[f"{version}_replayed"] = [r.get("replayed", r.get("graph")) for r in found]
        row[f"{version}_placed_outputs"] = [r.get("placed_outputs") for r in found]
    old, new = row["old_medians_ms"], row["new_medians_ms"]
    if old and new:
        row["old_ms"], row["new_ms"] = statistics.median(old), statistics.median(new)
        row["new_over_old"] = round(row["new_ms"] / row["old_ms"], 4)
    return row


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    rows = [cell_summary(out, i, cell) for i, cell in enumerate(argv[1:], start=1)]
    (out / "ab_summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    for r in rows:
        print(f"{r['model']:<12} old {r.get('old_ms', '-')} ms  new {r.get('new_ms', '-')} ms  "
              f"new/old {r.get('new_over_old', '-')}  ({r['plan']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
