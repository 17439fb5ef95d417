"""Whether two `autotm bench` documents hold the same rows, timings and dates aside: the same
keys, statuses and ILP sizes, predicted times within `--rtol`, and the solve times of each.

    python experiments/gpu/same_rows.py serial.json parallel.json [--rtol 1e-6] [--measured]

A time-limited solve may stop at another incumbent when it runs beside others; such rows are
listed (hit_time_limit) rather than counted as differences. `--measured` (runs with --execute)
also prints every measured time of b over a, and their geometric mean: two runs of the same
plans, on one GPU and on two, should differ by run-to-run noise only.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from autotm_py.bench import key_of

SAME = ("status", "variables", "constraints", "budget_bytes", "peak_fast_bytes",
        "bytes_to_fast", "bytes_to_slow", "all_fast_s", "lru_s", "first_touch_s", "offload_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--measured", action="store_true")
    args = ap.parse_args()
    a, b = ({key_of(r): r for r in json.loads(Path(p).read_text())["rows"]}
            for p in (args.a, args.b))
    diffs, limited = [], []
    for key in sorted(set(a) | set(b)):
        ra, rb = a.get(key), b.get(key)
        if ra is None or rb is None:
            diffs.append(f"{key}: only in {'b' if ra is None else 'a'}")
            continue
        if ra.get("hit_time_limit") or rb.get("hit_time_limit"):
            limited.append(key)
            continue
        for col in SAME:
            if ra.get(col) != rb.get(col):
                diffs.append(f"{key}: {col} {ra.get(col)} != {rb.get(col)}")
        pa, pb = ra.get("predicted_s"), rb.get("predicted_s")
        if (pa is None) != (pb is None) or (pa and not math.isclose(pa, pb, rel_tol=args.rtol)):
            diffs.append(f"{key}: predicted_s {pa} != {pb}")
    solve = [sum(r.get("solve_s") or 0 for r in rows.values()) for rows in (a, b)]
    print(f"{args.b}: {len(b)} rows against {len(a)}: {len(diffs)} differ, "
          f"{len(limited)} hit the time limit; solver seconds summed {solve[0]:.1f} vs "
          f"{solve[1]:.1f}")
    for line in diffs[:20]:
        print("  " + line)
    if args.measured:
        measured(a, b)


def measured(a: dict, b: dict) -> None:
    ratios = []
    for key in sorted(set(a) & set(b)):
        cols = sorted(k for k in a[key] if k.startswith("measured_") and k.endswith("_s")
                      and a[key].get(k) and b[key].get(k))
        parts = []
        for col in cols:
            ratios.append(b[key][col] / a[key][col])
            parts.append(f"{col[9:-2]} {ratios[-1]:.3f}")
        print(f"  {' '.join(key[i] for i in (0, 6, 7))}: " + ", ".join(parts))
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"measured b/a over {len(ratios)} times: geomean {geo:.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
