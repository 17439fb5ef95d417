"""Why is a measured plan slower than predicted? Run solved plans on the GPU three ways and
print what each run reveals.

For every cell (model, ratio, strategy) the plan from ``experiments/plans/gpu`` (re-plan there
first with ``plan_all.sh``: the plans once kept there were removed on 2026-11-28) runs
  * under its cap (as `autotm bench` runs it),
  * without a cap (if much faster, the caching allocator hit the cap: retries synchronize),
and every run reports the host's enqueue time (near the iteration time: Python dispatch bounds
the iteration, not the GPU) and the allocator's retries. ``--trace`` also writes a torch
profiler Chrome trace of one capped iteration per cell to $OUT (copy-engine idle time and
stream waits are visible there).

Usage (on the GPU machine):
  python3 experiments/gpu/diagnose.py densenet264:32:1-1:async resnet200:32:1-3:sync [--trace]
Cells are MODEL:BATCH:RATIO:STRATEGY (STRATEGY all-fast: every tensor on the GPU), with
extra dims as MODEL:BATCH:RATIO:STRATEGY:seq=512.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

PLANS = Path(__file__).resolve().parent.parent / "plans" / "gpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "/tmp"))
    rows = [diagnose(cell, args.iterations, out if args.trace else None) for cell in args.cells]
    (out / "diagnose.json").write_text(json.dumps(rows, indent=1))


def diagnose(cell: str, iterations: int, trace_dir: Path | None) -> dict:
    import torch

    from autotm_py import api
    from autotm_py.errors import AutoTMError

    graph, plan = load_plan(*parse_cell(cell))
    row = {"cell": cell, "predicted_at_solve_s": plan.header.predicted_time_s}
    for label, cap in (("capped", True), ("uncapped", False)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            run = api.execute(graph, plan, device="cuda", iterations=iterations, warmup=2,
                              capped=cap)
        except AutoTMError as exc:
            row[label] = {"error": str(exc)}
            print(f"{cell:32s} {label:8s} failed: {str(exc)[:300]}", flush=True)
            continue
        reserved = torch.cuda.max_memory_reserved()
        row[label] = {"median_s": run.median_s, "host_s": run.host_median_s,
                      "alloc_retries": run.alloc_retries, "peak": run.peak_fast_bytes,
                      "reserved_peak": reserved, "budget": plan.header.budget_bytes}
        print(f"{cell:32s} {label:8s} median {run.median_s * 1e3:8.1f} ms  host "
              f"{run.host_median_s * 1e3:8.1f} ms  retries {run.alloc_retries}  peak "
              f"{run.peak_fast_bytes / 2**20:6.0f} MiB  reserved {reserved / 2**20:6.0f} MiB  "
              f"budget {(plan.header.budget_bytes or 0) / 2**20:6.0f} MiB", flush=True)
    if trace_dir is not None:
        _trace(graph, plan, trace_dir / f"trace_{cell.replace(':', '_')}.json")
    return row


def parse_cell(cell: str) -> tuple[str, int, dict[str, int], str, str]:
    """MODEL:BATCH:RATIO:STRATEGY[:dim=value...] -> (model, batch, dims, ratio, strategy)."""
    model, batch, ratio, strategy, *dims = cell.split(":")
    return model, int(batch), parse_dims(dims), ratio.replace("-", ":"), strategy


def row_cell(row: dict) -> tuple[str, int, dict[str, int], str, str]:
    """The same of a bench row (its dims column reads "seq=512,...")."""
    return (row["model"], row["batch"], parse_dims((row.get("dims") or "").split(",")),
            row["ratio"], row["strategy"])


def parse_dims(items) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in items if item)}


def load_plan(model: str, batch: int, dims: dict[str, int], ratio: str, strategy: str,
              headroom: float = 0.0):
    """The training graph and the plan `plan_all.sh` kept for the cell at `headroom`
    (strategy all-fast: every tensor on the GPU)."""
    from autotm_py import api
    from autotm_py.pipeline import all_fast_plan

    # fuse=False: the kept plans and the committed measurements are of the unfused graphs
    # (before the fusion pass of issue 15); they are re-planned with fused graphs later
    graph = api.load_model(model, batch=batch, dims=dims or None, training=True, fuse=False)
    if strategy == "all-fast":
        return graph, all_fast_plan(graph)
    return graph, kept_plan(model, batch, dims, ratio, strategy, headroom)


def kept_plan(model: str, batch: int, dims: dict[str, int], ratio: str, strategy: str,
              headroom: float = 0.0):
    from autotm_py.plan import Plan

    return Plan.load(_plan_path(model, batch, dims, ratio, strategy, headroom))


def _plan_path(model: str, batch: int, dims: dict[str, int], ratio: str, strategy: str,
               headroom: float = 0.0) -> Path:
    """Where `plan_all.sh` (`autotm bench --plans`) kept the cell's plan."""
    from autotm_py.bench import BenchSpec
    from autotm_py.options import ModelOptions

    spec = BenchSpec(models=(model,), ratios=(ratio,), strategies=(strategy,),
                     solvers=("highs",), device="cuda",
                     model=ModelOptions(batch=batch, dims=dims, training=True),
                     plans_dir=str(PLANS))
    path = spec.plan_path(model, ratio, strategy, "highs", headroom)
    assert path is not None
    return path


def _trace(graph, plan, path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autotm_py import api

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        api.execute(graph, plan, device="cuda", iterations=1, warmup=1)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    import gzip
    import shutil

    with path.open("rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


if __name__ == "__main__":
    main()
