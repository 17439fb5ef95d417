"""Predicted against measured for every run under the given folders or files.

Runs are the files of `autotm run -o` (`replay_plans.sh`) and the rows of `autotm bench
--execute` documents (`bench_arena.json`, `fit.json`, or a sweep's CSV named as a file where
its JSON did not come back; rows with a measured plan). Prints each
run, the median error, allocator retries and how many runs reserved more than their budget.

Runs on the CPU from committed files:
  python experiments/gpu/prediction_errors.py experiments/results/bench_arena/2026-11-28g
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from autotm_py.bench import read_result


def runs_under(folder: Path, *, bench_rows: bool) -> list[tuple[str, float, float, int, bool]]:
    """(name, predicted s, measured s, retries, reserved above budget) of every run there (or
    of the one file `folder`)."""
    out = []
    for path in [folder] if folder.is_file() else _result_files(folder):
        doc = ({"rows": read_result(path)} if path.suffix == ".csv"
               else json.loads(path.read_text()))
        if isinstance(doc, dict) and "median_s" in doc:  # `autotm run -o`
            out.append((path.stem, doc["predicted_time_s"], doc["median_s"],
                        doc.get("alloc_retries") or 0,
                        doc["reserved_peak_bytes"] > doc["budget_bytes"]))
        elif bench_rows and isinstance(doc, dict) and "rows" in doc:  # `autotm bench`
            for r in doc["rows"]:
                if r.get("measured_s") and r.get("predicted_s"):
                    name = (f"{r['model']} {r['ratio']} {r['strategy']} [{r['options'] or ''}]"
                            f" headroom {r.get('headroom') or 0:g} ({path.parent.name} bench row)")
                    out.append((name, r["predicted_s"], r["measured_s"],
                                int(r.get("measured_alloc_retries") or 0),
                                (r.get("measured_reserved_peak_bytes") or 0) > r["budget_bytes"]))
    return out


def _result_files(folder: Path) -> list[Path]:
    """The JSON files under `folder`, and the sweeps' CSVs whose JSON is not beside them."""
    return sorted([*folder.rglob("*.json"),
                   *(p for p in folder.rglob("*.csv") if not p.with_suffix(".json").exists())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, metavar="FOLDER|FILE")
    parser.add_argument("--no-bench-rows", action="store_true",
                        help="Only `autotm run` files (e.g. leave out `--fit` rows).")
    args = parser.parse_args()
    runs = [r for f in args.folders for r in runs_under(f, bench_rows=not args.no_bench_rows)]
    if not runs:
        raise SystemExit("error: no run files or bench rows under " +
                         ", ".join(map(str, args.folders)))
    print(f"{'run':<110} {'predicted':>10} {'measured':>9} {'error':>7} retries")
    errors = []
    for name, predicted, measured, retries, _ in runs:
        error = (predicted - measured) / measured
        errors.append(abs(error))
        print(f"{name[:110]:<110} {predicted * 1e3:8.1f}ms {measured * 1e3:7.1f}ms "
              f"{error:+7.1%} {retries}")
    print(f"median |predicted - measured| / measured: {statistics.median(errors):.1%} over "
          f"{len(runs)} runs (largest {max(errors):.1%}); allocator retries: "
          f"{sum(r[3] for r in runs)}; reserved peak above the budget: "
          f"{sum(r[4] for r in runs)} of {len(runs)}")


if __name__ == "__main__":
    main()
