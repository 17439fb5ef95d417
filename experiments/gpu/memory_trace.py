"""Does a plan's memory model match what torch allocates, kernel by kernel?

A plan that fits its budget on paper can still run out of memory under the cap for two reasons:
the model undercounts (a kernel allocates temporaries its profile did not see, or the executor
keeps a tensor longer than the plan says), or the caching allocator fragments. This separates
them: it runs a plan without a cap, records torch's allocated bytes before every kernel and the
peak while it runs, and compares both with the simulator's fast bytes at that record (workspace
included). Excess = measured peak - modelled bytes; a positive excess is the model's error, and
what is left between the budget and the cap's failures is fragmentation.

Usage (on the GPU machine):
  python3 experiments/gpu/memory_trace.py bert_base:16:1-3:async:seq=512 [--headroom 0.1]
Cells are MODEL:BATCH:RATIO:STRATEGY[:dim=value]; results go to $OUT/memory_trace.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--headroom", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    rows = [trace(cell, args.headroom, args.top) for cell in args.cells]
    out = Path(os.environ.get("OUT", "/tmp")) / "memory_trace.json"
    out.write_text(json.dumps(rows, indent=1))


def trace(cell: str, headroom: float, top: int) -> dict:
    import torch
    from diagnose import load_plan, parse_cell

    from autotm_py import api
    from autotm_py.pipeline import machine_for_plan
    from autotm_py.plan import Compute
    from autotm_py.runtime.execute import new_executor
    from autotm_py.runtime.executor import Executor

    class TracingExecutor(Executor):
        """Records (allocated before, peak during) every kernel, on the host: torch's
        allocator counts at enqueue time, which is the order the GPU reuses memory in."""

        samples: list[tuple[int, int, int]]

        def compute(self, record: Compute) -> None:
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            super().compute(record)
            self.samples.append((self.index, before,
                                 torch.cuda.max_memory_allocated(self.device)))

    graph, plan = load_plan(*parse_cell(cell), headroom)
    costs = api.load_costs(graph, device="cuda")
    sim = api.simulate(graph, plan, costs=costs, strict=False)
    workspace = machine_for_plan(graph, plan, costs).workspace
    modelled: dict[int, int] = {}  # the largest fast bytes at each record (its kernel's run)
    for index, fast in zip(sim.memory["record"], sim.memory["fast_bytes"], strict=True):
        modelled[index] = max(modelled.get(index, 0), int(fast))
    _, executor, _ = new_executor(graph, plan, "cuda", seed=0, deterministic=False)
    executor.__class__ = TracingExecutor
    for _ in range(2):  # the first iteration warms up (library handles, workspaces)
        executor.samples = []
        executor.prepare()
        torch.cuda.synchronize()
        idle = torch.cuda.memory_allocated()
        executor.run()
        torch.cuda.synchronize()
    rows = []
    for index, before, peak in executor.samples:
        kernel = graph.kernels[plan.records[index].kernel]
        rows.append({"record": index, "kernel": kernel.name, "op": kernel.op_type,
                     "before": before, "peak": peak, "modelled": int(modelled[index]),
                     "workspace": int(workspace[kernel.id])})
    return summarize(cell, plan, sim, idle, rows, top)


def summarize(cell: str, plan, sim, idle: int, rows: list[dict], top: int) -> dict:
    for row in rows:
        row["excess"] = row["peak"] - row["modelled"]
    worst = sorted(rows, key=lambda r: r["excess"], reverse=True)[:top]
    peak_row = max(rows, key=lambda r: r["peak"])
    result = {"cell": cell, "budget": plan.header.budget_bytes, "modelled_peak":
              sim.fast_peak_bytes, "measured_peak": peak_row["peak"], "idle_allocated": idle,
              "worst": worst, "kernels": rows}
    print(f"== {cell}: budget {plan.header.budget_bytes / MIB:.0f} MiB, modelled peak "
          f"{sim.fast_peak_bytes / MIB:.0f}, measured peak {peak_row['peak'] / MIB:.0f} at "
          f"{peak_row['kernel']} ({peak_row['op']}), allocated between iterations "
          f"{idle / MIB:.0f} MiB", flush=True)
    for r in worst:
        print(f"   excess {r['excess'] / MIB:7.0f} MiB at #{r['record']} {r['kernel']} "
              f"({r['op']}): before {r['before'] / MIB:.0f}, peak {r['peak'] / MIB:.0f}, "
              f"modelled {r['modelled'] / MIB:.0f} (workspace {r['workspace'] / MIB:.0f})",
              flush=True)
    return result


if __name__ == "__main__":
    main()
