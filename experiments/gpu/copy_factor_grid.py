"""What-if: the benchmark's measured rows predicted again under other replay copy factors.

Each pair TO_FAST,TO_SLOW replaces `costs.REPLAY_TO_FAST_SLOWDOWN` / `REPLAY_TO_SLOW_SLOWDOWN`
for one pass over every measured row of the given bench documents (plans read from `--plans`,
as `repredict.py` does) and prints the median and largest |predicted - measured| / measured,
for all rows, per model given with `--apart` and for the move-only rows. Runs on the CPU from
committed files (about 30 s per pair for 33 rows):

    python experiments/gpu/copy_factor_grid.py 1.04,1.13 1.11,1.11 --apart resnet50 \\
        --docs experiments/results/bench_arena/bench_arena_h100.json \\
        experiments/results/bench_arena/2026-11-28/call7_resnet50_device_times_h100.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import repredict

from autotm_py import machine


def errors(rows: list[dict], plans: str) -> list[tuple[float, dict]]:
    out = []
    for row in rows:
        predicted = repredict.predict(row, plans)
        out.append((abs(predicted - row["measured_s"]) / row["measured_s"], row))
    return out


def line(name: str, errs: list[float]) -> str:
    if not errs:
        return f"{name}: no rows"
    return f"{name} {statistics.median(errs):.2%} (max {max(errs):.1%}, {len(errs)} rows)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="TO_FAST,TO_SLOW factor pairs")
    parser.add_argument("--docs", nargs="+", required=True)
    parser.add_argument("--plans", default="experiments/plans/bench_arena")
    parser.add_argument("--apart", nargs="*", default=[], help="models reported on their own")
    args = parser.parse_args()
    rows = [r for d in args.docs for r in json.loads(Path(d).read_text())["rows"]
            if r.get("measured_s")]
    for pair in args.pairs:
        to_fast, to_slow = (float(x) for x in pair.split(","))
        machine.REPLAY_TO_FAST_SLOWDOWN, machine.REPLAY_TO_SLOW_SLOWDOWN = to_fast, to_slow
        errs = errors(rows, args.plans)
        parts = [line("all", [e for e, _ in errs])]
        rest = [e for e, r in errs if r["model"] not in args.apart]
        parts.append(line("others", rest))
        parts += [line(m, [e for e, r in errs if r["model"] == m]) for m in args.apart]
        parts.append(line("move-only", [e for e, r in errs if r["strategy"] == "async"]))
        print(f"to device x{to_fast}, to host x{to_slow}: " + "  ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
