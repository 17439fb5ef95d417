"""Predict every measured row of a bench document again, with today's profiles and simulator.

A row's `predicted_s` is the simulator's time for its plan on the costs of the machine that ran
it, as they were then. After a profile or the simulator changes (e.g. device times, which give
the simulator a host clock and a GPU clock: docs/gpu.md), this recomputes each prediction from
the committed plan (experiments/plans/gpu, the row's headroom) and prints it beside the
measurement, after a line per model with its kernel time sums; `--write` stores the new
predictions (and slowdowns) in the document (CSV and JSON).

Runs on the CPU from committed files:
  python experiments/gpu/repredict.py experiments/results/gpu_h100.json [MODEL...] [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from autotm_py.bench import output_paths, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    doc = json.loads(Path(args.document).read_text())
    seen: set[tuple[str, int]] = set()
    for row in doc["rows"]:
        if row.get("measured_s") and (not args.models or row["model"] in args.models):
            if (row["model"], row["batch"]) not in seen:
                seen.add((row["model"], row["batch"]))
                print(kernel_sums(row), flush=True)
            predicted = predict(row)
            print(f"{row['model']:12s} {row['ratio']} {row['strategy']:5s} measured "
                  f"{row['measured_s'] * 1e3:6.1f} ms  predicted then "
                  f"{row['predicted_s'] * 1e3:6.1f} ({_error(row['predicted_s'], row)})  now "
                  f"{predicted * 1e3:6.1f} ({_error(predicted, row)})", flush=True)
            row["predicted_s"] = predicted
            if row.get("all_fast_s"):
                row["slowdown"] = predicted / row["all_fast_s"]
    if args.write:
        csv_path, json_path = output_paths(args.document)
        write_results(doc["rows"], csv_path, json_path)
        if doc.get("spec") is not None:  # keep the sweep's spec
            written = json.loads(json_path.read_text())
            written["spec"] = doc["spec"]
            json_path.write_text(json.dumps(written, indent=1, default=str) + "\n")


def predict(row: dict) -> float:
    from diagnose import load_plan, row_cell

    from autotm_py import api

    graph, plan = load_plan(*row_cell(row), row.get("headroom") or 0.0)
    costs = api.load_costs(graph, device="cuda")
    return api.simulate(graph, plan, costs=costs, strict=False).total_s


def kernel_sums(row: dict) -> str:
    """What the profiles say of one all-fast iteration: the in-context kernel times (launch
    gaps included) and, where measured, the device times (GPU work alone)."""
    from diagnose import load_plan, row_cell

    from autotm_py import api

    graph, _ = load_plan(*row_cell(row)[:3], row["ratio"], "all-fast")
    costs = api.load_costs(graph, device="cuda")
    device = f"{sum(costs.device_s) * 1e3:.1f} ms" if costs.device_s else "not measured"
    return (f"{row['model']} b{row['batch']}: in-context kernel times sum to "
            f"{costs.total_s * 1e3:.1f} ms, device times to {device}")


def _error(predicted: float, row: dict) -> str:
    return f"{(predicted - row['measured_s']) / row['measured_s'] * 100:+5.1f}%"


if __name__ == "__main__":
    main()
