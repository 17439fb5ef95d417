"""Outputs allocated at their planned slots (the placed allocator) against copied there, on the
same plans, each run in a process of its own (the allocator is chosen before CUDA is used).

For every plan file given: the model's all-fast iteration replayed with static inputs (our
reference, no slots), the all-fast iteration replayed in an arena, and the plan replayed at
planned addresses under its cap; the arena rows twice, with the placed allocator
(`runtime.placed`, `autotm run --placed`, the default) and with torch's caching allocator and
the copies into the slots (`--no-placed`), alternating, `--repeats` times. Per run: the median
iteration time, reserved peak (under the placed allocator: the extent of its region in use),
allocator retries (placed: requests its region could not serve), outputs copied into slots
and allocated at them, and the simulator's prediction now (replayed, shipped profiles; for the
all-fast iteration that is its device-time sum).

Usage (GPU machine, repository root; no PuLP needed):
  python3 experiments/gpu/placed_check.py OUT_DIR PLAN.json.gz... [--repeats 2]
      [--iterations 5] [--warmup 2] [--eager] [--deadline 500] [--only-placed]
      [--no-arena-all-fast] [--by-op]
Writes OUT_DIR/placed_check.json after every row.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gpu"))


def main() -> None:
    from prefetch_join_check import plans_parser

    parser = plans_parser(__doc__, 500.0, "runs of each allocator, alternating")
    parser.add_argument("--eager", action="store_true", help="eager arena runs too")
    parser.add_argument("--no-arena-all-fast", action="store_true",
                        help="of the all-fast iteration, only the static replay")
    parser.add_argument("--only-placed", action="store_true",
                        help="the plans with the placed allocator only (plans made for it)")
    parser.add_argument("--by-op", action="store_true",
                        help="only: one eager all-fast arena iteration per model, placed, "
                             "counting outputs copied into and allocated at their slots by op")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict] = []
    models: set[str] = set()

    def add(job: dict) -> None:
        if time.perf_counter() - started > args.deadline:
            row = {**job, "skipped": "deadline"}
        else:
            row = child(job, args)
        rows.append(row)
        print(line(row), flush=True)
        (args.out / "placed_check.json").write_text(json.dumps(rows, indent=1))

    for path in args.plans:
        model = json.loads(subprocess.run(
            [sys.executable, __file__, "--model-of", str(path)], capture_output=True, text=True,
            check=True).stdout)
        if args.by_op:
            add({"plan": str(path), "all_fast": True, "run": "arena eager", "placed": True,
                 "by_op": True})
            continue
        if model not in models:
            models.add(model)
            add({"plan": str(path), "all_fast": True, "run": "static replay"})
            for i in range(0 if args.no_arena_all_fast else args.repeats):
                for placed in (True, False):
                    add({"plan": str(path), "all_fast": True, "run": "arena replay",
                         "placed": placed, "repeat": i})
        for i in range(args.repeats):
            for placed in (True,) if args.only_placed else (True, False):
                add({"plan": str(path), "run": "arena replay", "placed": placed, "repeat": i})
                if args.eager:
                    add({"plan": str(path), "run": "arena eager", "placed": placed, "repeat": i})


def child(job: dict, args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job),
                           str(args.iterations), str(args.warmup)],
                          capture_output=True, text=True, timeout=600, check=False)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {**job, "error": f"exit {done.returncode}", "stderr": done.stderr[-3000:]}


def run_child(job: dict, iterations: int, warmup: int) -> dict:
    """One run in this (fresh) process."""
    from dataclasses import replace

    from prefetch_join_check import load

    from autotm_py import api
    from autotm_py.options import RunMode
    from autotm_py.pipeline import all_fast_plan

    arena = job["run"].startswith("arena")
    replay = job["run"].endswith("replay")
    if job.get("placed"):  # before CUDA is first used (the costs' lookup uses it)
        from autotm_py.plan import Plan

        plan = Plan.load(Path(job["plan"]))
        # the placed allocator only (an eager mode: no replay work queue set up here)
        api.prepare_cuda_process(plan, "cuda", RunMode(arena=arena),
                                 capped=not job.get("all_fast"))
    graph, plan = load(Path(job["plan"]))
    if job.get("all_fast"):
        plan = all_fast_plan(graph)
    capped = plan.header.budget_bytes is not None
    row = {**job, "model": graph.name, "predicted_at_solve_s": plan.header.predicted_time_s}
    if job.get("by_op"):
        row["by_op"] = count_by_op(graph, plan)
    try:
        costs = api.load_costs(graph, device="cuda")
        priced = plan if not arena or plan.arena else api.with_arena(graph, plan, costs)
        priced = priced.with_header(run=replace(priced.header.run, replay=replay))
        row["predicted_now_s"] = api.simulate(graph, priced, costs=costs,
                                              strict=False).total_s
        result = api.execute(graph, plan, device="cuda", iterations=iterations, warmup=warmup,
                             mode=RunMode(arena=arena, placed=bool(job.get("placed")),
                                          replay=replay),
                             capped=capped, costs=costs)
    except Exception as exc:
        return {**row, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6)}
    times = list(result.iteration_times_s)
    return {**row, "median_s": result.median_s, "times_s": times,
            "spread": (max(times) - min(times)) / statistics.median(times),
            "reserved_peak_bytes": result.reserved_peak_bytes, "cap_bytes": result.cap_bytes,
            "budget_bytes": result.budget_bytes, "alloc_retries": result.alloc_retries,
            "copied_outputs": result.copied_outputs, "placed_outputs": result.placed_outputs,
            "replayed": result.replayed, "notes": list(result.notes),
            "device_name": result.device_name}


def count_by_op(graph, plan) -> dict:
    """Patch the executor so that every output put into its slot is counted by its kernel's op
    and by what happened (copied, or allocated there); the counts fill in as the run goes."""
    from autotm_py.runtime import executor as ex

    counts: dict = {}
    original = ex.Executor._in_slot

    def counted(self, value, slot):
        before = (self.state.copied, self.state.placed)
        out = original(self, value, slot)
        record = self.plan.records[self.index] if 0 <= self.index < len(self.plan.records) \
            else None
        op = self.graph.kernels[record.kernel].op_type if hasattr(record, "kernel") else "end"
        how = "copied" if self.state.copied > before[0] else \
            "placed" if self.state.placed > before[1] else "in place"
        key = f"{op} {how}"
        counts[key] = counts.get(key, 0) + 1
        return out

    ex.Executor._in_slot = counted
    return counts


def line(row: dict) -> str:
    if "by_op" in row:
        return f"{row.get('model')} by op: " + json.dumps(
            dict(sorted(row["by_op"].items(), key=lambda kv: -kv[1])))
    what = "all-fast" if row.get("all_fast") else Path(row["plan"]).name
    name = f"{row.get('model', '')} {what} {row['run']} placed={row.get('placed')}"
    if "median_s" not in row:
        return f"{name}: {row.get('error') or row.get('skipped')} {row.get('stderr', '')[-800:]}"
    pred = row.get("predicted_now_s") or float("nan")
    return (f"{name}: {row['median_s'] * 1e3:.1f} ms (predicted {pred * 1e3:.1f}), reserved "
            f"{(row['reserved_peak_bytes'] or 0) >> 20} MiB of cap "
            f"{(row['cap_bytes'] or 0) >> 20}, retries {row['alloc_retries']}, copied "
            f"{row['copied_outputs']}, placed {row['placed_outputs']}, replayed {row['replayed']}"
            + "".join(f"; {n}" for n in row["notes"] if not n.startswith("cap =")))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(run_child(json.loads(sys.argv[2]), int(sys.argv[3]),
                                   int(sys.argv[4]))))
    elif sys.argv[1:2] == ["--model-of"]:
        from prefetch_join_check import load
        print(json.dumps(load(Path(sys.argv[2]))[0].name))
    else:
        main()
