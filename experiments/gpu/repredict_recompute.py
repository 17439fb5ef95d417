"""Predict the measured rows of a recompute_check or arena_check document again, on today's
profiles and pricing, and print each beside its measurement with the median |predicted -
measured| / measured. Runs on the CPU from committed files (plans in experiments/plans/recompute,
or experiments/plans/arena for an arena_check document; a replayed run is predicted replayed):

    python experiments/gpu/repredict_recompute.py \
        experiments/results/recompute/recompute_check_h100_2026-11-26_arena_graph.json
    python experiments/gpu/repredict_recompute.py \
        experiments/results/arena/arena_check_h100_2026-11-27_resnet_gpt2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py import api  # noqa: E402
from autotm_py.plan import Plan  # noqa: E402

PLANS = ROOT / "experiments" / "plans" / "recompute"
ARENA_PLANS = ROOT / "experiments" / "plans" / "arena"


def measured_runs(doc: dict):
    """(model row, budget share, strategy, result) of every run that has a measured median."""
    for row in doc["rows"]:
        for share, cell in row["budgets"].items():
            for strategy, entry in cell.items():
                result = entry.get("result") if isinstance(entry, dict) else None
                if result and result.get("median_s") and result.get("file"):
                    yield row, share, strategy, result


def arena_runs(doc: dict, plans: Path):
    """(label, plan, replayed, measured seconds, predicted then) of every measured run of a
    committed plan in an arena_check document."""
    for row in doc["rows"]:
        path = plans / str(row.get("plan"))
        if row.get("median_s") and path.is_file():
            label = f"{row['model']} {row['ratio']} {row['priced']}-priced, {row['run']}"
            yield label, Plan.load(path), bool(row.get("replayed")), row["median_s"], \
                row.get("predicted_shipped_s")


def repredict_arena(doc: dict, plans: Path) -> None:
    graphs: dict[str, tuple] = {}
    errors: dict[bool, list[float]] = {False: [], True: []}
    print(f"{'run':<52}{'measured':>9}{'then':>9}{'now':>9}{'now/meas':>9}")
    from recompute_check import graph_of  # the plan's graph, from its header

    for label, plan, replayed, measured, then in arena_runs(doc, plans):
        if plan.header.model_name not in graphs:
            graph = graph_of(plan)
            graphs[plan.header.model_name] = graph, api.load_costs(graph, device="cuda")
        graph, costs = graphs[plan.header.model_name]
        priced = plan.with_header(run=replace(plan.header.run, replay=replayed))
        now = api.simulate(graph, priced, costs=costs, strict=False).total_s
        errors[replayed].append(abs(now - measured) / measured)
        print(f"{label:<52}{1e3 * measured:9.1f}{1e3 * (then or 0):9.1f}{1e3 * now:9.1f}"
              f"{now / measured:9.3f}")
    for replayed, errs in errors.items():
        if errs:
            print(f"{'replayed' if replayed else 'eager'}: median |now - measured| / measured "
                  f"over {len(errs)} runs: {100 * statistics.median(errs):.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("--plans", type=Path, default=None)
    args = parser.parse_args()
    doc = json.loads(args.document.read_text())
    if doc.get("rows") and "run" in doc["rows"][0]:  # an arena_check document
        repredict_arena(doc, args.plans or ARENA_PLANS)
        return
    args.plans = args.plans or PLANS
    graphs: dict[str, tuple] = {}
    errors = []
    print(f"{'model':<14}{'share':>6} {'strategy':<18}{'measured':>9}{'at solve':>9}{'now':>9}"
          f"{'now/meas':>9}")
    for row, share, strategy, result in measured_runs(doc):
        name, options = row["model"], row["options"]
        if name not in graphs:
            dims = {k: v for k, v in options["dims"].items() if k != "batch"}
            graph = api.load_model(name, batch=options["batch"], dims=dims or None,
                                   training=True, fuse=options.get("fuse", True))
            graphs[name] = graph, api.load_costs(graph, device="cuda")
        graph, costs = graphs[name]
        plan = Plan.load(args.plans / result["file"])
        now = api.simulate(graph, plan, costs=costs, strict=False).total_s
        measured = result["median_s"]
        errors.append(abs(now - measured) / measured)
        print(f"{name:<14}{share:>6} {strategy:<18}{1e3 * measured:9.1f}"
              f"{1e3 * result['predicted_s']:9.1f}{1e3 * now:9.1f}{now / measured:9.3f}")
    print(f"median |now - measured| / measured over {len(errors)} runs: "
          f"{100 * statistics.median(errors):.1f}%")


if __name__ == "__main__":
    main()
