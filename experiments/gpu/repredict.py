"""Predict every measured row of a bench document again, with today's profiles and simulator.

A row's `predicted_s` is the simulator's time for its plan on the costs of the machine that ran
it, as they were then. After a profile or the simulator changes (e.g. device times, which give
the simulator a host clock and a GPU clock: docs/gpu.md), this recomputes each prediction from
the committed plan (experiments/plans/gpu, the row's headroom: those plans were removed on
2026-11-28, solved for graphs the importer no longer makes; `git show
9924961:experiments/plans/gpu/NAME` recovers one, or use `--plans`) and prints it beside the
measurement, after a line per model with its kernel time sums; `--write` stores the new
predictions (and slowdowns) in the document (CSV and JSON).

Runs on the CPU from committed files:
  python experiments/gpu/repredict.py experiments/results/gpu_h100.json [MODEL...] [--write]
  python experiments/gpu/repredict.py experiments/results/bench_arena/bench_arena_h100.json \
      --plans experiments/plans/bench_arena
`--plans DIR`: rows of `autotm bench --plans DIR` (e.g. `--arena --replay`, today's fused
graphs), each plan read from that folder under the name the sweep gave it (rows and plans of
sweeps before 2026-12-01 name replay `graph`: `arena+graph+...`).
"""

from __future__ import annotations

import argparse
import functools
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
    parser.add_argument("--plans", help="the sweep's --plans folder (its rows' plans)")
    args = parser.parse_args()
    doc = json.loads(Path(args.document).read_text())
    seen: set[tuple[str, int]] = set()
    for row in doc["rows"]:
        if row.get("measured_s") and (not args.models or row["model"] in args.models):
            if (row["model"], row["batch"]) not in seen:
                seen.add((row["model"], row["batch"]))
                print(kernel_sums(row, fused=args.plans is not None), flush=True)
            predicted = predict(row, args.plans)
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


def predict(row: dict, plans_dir: str | None = None) -> float:
    from diagnose import load_plan, row_cell

    from autotm_py import api

    if plans_dir is not None:
        graph, plan = bench_plan(row, plans_dir)
    else:
        graph, plan = load_plan(*row_cell(row), row.get("headroom") or 0.0)
    costs = api.load_costs(graph, device="cuda")
    return api.simulate(graph, plan, costs=costs, strict=False).total_s


def bench_plan(row: dict, plans_dir: str):
    """The fused training graph of a row and the plan its sweep kept in `plans_dir`."""
    from diagnose import row_cell

    from autotm_py.bench import BenchSpec
    from autotm_py.options import ModelOptions, RunMode
    from autotm_py.plan import Plan

    model, batch, dims, ratio, strategy = row_cell(row)
    options = (row.get("options") or "").split("+")
    replay = "replay" in options or "graph" in options  # "graph": rows before 2026-12-01
    spec = BenchSpec(models=(model,), ratios=(ratio,), strategies=(strategy,),
                     solvers=(row["solver"],), device=row["device"],
                     model=ModelOptions(batch=batch, dims=dims, training=True),
                     headroom=row.get("headroom") or 0.0, plans_dir=plans_dir,
                     run=RunMode(arena="arena" in options, placed="placed" in options,
                                 replay=replay,
                                 # as the row says (rows before windows were the default
                                 # have none: their plans have the scratch region)
                                 scratch="windows" if "windows" in options else "region"),
                     read_pricing="spread" if "spread" in options else "step")
    path = spec.plan_path(model, ratio, strategy, row["solver"])
    if not path.exists() and "graph" in options:
        # a sweep before 2026-12-01 saved the plan under its options of then (`graph`)
        then = "+".join("graph" if part == "replay" else part
                        for part in spec.options.split("+"))
        path = path.with_name(path.name.replace(f"_{spec.options}.json", f"_{then}.json"))
    return fused_graph(model, batch, tuple(sorted(dims.items()))), Plan.load(path)


@functools.cache
def fused_graph(model: str, batch: int, dims: tuple[tuple[str, int], ...]):
    """Today's training graph of a model, loaded once for all its rows."""
    from autotm_py import api

    return api.load_model(model, batch=batch, dims=dict(dims) or None, training=True)


def kernel_sums(row: dict, fused: bool = False) -> str:
    """What the profiles say of one all-fast iteration: the in-context kernel times (launch
    gaps included) and, where measured, the device times (GPU work alone)."""
    from diagnose import load_plan, row_cell

    from autotm_py import api

    if fused:
        model, batch, dims, _, _ = row_cell(row)
        graph = fused_graph(model, batch, tuple(sorted(dims.items())))
    else:
        graph, _ = load_plan(*row_cell(row)[:3], row["ratio"], "all-fast")
    costs = api.load_costs(graph, device="cuda")
    device = f"{sum(costs.device_s) * 1e3:.1f} ms" if costs.device_s else "not measured"
    return (f"{row['model']} b{row['batch']}: in-context kernel times sum to "
            f"{costs.total_s * 1e3:.1f} ms, device times to {device}")


def _error(predicted: float, row: dict) -> str:
    return f"{(predicted - row['measured_s']) / row['measured_s'] * 100:+5.1f}%"


if __name__ == "__main__":
    main()
