"""Arena runs and CUDA-graph replay on the GPU, beside all-fast (issue 14 item 3).

For each cell (a model and a ratio), in one process on the GPU machine:

- all-fast, eager, uncapped (the reference), and all-fast replayed as a CUDA graph (its buffers
  packed into an arena; no cap): the device-time sum of the profile is the target of the graph;
- the cell's arena plan (`autotm optimize --arena`, solved on the CPU machine with
  experiments/gpu/plan_arena.sh: PuLP is not on the GPU machine) run at its planned addresses
  under the cap, and the same plan on torch's caching allocator under the cap;
- the cell's graph-priced arena plan (`--arena --graph`) replayed as a CUDA graph under the cap.

Each row: measured median time, the plan's prediction (the simulator on this checkout's
profiles) and the error, allocated and reserved peaks against the budget, allocator retries,
the host's enqueue time, outputs copied into slots, and notes (a failed capture names its
kernel). Rows go to $OUT/arena_check.json (or -o), a table to stdout.

Usage (GPU machine, from the repository root, `.whl` carried as for the other scripts):
  . experiments/gpu/setup.sh
  python3 experiments/gpu/arena_check.py [-o $OUT/arena_check.json] [CELL...]
CELL is MODEL:RATIO (ratio as in the plan file names, e.g. resnet200:1-1); default: the plans
of experiments/plans/arena.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "experiments" / "plans" / "arena"
NAME = re.compile(r"^(?P<model>.+)_(?P<ratio>\d+-\d+)_arena(?P<graph>_graph)?\.json\.gz$")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help="MODEL:RATIO, e.g. resnet200:1-1")
    parser.add_argument("--plans", default=str(PLANS))
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    parser.add_argument("-o", "--output", default=None)
    args = parser.parse_args()
    plans = Path(args.plans)
    cells = args.cells or sorted({f"{m['model']}:{m['ratio']}" for p in plans.iterdir()
                                  if (m := NAME.match(p.name))})
    output = Path(args.output or Path(os.environ.get("OUT", "/tmp")) / "arena_check.json")
    rows: list[dict] = []
    done_all_fast: set[str] = set()
    for cell in cells:
        model, ratio = cell.split(":")
        rows += check_cell(model, ratio, plans, args.iterations, args.warmup,
                           all_fast=model not in done_all_fast, device=args.device)
        done_all_fast.add(model)
        output.write_text(json.dumps(rows, indent=1))  # after every cell: partial results
    print(f"wrote {output}")


def check_cell(model: str, ratio: str, plans: Path, iterations: int, warmup: int,
               all_fast: bool, device: str = "cuda") -> list[dict]:
    from autotm_py import api
    from autotm_py.pipeline import all_fast_plan
    from autotm_py.plan import Plan

    eager_plan = Plan.load(plans / f"{model}_{ratio}_arena.json.gz")
    graph_plan = Plan.load(plans / f"{model}_{ratio}_arena_graph.json.gz")
    options = eager_plan.header.model
    assert options is not None, "arena plans record how their graph was loaded"
    graph = api.load_model(model, batch=options.batch, dims=dict(options.dims) or None,
                           training=options.training, optimizer=options.optimizer or "sgd",
                           fuse=options.fuse, loss=options.loss or "auto")
    costs = api.load_costs(graph, device="cuda")
    device_sum = sum(costs.device_s) if costs.device_s and all(costs.device_s) else None
    runs = []
    if all_fast:
        reference = all_fast_plan(graph)
        runs += [("all-fast", reference, {"enforce_budget": False}),
                 ("all-fast graph", reference.with_header(graph=True),
                  {"enforce_budget": False, "graph_replay": True})]
    runs += [("arena", eager_plan, {"arena": True}),
             ("caching allocator", eager_plan, {}),
             ("arena graph", graph_plan, {"graph_replay": True})]
    rows = []
    for label, plan, options_ in runs:
        row = measure(graph, costs, plan, label, iterations, warmup, device=device, **options_)
        row.update(model=model, ratio=ratio, device_time_sum_s=device_sum)
        print(line(row), flush=True)
        rows.append(row)
    return rows


def measure(graph, costs, plan, label: str, iterations: int, warmup: int, device: str = "cuda",
            **options) -> dict:
    import gc

    import torch

    from autotm_py import api
    from autotm_py.errors import AutoTMError

    if options.get("graph_replay") or options.get("arena"):
        plan = api.with_arena(graph, plan, costs)
    predicted = api.simulate(graph, plan, costs=costs, strict=False)
    row = {"run": label, "strategy": plan.header.strategy, "graph_priced": plan.header.graph,
           "predicted_s": predicted.total_s, "predicted_at_solve_s": plan.header.predicted_time_s,
           "budget_bytes": plan.header.budget_bytes,
           "arena_bytes": plan.arena.nbytes if plan.arena else None,
           "verifier": list(predicted.violations[:1])}
    gc.collect()  # the previous run's arena and graph pool
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        run = api.execute(graph, plan, device=device, iterations=iterations, warmup=warmup,
                          costs=costs, **options)
    except AutoTMError as exc:
        row["error"] = str(exc)
        return row
    except Exception as exc:  # keep the other rows: report and go on
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=6)
        return row
    row.update(median_s=run.median_s, times_s=list(run.iteration_times_s),
               spread=(max(run.iteration_times_s) - min(run.iteration_times_s))
               / statistics.median(run.iteration_times_s),
               error_pct=100 * (predicted.total_s / run.median_s - 1),
               host_median_s=run.host_median_s, peak_bytes=run.peak_fast_bytes,
               reserved_peak_bytes=run.reserved_peak_bytes, cap_bytes=run.cap_bytes,
               alloc_retries=run.alloc_retries, copied_outputs=run.copied_outputs,
               replayed=run.graph, notes=list(run.notes), device_name=run.device_name)
    return row


def line(row: dict) -> str:
    def mib(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value / 2**20:7.0f}"

    head = f"{row['model']:12s} {row['ratio']:4s} {row['run']:18s}"
    if "error" in row:
        return f"{head} failed: {row['error'][:300]}"
    notes = [n for n in row["notes"] if n.startswith("no CUDA graph")]
    return (f"{head} {row['median_s'] * 1e3:8.1f} ms (predicted {row['predicted_s'] * 1e3:8.1f}, "
            f"{row['error_pct']:+5.1f}%)  host {row['host_median_s'] * 1e3:7.1f} ms  "
            f"peak {mib('peak_bytes')} reserved {mib('reserved_peak_bytes')} budget "
            f"{mib('budget_bytes')} MiB  retries {row['alloc_retries']}  copied "
            f"{row['copied_outputs']}  graph {row['replayed']}"
            + (f"  device sum {row['device_time_sum_s'] * 1e3:.1f} ms"
               if row.get("device_time_sum_s") else "")
            + (f"  NOTE {notes[0]}" if notes else ""))


if __name__ == "__main__":
    main()
