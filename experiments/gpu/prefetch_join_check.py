"""Async copies joined at their use against AutoTM's step join, on the same plans, in one process.

The executor now lets an async copy run on beside the kernels after the one it overlaps and
waits for it only where its tensor is next used (docs/planning.md, "Copies join at their use");
`executor.JOIN_COPIES_AT_USE = False` restores the join at the end of that kernel. For every
plan file given, this replays it as a CUDA graph both ways, alternating (at planned addresses
where the plan has an arena, else with static inputs), beside our all-fast
iteration replayed with static inputs (uncapped), and writes per run: the median iteration
time, the reserved peak, allocator retries, and the predictions: the one recorded when the plan
was solved (the step join) and the simulator's now (the join at use), on the shipped profiles.

Usage (GPU machine, repository root; no PuLP needed):
  python3 experiments/gpu/prefetch_join_check.py OUT_DIR PLAN.json.gz... [--iterations 5]
      [--repeats 2] [--deadline 400]
Writes OUT_DIR/prefetch_join_check.json after every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))


def plans_parser(doc: str, deadline: float, repeats: str) -> argparse.ArgumentParser:
    """The options of a side-by-side check of plan files (this script's)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help=repeats)
    parser.add_argument("--deadline", type=float, default=deadline)
    return parser


def main() -> None:
    args = plans_parser(__doc__, 400.0, "runs of each join, alternating").parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict] = []
    references: set[str] = set()

    def add(row: dict) -> None:
        rows.append(row)
        print(line(row), flush=True)
        (args.out / "prefetch_join_check.json").write_text(json.dumps(rows, indent=1))

    for path in args.plans:
        graph, plan = load(path)
        if graph.name not in references:  # our all-fast replay, the reference of the ratios
            references.add(graph.name)
            from autotm_py.pipeline import all_fast_plan
            add(run(graph, all_fast_plan(graph), {"plan": "all-fast", "join": "-"}, args,
                    graph_priced=True))
        for i in range(args.repeats):
            for join in ("use", "step"):
                if time.perf_counter() - started > args.deadline:
                    add({"plan": path.name, "join": join, "skipped": "deadline"})
                    continue
                add(run(graph, plan, {"plan": path.name, "join": join, "repeat": i}, args))


def load(path: Path):
    """The plan and the graph it was made for (`recompute_check.graph_of`)."""
    from recompute_check import graph_of

    from autotm_py.plan import Plan

    plan = Plan.load(path)
    return graph_of(plan), plan


def run(graph, plan, row: dict, args, graph_priced: bool = False) -> dict:
    """One replayed run of `plan` with the row's join; errors are rows."""
    import gc
    from dataclasses import replace

    import torch

    from autotm_py import api
    from autotm_py.options import RunMode
    from autotm_py.runtime import executor

    row = {**row, "model": graph.name, "predicted_at_solve_s": plan.header.predicted_time_s}
    try:
        costs = api.load_costs(graph, device="cuda")
        replayed = plan.with_header(run=replace(plan.header.run, replay=True))
        sim = api.simulate(graph, replayed, costs=costs, strict=False)
        row["predicted_now_s"] = sim.total_s
    except Exception as exc:
        row["predicted_now_error"] = f"{type(exc).__name__}: {exc}"
    executor.JOIN_COPIES_AT_USE = row["join"] != "step"
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    started = time.perf_counter()
    try:
        # placed=False: no placed allocator installed by the run (as before)
        mode = RunMode(arena=plan.arena is not None and not graph_priced, placed=False,
                       replay=True)
        result = api.execute(graph, plan, device="cuda", iterations=args.iterations,
                             warmup=args.warmup, mode=mode,
                             capped=plan.header.budget_bytes is not None)
    except Exception as exc:  # keep the other rows
        return {**row, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6)}
    finally:
        executor.JOIN_COPIES_AT_USE = True
    times = list(result.iteration_times_s)
    return {**row, "median_s": result.median_s, "times_s": times,
            "spread": (max(times) - min(times)) / statistics.median(times),
            "reserved_peak_bytes": result.reserved_peak_bytes, "cap_bytes": result.cap_bytes,
            "alloc_retries": result.alloc_retries, "replayed": result.replayed,
            "notes": list(result.notes), "device_name": result.device_name,
            "wall_s": time.perf_counter() - started}


def line(row: dict) -> str:
    if "median_s" not in row:
        return f"{row.get('model', '')} {row['plan']} join {row['join']}: " \
               f"{row.get('error') or row.get('skipped')}"
    pred = row.get("predicted_now_s")
    return (f"{row['model']} {row['plan']} join {row['join']}: {row['median_s'] * 1e3:.1f} ms"
            f" (predicted now {pred * 1e3 if pred else float('nan'):.1f}, at solve "
            f"{(row['predicted_at_solve_s'] or float('nan')) * 1e3:.1f}), reserved "
            f"{(row['reserved_peak_bytes'] or 0) >> 20} MiB, retries {row['alloc_retries']}, "
            f"replayed {row['replayed']}")


if __name__ == "__main__":
    main()
